"""``F.scaled_dot_product_attention`` with a mask that takes a gradient, on the CPU, is
compiled as the ops of eager's math path (passes/decompose_attention.py), not recorded for
PyTorch's engine.  Values and gradients (query, key, value, the mask, weights in front)
equal eager's for T5's learned position bias (broadcast over the batch), a padding mask
added to it, an explicit and a negative scale, float64, and rows whose mask is all -inf
(eager's safe softmax: zeros, and zero gradients); two calls each with
fresh values.  Without a mask gradient, the library call stays (its fused kernels run)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import minicompile
from devices import device_for


def attend(scale: float | None, bias_shape: tuple[int, ...]):  # noqa: ANN201
    def f(x, w, bias, pad):  # noqa: ANN001, ANN202
        q, k, v = (x @ w).unflatten(-1, (3, 2, 8)).unbind(2)  # 2 heads of 8
        mask = bias + pad  # T5: the position bias plus the padding mask
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                             v.transpose(1, 2), attn_mask=mask, scale=scale)
        return out.transpose(1, 2).flatten(2)
    return f


CASES = {  # scale, bias shape, dtype, padding value
    "t5_bias": (None, (1, 2, 6, 6), torch.float32, torch.finfo(torch.float32).min),
    "full_bias_scaled": (0.3, (3, 2, 6, 6), torch.float32, -1e4),
    "negative_scale": (-0.2, (1, 2, 6, 6), torch.float32, -1e4),
    "float64": (None, (1, 1, 6, 6), torch.float64, -1e9),
    "rows_all_masked": (None, (1, 2, 6, 6), torch.float32, -float("inf")),
}


@pytest.mark.parametrize("case", list(CASES))
def test_masks_that_take_a_gradient(case: str, backend: str,
                                    capsys: pytest.CaptureFixture) -> None:
    device = device_for(backend)
    if device.type != "cpu":
        pytest.skip("the rewrite is the CPU's: CUDA's fused kernel differentiates the mask")
    scale, bias_shape, dtype, pad_value = CASES[case]
    fn = attend(scale, bias_shape)
    compiled = minicompile.compile(fn, backend=backend)
    with minicompile.config.patch(logs=frozenset({"output_code"})):
        calls(fn, compiled, dtype, case, bias_shape, pad_value)
    code = capsys.readouterr().err
    assert "def call(args):" in code and "vjp(" not in code
    assert "torch.nn.functional.scaled_dot_product_attention" not in code  # (no library call)
    stats = minicompile.stats()
    assert (stats["graphs"], stats["graph_breaks"], stats["eager_fallbacks"]) == (1, 0, 0)


def calls(fn, compiled, dtype: torch.dtype, case: str, bias_shape: tuple,  # noqa: ANN001
          pad_value: float) -> None:
    """Two calls with fresh values: outputs and gradients equal eager's."""
    for call in range(2):
        x = torch.randn(3, 6, 16, dtype=dtype)
        w = torch.randn(16, 48, dtype=dtype) / 4
        bias = torch.randn(bias_shape, dtype=dtype)
        pad = torch.zeros(3, 1, 6, 6, dtype=dtype)
        pad[1, :, :, 4 + call:] = pad_value  # the second sentence is padded
        if case == "rows_all_masked":
            pad[2, :, 3 - call] = pad_value  # a query row with no key to attend to
        results = []
        for f in (fn, compiled):
            leaves = [t.clone().requires_grad_() for t in (x, w, bias)]
            out = f(*leaves, pad)
            weights = torch.linspace(-1, 1, out.numel(), dtype=dtype).view_as(out)
            grads = torch.autograd.grad((out * weights).sum(), leaves)
            results.append([out, *grads])
        for got, want in zip(results[1], results[0]):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_a_mask_without_a_gradient_stays_the_library_call(
        capsys: pytest.CaptureFixture) -> None:
    fn = attend(None, (1, 2, 6, 6))
    compiled = minicompile.compile(fn, backend="cpp")
    with minicompile.config.patch(logs=frozenset({"output_code"})):
        for _ in range(2):
            x, w, bias = torch.randn(3, 6, 16), torch.randn(16, 48) / 4, torch.randn(1, 2, 6, 6)
            pad = torch.zeros(3, 1, 6, 6)
            results = []
            for f in (fn, compiled):
                leaves = [t.clone().requires_grad_() for t in (x, w)]
                out = f(*leaves, bias, pad)
                results.append([out, *torch.autograd.grad(out.sum(), leaves)])
            for got, want in zip(results[1], results[0]):
                torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    # (the fused CPU kernel's own call, and its backward op: passes/cpu_attention.py)
    code = capsys.readouterr().err
    assert "torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(" in code
    assert "torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(" in code
    assert minicompile.stats()["eager_fallbacks"] == 0
