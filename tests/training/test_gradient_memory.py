"""A compiled backward keeps its gradients' memory across calls on the CPU
(runtime/output_pool.py) and hands it out again only when nothing else holds it: a kept
``p.grad``, a view of it or a returned gradient keeps its values; optimizer steps (either
``zero_grad``) and gradient accumulation give eager's values."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

import minicompile
from minicompile.codegen import memory_reuse

TOL = {"rtol": 1e-5, "atol": 1e-5}


@pytest.fixture(autouse=True)
def pool_every_output(monkeypatch: pytest.MonkeyPatch) -> None:
    """The small model's gradients through the pool too (by default it takes those of
    ``MIN_POOLED_BYTES`` or more: see test_only_large_gradients_take_pooled_memory)."""
    monkeypatch.setattr(memory_reuse, "MIN_POOLED_BYTES", 0)


def make(device: torch.device) -> torch.nn.Module:
    """Matrix products' gradients (out=), a kernel's (the layer norm's) and a view of one
    (the biases': a row of a reduction's result)."""
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.LayerNorm(16),
                               torch.nn.Linear(16, 4)).to(device)


def loss_of(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    return model(x).square().mean()


def test_kept_gradients_are_never_overwritten(backend: str, device: torch.device) -> None:
    minicompile.reset()
    model = make(device)
    ref = copy.deepcopy(model)
    compiled = minicompile.compile(model, backend=backend)
    kept, views, returned, values = [], [], [], []
    for step in range(4):
        x = torch.randn(5, 8, device=device)
        loss_of(compiled, x).backward()
        loss_of(ref, x).backward()
        grads = [p.grad for p in model.parameters()]
        for g, q in zip(grads, ref.parameters()):
            torch.testing.assert_close(g, q.grad, **TOL)
        if step == 0:  # a p.grad kept past the step
            kept = grads
        elif step == 1:  # a view of one
            views = [g.view(-1) for g in grads]
        values.append([g.clone() for g in grads])
        for p, q in zip(model.parameters(), ref.parameters()):
            p.grad = q.grad = None
        x = torch.randn(5, 8, device=device)
        got = torch.autograd.grad(loss_of(compiled, x), list(model.parameters()))
        want = torch.autograd.grad(loss_of(ref, x), list(ref.parameters()))
        torch.testing.assert_close(got, want, **TOL)
        if step == 2:  # a gradient torch.autograd.grad returned
            returned = [(g, g.clone()) for g in got]
    for g, v in zip(kept, values[0]):
        torch.testing.assert_close(g, v, rtol=0, atol=0)
    for g, v in zip(views, values[1]):
        torch.testing.assert_close(g, v.view(-1), rtol=0, atol=0)
    for g, v in returned:
        torch.testing.assert_close(g, v, rtol=0, atol=0)


def test_a_kept_storage_is_never_overwritten(backend: str, device: torch.device) -> None:
    """Only a gradient's storage kept (its Python object: the pool's own), the tensor
    dropped; on the CPU, the memory of gradients nothing holds any more is taken again."""
    minicompile.reset()
    model = make(device)
    compiled = minicompile.compile(model, backend=backend)
    kept, pointers = [], []
    for step in range(4):
        loss_of(compiled, torch.randn(5, 8, device=device)).backward()
        pointers.append([p.grad.data_ptr() for p in model.parameters()])
        if step == 1:
            kept = [(p.grad.untyped_storage(), p.grad.storage_offset(), p.grad.shape,
                     p.grad.stride(), p.grad.clone()) for p in model.parameters()]
        for p in model.parameters():
            p.grad = None
    for storage, *where, value in kept:
        g = torch.empty(0, dtype=value.dtype, device=device).set_(storage, *where)
        torch.testing.assert_close(g, value, rtol=0, atol=0)
    if device.type == "cpu":  # (GPU tensors: the caching allocator keeps the memory)
        assert pointers[2] == pointers[3] and pointers[1] != pointers[2]


@pytest.mark.parametrize("set_to_none", [True, False])
def test_optimizer_steps_match_eager(backend: str, device: torch.device,
                                     set_to_none: bool) -> None:
    minicompile.reset()
    model = make(device)
    ref = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    compiled = minicompile.compile(model, backend=backend)
    for _ in range(3):
        x = torch.randn(5, 8, device=device)
        for m, o in ((compiled, opt), (ref, ref_opt)):
            o.zero_grad(set_to_none=set_to_none)
            F.cross_entropy(m(x), torch.arange(5, device=device) % 4).backward()
            o.step()
        for p, q in zip(model.parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, q.grad, **TOL)
            torch.testing.assert_close(p, q, **TOL)


def test_gradient_accumulation_over_two_backward_calls(backend: str,
                                                       device: torch.device) -> None:
    minicompile.reset()
    model = make(device)
    ref = copy.deepcopy(model)
    compiled = minicompile.compile(model, backend=backend)
    for _ in range(2):
        for m in (model, ref):
            for p in m.parameters():
                p.grad = None
        for _ in range(2):
            x = torch.randn(5, 8, device=device)
            loss_of(compiled, x).backward()
            loss_of(ref, x).backward()
        for p, q in zip(model.parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, q.grad, **TOL)


def test_the_kept_memory_goes_with_the_compiled_function() -> None:
    """The generated module outlives a compiled function in the build cache; the memory its
    backward's pool keeps does not."""
    import gc

    minicompile.reset()
    model = make(torch.device("cpu"))
    compiled = minicompile.compile(model, backend="cpp")
    for _ in range(2):
        loss_of(compiled, torch.randn(5, 8)).backward()
        model.zero_grad(set_to_none=True)
    (entry,) = compiled.__dict__["_compiled"].entries
    pools = [c.cell_contents for c in (entry.run.__closure__ or ())
             if hasattr(c.cell_contents, "backward")]
    assert pools, "the entry's run holds its training step"
    pool = pools[0].backward.__globals__["pool"]
    assert any(pool.kept), "the backward kept its gradients' memory"
    del compiled, entry, pools, model
    gc.collect()
    assert not any(pool.kept), "the memory outlived the compiled function"


def test_only_large_gradients_take_pooled_memory(monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture) -> None:
    """A gradient under ``MIN_POOLED_BYTES`` (glibc's heap gives its memory back without
    faults) is a plain allocation; one of 128 KiB or more comes from the pool."""
    monkeypatch.undo()
    minicompile.reset()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 128), torch.nn.GELU(),
                                torch.nn.Linear(128, 4))  # 128 KiB, 512 B, 2 KiB, 16 B
    ref = copy.deepcopy(model)
    compiled = minicompile.compile(model, backend="cpp")
    with minicompile.config.patch(logs=frozenset({"output_code"})):
        for _ in range(2):
            x = torch.randn(5, 256)
            loss_of(compiled, x).backward()
            loss_of(ref, x).backward()
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, **TOL)
    takes = [line for line in capsys.readouterr().err.splitlines() if "pool.take(" in line]
    assert len(takes) == 1 and "(128, 256)" in takes[0]
