"""The backward of ``F.scaled_dot_product_attention`` calls its fused kernel's backward op
directly (minicompile/runtime/attention_grads.py), not a nested ``torch.autograd.grad``; on
the CPU the training graph calls the flash kernel and its backward op itself
(passes/cpu_attention.py), nothing recorded.
Values: gradients of query, key, value and the weights around them equal eager's, for
``loss.backward()`` and for ``torch.autograd.grad(loss, some_inputs)`` (where the running
graph task computes only what it was asked for), two calls with fresh inputs; masks, causal,
one tensor as query, key and value, and a mask that takes a gradient (the engine's road)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import minicompile
from minicompile import compat
from minicompile.runtime import attention_grads, autograd

from devices import device_for

CASES = {
    "plain": lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v),
    "causal": lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, is_causal=True),
    "bool_mask": lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m > 0),
    "float_mask": lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m,
                                                                    scale=0.3),
    "self": lambda q, k, v, m: F.scaled_dot_product_attention(q, q, q),
    "mask_takes_grad": lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v,
                                                                         attn_mask=m * q[..., :1]),
}


def block(case: str):  # noqa: ANN201
    """A projection in front of the attention, as in a model: its inputs are graph values."""
    def f(x, w, m):  # noqa: ANN001, ANN202
        q, k, v = (x @ w).unflatten(-1, (3, 3, 16)).unbind(2)  # 3 heads of 16
        return CASES[case](q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), m).sum(1)
    return f


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("how", ["backward", "grad_of_x"])
@pytest.mark.parametrize("case", list(CASES))
def test_attention_gradients(case: str, how: str, dtype: torch.dtype, backend: str,
                             monkeypatch: pytest.MonkeyPatch) -> None:
    """bfloat16 on a GPU runs the flash or cuDNN kernels (float32: memory-efficient)."""
    device = device_for(backend)
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    direct, recorded = [], []
    real = attention_grads.attention_grads
    monkeypatch.setattr(autograd, "attention_grads",
                        lambda *a: direct.append(real(*a)) or direct[-1])
    library = autograd._function
    monkeypatch.setattr(autograd, "_function", lambda name: recorded.append(name) or library(name))
    fn = block(case)
    compiled = minicompile.compile(fn, backend=backend)
    for _ in range(2):
        x = torch.randn(2, 7, 48, device=device, dtype=dtype)
        w = torch.randn(48, 3 * 48, device=device, dtype=dtype) / 7
        m = torch.randn(7, 7, device=device, dtype=dtype)
        grads = []
        for f in (fn, compiled):
            leaves = [t.clone().requires_grad_() for t in (x, w)]
            out = f(*leaves, m)
            loss = (out.float() * torch.linspace(-1, 1, out.shape[-1], device=device)).sum()
            if how == "backward":
                loss.backward()
                grads.append([t.grad for t in leaves])
            else:
                grads.append(list(torch.autograd.grad(loss, leaves[:1])))
        for got, want in zip(grads[1], grads[0]):
            # bfloat16: both sides round differently (fused kernels, summation order); an
            # error is measured against the gradient's own scale, not element by element.
            scale = 1.0 if dtype == torch.float32 else max(want.float().abs().max().item(), 1.0)
            torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol * scale)
    assert minicompile.stats()["graph_breaks"] == 0
    fused = [r for r in direct if r is not None]
    if case == "mask_takes_grad":
        assert not fused  # the mask's gradient: PyTorch's engine
    elif device.type == "cpu":
        assert not direct and not recorded, "the CPU flash kernel's calls were not the graph's"
    else:
        assert fused, "the attention's backward went through the engine"


@pytest.mark.parametrize("how", ["backward", "grad_of_x"])
def test_grouped_query_attention_takes_the_direct_road(how: str, backend: str,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Llama's grouped-query attention (``enable_gqa``): 4 query heads over 2 key/value
    heads.  On the CPU the graph calls the flash kernel, which takes the grouped heads as
    they are, and its backward op (passes/cpu_attention.py); its result has other strides
    than eager's meta says, so it is copied into those (a ``to_eager_layout`` whose
    gradient is a copy back).  On CUDA the recorded call copies it (a CopyBackwards node
    over the attention's): its gradient passes through that copy unchanged, and a fused
    kernel's backward is still called directly."""
    device = device_for(backend)
    direct, recorded = [], []
    real = attention_grads.attention_grads
    monkeypatch.setattr(autograd, "attention_grads",
                        lambda *a: direct.append(real(*a)) or direct[-1])
    library = autograd._function
    monkeypatch.setattr(autograd, "_function", lambda name: recorded.append(name) or library(name))

    def f(x, w):  # noqa: ANN001, ANN202
        q, kv = (x @ w).split([64, 64], -1)
        q = q.unflatten(-1, (4, 16)).transpose(1, 2)
        k, v = kv.unflatten(-1, (2, 2, 16)).transpose(1, 3).unbind(2)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    compiled = minicompile.compile(f, backend=backend)
    for _ in range(2):
        x, w = torch.randn(2, 7, 32, device=device), torch.randn(32, 128, device=device) / 6
        grads = []
        for fn in (f, compiled):
            leaves = [t.clone().requires_grad_() for t in (x, w)]
            loss = (fn(*leaves) * torch.linspace(-1, 1, 16, device=device)).sum()
            grads.append([t.grad for t in leaves] if how == "backward" and not loss.backward()
                         else list(torch.autograd.grad(loss, leaves[:1])))
        for got, want in zip(grads[1], grads[0]):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert minicompile.stats()["graph_breaks"] == 0
    if device.type == "cpu":
        assert not direct and not recorded, "the CPU flash kernel's calls were not the graph's"
        return
    # float32 grouped-query attention on CUDA runs eager's math path (no fused kernel takes
    # it), whose gradient only the engine knows: there the call goes through vjp.
    fused = type(f(x, w.requires_grad_()).grad_fn).__name__ in compat.ATTENTION_BACKWARDS
    assert direct and all((r is not None) == fused for r in direct)
