"""Training with compiled forward and backward: autograd's semantics, modules, loops.

Every check compares with eager PyTorch on fresh inputs; each compiled function is called
at least twice with different values.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import minicompile

from devices import device_for
from gpt import GPT, GPTConfig

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "capture"))

from capture_helpers import capture  # noqa: E402  (tests/capture's helper)


def close(a: torch.Tensor, b: torch.Tensor) -> None:
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def grads_of(params: list) -> list:
    return [None if p.grad is None else p.grad.clone() for p in params]


def check_module(model: nn.Module, make_input: object, backend: str, steps: int = 2,
                 loss_fn: object = None) -> None:
    """Gradients of the compiled module's loss equal eager's, step after step."""
    device = device_for(backend)
    model = model.to(device)
    twin = copy.deepcopy(model)
    compiled = minicompile.compile(twin, backend=backend)
    loss_fn = loss_fn or (lambda out, x: out.float().square().mean())
    for _ in range(steps):
        x = make_input(device)
        loss_fn(model(x), x).backward()
        loss_fn(compiled(x), x).backward()
        for (name, p), q in zip(model.named_parameters(), twin.parameters()):
            assert (p.grad is None) == (q.grad is None), name
            if p.grad is not None:
                torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-5, msg=name)
        for (name, b), c in zip(model.named_buffers(), twin.buffers()):
            torch.testing.assert_close(c, b, msg=name)
        model.zero_grad()
        twin.zero_grad()
    stats = minicompile.stats()
    assert stats["eager_fallbacks"] == 0 and stats["graph_breaks"] == 0, stats


def test_mlp(backend: str) -> None:
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 16), nn.Tanh(),
                        nn.LayerNorm(16), nn.Linear(16, 4))
    check_module(mlp, lambda d: torch.randn(5, 8, device=d), backend)


def test_cnn_with_batch_norm_in_train_mode(backend: str) -> None:
    torch.manual_seed(0)
    cnn = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                        nn.MaxPool2d(2), nn.Flatten(), nn.Linear(4 * 4 * 4, 3)).train()
    check_module(cnn, lambda d: torch.randn(2, 3, 8, 8, device=d), backend)


def test_nanogpt_with_cross_entropy(backend: str) -> None:
    torch.manual_seed(0)
    config = GPTConfig(n_layer=1, n_embd=16, n_head=2, block_size=8, vocab_size=32)
    targets = {}

    def make(d: torch.device) -> torch.Tensor:
        targets["y"] = torch.randint(0, 32, (2, 8), device=d)
        return torch.randint(0, 32, (2, 8), device=d)

    def loss(out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(out.view(-1, 32), targets["y"].view(-1))

    check_module(GPT(config).train(), make, backend, loss_fn=loss)


def test_training_loop_losses_match_eager() -> None:
    """20 AdamW steps of a compiled loss and a compiled optimizer step (C++ backend)."""
    torch.manual_seed(0)
    config = GPTConfig(n_layer=1, n_embd=16, n_head=2, block_size=8, vocab_size=32)
    model = GPT(config).train()
    twin = copy.deepcopy(model)
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (model, twin)]

    def loss_of(m: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(m(x).view(-1, 32), y.view(-1))

    compiled_loss = minicompile.compile(loss_of)
    compiled_step = minicompile.compile(opts[1].step)
    for _ in range(20):
        x, y = torch.randint(0, 32, (2, 8)), torch.randint(0, 32, (2, 8))
        eager = loss_of(model, x, y)
        eager.backward()
        opts[0].step()
        opts[0].zero_grad()
        mine = compiled_loss(twin, x, y)
        mine.backward()
        compiled_step()
        opts[1].zero_grad()
        torch.testing.assert_close(mine, eager, rtol=1e-4, atol=1e-5)
    # Adam divides by sqrt(v): where a gradient is ~0, rounding-level differences in it
    # move a parameter by up to ~lr a step, so parameters are compared at lr's scale.
    for p, q in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(q, p, rtol=0, atol=2e-2)
    assert minicompile.stats()["recompiles"] == 0


def test_autograd_grad_accumulation_and_retain_graph(backend: str) -> None:
    device = device_for(backend)

    def f(x, w):
        return (torch.sin(x) * w).sum(), torch.tanh(x @ w.unsqueeze(1))

    cf = minicompile.compile(f, backend=backend)
    for _ in range(2):
        x = torch.randn(4, 3, device=device, requires_grad=True)
        w = torch.randn(3, device=device, requires_grad=True)
        s, t = f(x, w)
        expected = torch.autograd.grad(s + t.sum(), (x, w))
        s2, t2 = cf(x, w)
        total = s2 + t2.sum()
        got = torch.autograd.grad(total, (x, w), retain_graph=True)
        for a, b in zip(got, expected):
            close(a, b)
        total.backward(retain_graph=True)  # a second backward accumulates into .grad
        total.backward()
        close(x.grad, 2 * expected[0])
        close(w.grad, 2 * expected[1])
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        s3, _ = cf(x, w)
        s3.backward()
        s3.backward()


def test_frozen_parameters_detach_and_no_grad_regions(backend: str) -> None:
    device = device_for(backend)
    lin = nn.Linear(4, 4).to(device)
    lin.bias.requires_grad_(False)

    def f(x):
        h = lin(x)
        with torch.no_grad():
            scale = h.abs().mean()
        return (h * scale + h.detach() ** 2).sum()

    cf = minicompile.compile(f, backend=backend)
    for _ in range(2):
        x = torch.randn(3, 4, device=device)
        expected = torch.autograd.grad(f(x), lin.weight)
        got = torch.autograd.grad(cf(x), lin.weight)
        close(got[0], expected[0])
    assert lin.bias.grad is None


def test_inputs_with_and_without_requires_grad_are_guarded(backend: str) -> None:
    device = device_for(backend)

    def f(x, y):
        return (x * y).exp().sum()

    cf = minicompile.compile(f, backend=backend)
    x = torch.randn(5, device=device, requires_grad=True)
    y = torch.randn(5, device=device)
    close(torch.autograd.grad(cf(x, y), x)[0], torch.autograd.grad(f(x, y), x)[0])
    y.requires_grad_(True)  # now y needs a gradient too: a new entry
    got = torch.autograd.grad(cf(x, y), (x, y))
    for a, b in zip(got, torch.autograd.grad(f(x, y), (x, y))):
        close(a, b)
    x2 = torch.randn(5, device=device, requires_grad=True)  # both entries, fresh values
    y2 = torch.randn(5, device=device, requires_grad=True)
    for a, b in zip(torch.autograd.grad(cf(x2, y2), (x2, y2)),
                    torch.autograd.grad(f(x2, y2), (x2, y2))):
        close(a, b)
    y3 = torch.randn(5, device=device)
    close(torch.autograd.grad(cf(x2, y3), x2)[0], torch.autograd.grad(f(x2, y3), x2)[0])
    with torch.no_grad():  # grad mode off: the inference entry, no graph
        out = cf(x, y)
    assert not out.requires_grad
    assert minicompile.stats()["recompiles"] == 2


def test_graph_break_segments_are_each_differentiable(backend: str) -> None:
    device = device_for(backend)

    def f(x, w):
        h = torch.relu(x * w)
        print("between segments")  # a graph break
        return (h.sin() * w).sum()

    cf = minicompile.compile(f, backend=backend)
    for _ in range(2):
        x = torch.randn(6, device=device, requires_grad=True)
        w = torch.randn(6, device=device, requires_grad=True)
        expected = torch.autograd.grad(f(x, w), (x, w))
        got = torch.autograd.grad(cf(x, w), (x, w))
        for a, b in zip(got, expected):
            close(a, b)
    stats = minicompile.stats()
    assert stats["graph_breaks"] == 1 and stats["eager_fallbacks"] == 0, stats


def test_the_backward_is_compiled_and_saves_recomputable_values() -> None:
    """The backward graph is built from prims; a layer norm's output is recomputed, not
    saved, but on the CPU the relu's, which the linear reads, is saved (the forward writes
    it anyway); nothing runs eagerly."""
    from minicompile.passes.autograd import differentiate
    from minicompile.passes.pipeline import run_graph_passes

    ln = nn.LayerNorm(64)
    lin = nn.Linear(64, 64)

    def f(x):
        return lin(F.relu(ln(x))).sum()

    graph = capture(f, torch.randn(16, 64, requires_grad=True))[0].graph
    joint = differentiate(run_graph_passes(graph)[0])
    saved = [kind for kind, _ in joint.backward_inputs if kind == "saved"]
    # the relu's output, the row mean and variance sums (and the input itself)
    assert len(saved) == 3, str(joint.backward)
    assert joint.saved_bytes == 16 * 64 * 4 + 2 * 16 * 4
    assert all(n.target != "minicompile.runtime.autograd.vjp" for n in joint.backward.nodes)


def test_dynamic_batch_compiles_a_symbolic_backward() -> None:
    """A changing batch size recompiles once with a symbolic batch: forward and backward."""
    torch.manual_seed(0)
    config = GPTConfig(n_layer=1, n_embd=16, n_head=2, block_size=8, vocab_size=32)
    model = GPT(config).train()
    twin = copy.deepcopy(model)
    compiled = minicompile.compile(twin)
    for batch in (2, 3, 5):
        x, y = torch.randint(0, 32, (batch, 8)), torch.randint(0, 32, (batch, 8))
        F.cross_entropy(model(x).view(-1, 32), y.view(-1)).backward()
        F.cross_entropy(compiled(x).view(-1, 32), y.view(-1)).backward()
        for (name, p), q in zip(model.named_parameters(), twin.parameters()):
            torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-5, msg=name)
        model.zero_grad()
        twin.zero_grad()
    stats = minicompile.stats()
    assert stats["recompiles"] == 1 and stats["eager_fallbacks"] == 0, stats


def test_autocast_bfloat16_training_matches_eager() -> None:
    """An autocast region in the compiled loss: bf16 matmuls, float32 loss, gradients of
    the float32 parameters as eager's (CPU autocast)."""
    torch.manual_seed(0)
    config = GPTConfig(n_layer=1, n_embd=16, n_head=2, block_size=8, vocab_size=32)
    model = GPT(config).train()
    twin = copy.deepcopy(model)

    def loss_of(m: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = m(x)
        return F.cross_entropy(logits.float().view(-1, 32), y.view(-1))

    compiled = minicompile.compile(loss_of)
    for _ in range(2):
        x, y = torch.randint(0, 32, (2, 8)), torch.randint(0, 32, (2, 8))
        loss_of(model, x, y).backward()
        compiled(twin, x, y).backward()
        for (name, p), q in zip(model.named_parameters(), twin.parameters()):
            assert q.grad.dtype == torch.float32, name
            torch.testing.assert_close(q.grad, p.grad, rtol=1.6e-2, atol=1e-3, msg=name)
        model.zero_grad()
        twin.zero_grad()
    assert minicompile.stats()["eager_fallbacks"] == 0


def test_backward_frees_saved_tensors_after_their_last_use(capsys) -> None:  # noqa: ANN001
    """The compiled backward takes its saved tensors (the Function clears its own references
    unless retain_graph) and frees each after its last reader, not all at its end."""
    from minicompile import config

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4),
                                torch.nn.Tanh(), torch.nn.Linear(4, 2))
    twin = copy.deepcopy(model)
    compiled = minicompile.compile(twin, backend="cpp")
    with config.patch(logs=frozenset({"output_code"})):
        for seed in (1, 2):
            torch.manual_seed(seed)
            x = torch.randn(5, 8)
            model(x).square().sum().backward()
            compiled(x).square().sum().backward()
    for p, q in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-5, atol=1e-6)
    err = capsys.readouterr().err
    backward = err[err.index("_backward (cpp)"):]
    call = backward[backward.index("def call(args):"):]
    call = call[:call.index("\n    return (")]
    assert "args.clear()" in call
    freed = [name for line in call.splitlines() if line.strip().startswith("del ")
             for name in line.strip()[4:].split(", ") if name.startswith("arg")]
    assert freed, call  # saved tensors go before the backward's last kernel
