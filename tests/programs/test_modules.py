"""``minicompile.compile(module)``: the wrapper is a module sharing parameters and buffers;
in-place parameter updates need no recompile; ``training`` and hooks are guarded.

All calls run under ``torch.no_grad()`` (inference), so parameters that require grad do not
send the graph to eager for autograd.
"""

from __future__ import annotations

import copy

import torch
import torch.nn as nn

import minicompile


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 4)
        self.register_buffer("shift", torch.linspace(-1, 1, 4))

    def forward(self, x):
        h = torch.relu(self.fc1(x))
        if self.training:
            h = h * 0.5
        return self.fc2(h) + self.shift


def make(device: torch.device) -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(0)
    model = Net().to(device)
    return model, copy.deepcopy(model)


@torch.no_grad()
def test_wrapper_is_a_module_sharing_parameters(backend: str, device: torch.device) -> None:
    model, _ = make(device)
    compiled = minicompile.compile(model, backend=backend)
    assert isinstance(compiled, nn.Module)
    mine = dict(compiled.named_parameters())
    theirs = dict(model.named_parameters())
    assert {id(p) for p in mine.values()} == {id(p) for p in theirs.values()}
    ptrs = {t.data_ptr() for t in compiled.state_dict().values()}
    assert ptrs == {t.data_ptr() for t in model.state_dict().values()}
    assert any(b is model.shift for b in compiled.buffers())
    x = torch.randn(3, 8, device=device)
    torch.testing.assert_close(compiled(x), model(x))


@torch.no_grad()
def test_in_place_parameter_update_needs_no_recompile(backend: str, device: torch.device) -> None:
    model, _ = make(device)
    compiled = minicompile.compile(model, backend=backend)
    x = torch.randn(3, 8, device=device)
    compiled(x)
    model.fc1.weight.mul_(0.5)
    model.shift.add_(1.0)
    torch.testing.assert_close(compiled(x), model(x))
    stats = minicompile.stats()
    assert stats["recompiles"] == 0 and stats["frames"] == 1 and stats["graphs"] == 1, stats


def test_optimizer_step_needs_no_recompile(backend: str, device: torch.device) -> None:
    model, _ = make(device)
    compiled = minicompile.compile(model, backend=backend)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(3, 8, device=device)
    for _ in range(3):
        with torch.no_grad():
            torch.testing.assert_close(compiled(x), model(x))
        for p in model.parameters():
            p.grad = torch.ones_like(p)
        opt.step()
    stats = minicompile.stats()
    assert stats["recompiles"] == 0 and stats["graphs"] == 1, stats


@torch.no_grad()
def test_load_state_dict_needs_no_recompile(backend: str, device: torch.device) -> None:
    model, other = make(device)
    for p in other.parameters():
        p.add_(1.0)
    compiled = minicompile.compile(model, backend=backend)
    x = torch.randn(3, 8, device=device)
    compiled(x)
    model.load_state_dict(other.state_dict())
    torch.testing.assert_close(compiled(x), other(x))
    assert minicompile.stats()["recompiles"] == 0


@torch.no_grad()
def test_eval_toggle_recompiles_once(backend: str, device: torch.device) -> None:
    model, eager = make(device)
    compiled = minicompile.compile(model, backend=backend)
    x = torch.randn(3, 8, device=device)
    torch.testing.assert_close(compiled(x), eager(x))  # training
    model.eval()
    eager.eval()
    torch.testing.assert_close(compiled(x), eager(x))
    assert minicompile.stats()["recompiles"] == 1
    model.train()
    eager.train()
    torch.testing.assert_close(compiled(x), eager(x))
    stats = minicompile.stats()
    assert stats["recompiles"] == 1 and stats["frames"] == 2, stats  # both entries kept


@torch.no_grad()
def test_eval_on_the_wrapper_reaches_the_model(backend: str, device: torch.device) -> None:
    model, eager = make(device)
    compiled = minicompile.compile(model, backend=backend)
    x = torch.randn(3, 8, device=device)
    compiled(x)
    compiled.eval()
    assert not model.training
    torch.testing.assert_close(compiled(x), eager.eval()(x))


