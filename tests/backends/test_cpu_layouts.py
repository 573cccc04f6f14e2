"""Library calls whose CPU kernels lay their result out by a rule of their own, which the
meta device does not follow (minicompile/library_layouts.py): batch_norm gives the
input's suggested memory format, scaled_dot_product_attention the layout of the kernel
PyTorch picks (its CPU flash kernel follows the query's layout; the math path is
contiguous).  Compiled on CPU tensors by both backends, each call is compared with eager
on values and strides, twice, with fresh inputs."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

import minicompile

CL = torch.channels_last


def bn(x: torch.Tensor, m: torch.Tensor, v: torch.Tensor, w: torch.Tensor,
       b: torch.Tensor) -> torch.Tensor:
    return F.batch_norm(x, m, v, w, b) * 2


def bn_training(x: torch.Tensor, m: torch.Tensor, v: torch.Tensor, w: torch.Tensor,
                b: torch.Tensor) -> torch.Tensor:
    return F.batch_norm(x, None, None, w, b, training=True)


def torch_bn(x: torch.Tensor, m: torch.Tensor, v: torch.Tensor, w: torch.Tensor,
             b: torch.Tensor) -> torch.Tensor:
    return torch.batch_norm(x, w, b, m, v, False, 0.1, 1e-5, False)


def bn_inputs(make: Callable[[], torch.Tensor]) -> Callable[[], tuple]:
    def inputs() -> tuple:
        x = make()
        c = x.shape[1]
        return x, torch.randn(c), torch.rand(c) + 0.5, torch.randn(c), torch.randn(c)
    return inputs


BATCH_NORM_INPUTS = {
    "channels_last": lambda: torch.randn(2, 3, 4, 5).contiguous(memory_format=CL),
    "hw_transposed": lambda: torch.randn(2, 3, 5, 4).transpose(2, 3),  # eager: contiguous
    "2d_transposed": lambda: torch.randn(3, 8).t(),
    "3d_channel_inner": lambda: torch.randn(2, 5, 3).transpose(1, 2),
    "contiguous": lambda: torch.randn(2, 3, 4, 5),
}


def check(fn: Callable, inputs: Callable[[], tuple], backend: str, **tol: float) -> None:
    compiled = minicompile.compile(fn, backend=backend)
    for seed in (0, 1):
        torch.manual_seed(seed)
        args = inputs()
        expected, got = fn(*args), compiled(*args)
        torch.testing.assert_close(got, expected, **tol)
        assert got.stride() == expected.stride(), (got.stride(), expected.stride())


@pytest.mark.parametrize("fn", [bn, bn_training, torch_bn], ids=lambda f: f.__name__)
@pytest.mark.parametrize("layout", list(BATCH_NORM_INPUTS))
def test_batch_norm_has_the_layout_of_the_cpu_kernel(backend: str, device: torch.device,
                                                   fn: Callable, layout: str) -> None:
    if device.type != "cpu":
        pytest.skip("the CPU kernels' rule (on a GPU machine the Triton backend runs CUDA)")
    check(fn, bn_inputs(BATCH_NORM_INPUTS[layout]), backend, atol=1e-4, rtol=1e-4)


def heads_second(b: int, t: int, h: int, d: int, dtype: torch.dtype) -> torch.Tensor:
    """[B, H, T, D] over [B, T, H, D] memory: what attention modules pass."""
    return torch.randn(b, t, h, d, dtype=dtype).transpose(1, 2)


ATTENTION_INPUTS = {
    "transposed_q": lambda dt: (heads_second(2, 8, 4, 16, dt), torch.randn(2, 4, 8, 16, dtype=dt),
                                torch.randn(2, 4, 8, 16, dtype=dt)),
    "transposed_qkv": lambda dt: tuple(heads_second(2, 8, 4, 16, dt) for _ in range(3)),
    "q_last_dims_transposed": lambda dt: (torch.randn(2, 4, 16, 8, dtype=dt).transpose(2, 3),
                                          torch.randn(2, 4, 8, 16, dtype=dt),
                                          torch.randn(2, 4, 8, 16, dtype=dt)),
    "contiguous": lambda dt: tuple(torch.randn(2, 4, 8, 16, dtype=dt) for _ in range(3)),
}


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v)


def causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3)


def masked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    mask = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril()
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


@pytest.mark.parametrize("fn", [attention, causal, masked], ids=lambda f: f.__name__)
@pytest.mark.parametrize("layout", list(ATTENTION_INPUTS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_attention_has_the_layout_of_the_cpu_kernel(backend: str, device: torch.device,
                                                  fn: Callable, layout: str,
                                                  dtype: torch.dtype) -> None:
    if device.type != "cpu":
        pytest.skip("the CPU kernels' rule (on a GPU machine the Triton backend runs CUDA)")
    tol = {"atol": 2e-2, "rtol": 2e-2} if dtype == torch.bfloat16 else {"atol": 1e-4,
                                                                        "rtol": 1e-4}
    check(fn, lambda: ATTENTION_INPUTS[layout](dtype), backend, **tol)