@torch.no_grad()
def test_forward_hook_on_submodule_is_honoured(backend: str, device: torch.device) -> None:
    model, eager = make(device)
    compiled = minicompile.compile(model, backend=backend)
    x = torch.randn(3, 8, device=device)
    torch.testing.assert_close(compiled(x), eager(x))
    seen: list[tuple] = []

    def double(module, args, output):
        seen.append(tuple(output.shape))
        return output * 2

    model.fc1.register_forward_hook(double)
    eager.fc1.register_forward_hook(double)
    expected = eager(x)
    assert seen == [(3, 16)]
    torch.testing.assert_close(compiled(x), expected)  # recompiled, or ran the hook
    assert seen == [(3, 16), (3, 16)]  # its side effect happened once per call, traced or not


@torch.no_grad()
def test_forward_hook_on_top_module_is_honoured(backend: str, device: torch.device) -> None:
    model, eager = make(device)
    compiled = minicompile.compile(model, backend=backend)
    x = torch.randn(3, 8, device=device)
    compiled(x)
    handle = model.register_forward_hook(lambda m, a, out: out + 100)
    eager.register_forward_hook(lambda m, a, out: out + 100)
    torch.testing.assert_close(compiled(x), eager(x))
    handle.remove()
    torch.testing.assert_close(compiled(x), model(x))


@torch.no_grad()
def test_replaced_submodule_is_used(backend: str, device: torch.device) -> None:
    model, _ = make(device)
    compiled = minicompile.compile(model, backend=backend)
    x = torch.randn(3, 8, device=device)
    compiled(x)
    model.fc2 = nn.Linear(16, 4).to(device)
    torch.testing.assert_close(compiled(x), model(x))


@torch.no_grad()
def test_two_instances_do_not_share_compiled_parameters(backend: str, device: torch.device) -> None:
    a, _ = make(device)
    torch.manual_seed(1)
    b = Net().to(device)
    ca = minicompile.compile(a, backend=backend)
    cb = minicompile.compile(b, backend=backend)
    x = torch.randn(3, 8, device=device)
    torch.testing.assert_close(ca(x), a(x))
    torch.testing.assert_close(cb(x), b(x))


class Stack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(8, 8) for _ in range(3))

    def forward(self, x):
        for block in self.blocks:  # a break here cannot be resumed: the frame runs for real
            x = torch.tanh(block(x))
        return x * 2


@torch.no_grad()
def test_hooked_blocks_in_a_loop_run_hooks_around_compiled_forwards(
        backend: str, device: torch.device) -> None:
    """FSDP2's pattern in one process: each block's pre-hook sets a new weight object (its
    all-gather), its hook puts the stored one back (reshard).  The compiled model runs both
    hooks every call and each block's forward compiled, reading the weight of the call."""
    torch.manual_seed(0)
    model = Stack().to(device)
    scale, seen = [1.0], []

    def unshard(m: nn.Module, args: tuple) -> None:
        seen.append(m)
        m.stored = m.weight
        m.weight = nn.Parameter(m.stored * scale[0])

    def reshard(m: nn.Module, args: tuple, out: torch.Tensor) -> None:
        m.weight = m.stored

    for block in model.blocks:
        block.register_forward_pre_hook(unshard)
        block.register_forward_hook(reshard)
    compiled = minicompile.compile(model, backend=backend)
    minicompile.reset()
    for scale[0] in (1.0, 0.5, 2.0):
        x = torch.randn(4, 8, device=device)
        expected = model(x)
        torch.testing.assert_close(compiled(x), expected)
    assert len(seen) == 6 * 3
    stats = minicompile.stats()
    assert stats["graphs"] == 3 and stats["recompiles"] == 0, stats  # one per block
    assert all(isinstance(b.weight, nn.Parameter) and b.weight is b.stored for b in model.blocks)
