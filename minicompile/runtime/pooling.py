"""2-d max pooling on the CPU through ATen's channels-last kernel, which
passes/cpu_pooling.py puts in place of ``F.max_pool2d`` of a row-major (NCHW) input.

ATen's CPU max pool vectorizes over channels on a channels-last input and loops over the
window per element on an NCHW one: with one thread, 3x3 windows of stride 2 (squeezenet's)
over 2x64x31x31 took 909 us NCHW and 56 us channels-last, 77 us more for the copy to
channels-last.  The values and indices are the same (the first maximum of each window, a
NaN counting as the maximum) and so the gradient is: the backward is ATen's
``max_pool2d_with_indices_backward`` on the NCHW input, gradient and indices (34 us there,
249 us with the input channels-last and the gradient NCHW).

**Only with enough elements a thread** (:data:`MIN_CHANNELS_LAST_PER_THREAD`): the NCHW
kernel shares its planes among the threads, where the copies to and from channels-last
gain little from them.  Squeezenet's three pools, forward and backward, wall us:

    elements a thread         61k / 29k / 13k (2 threads)   7.7k / 3.6k / 1.6k (16 threads)
    NCHW                      735 / 290 / 122               163 / 93 / 62
    channels-last             318 / 170 / 110               262 / 183 / 130

(2 threads: this project's 2-core machine; 16: the GPU machine's host, whose one thread
took 1310 / 542 / 199 NCHW and 357 / 148 / 99 channels-last; ``.gpu/mb_pool.py``.)
"""

from __future__ import annotations

import functools
from typing import Any

import torch

MIN_CHANNELS_LAST_PER_THREAD = 12288


def channels_last_pays(x: torch.Tensor) -> bool:
    """Whether ``x`` has enough elements for each of ``torch.get_num_threads()`` threads
    that the channels-last kernel, with its copies, beats the NCHW one (see the module)."""
    return x.numel() >= MIN_CHANNELS_LAST_PER_THREAD * torch.get_num_threads()


def _pooled_input(x: torch.Tensor) -> torch.Tensor:
    """What ATen's kernel pools: ``x`` channels-last where that pays, else ``x`` itself."""
    return x.contiguous(memory_format=torch.channels_last) if channels_last_pays(x) else x


def _pair(v: Any) -> list[int]:
    return list(v) * (2 // len(v)) if isinstance(v, (tuple, list)) else [v, v]


@functools.cache
def _max_pool2d_function(window: tuple) -> type:
    """The autograd Function of one pooling window (kernel, stride, padding, dilation,
    ceil_mode): the pooled NCHW result, its indices kept NCHW for the backward.  Its one
    input is the tensor, so runtime/function_grads.py calls its backward directly."""

    class MaxPool2d(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
            out, indices = torch.ops.aten.max_pool2d_with_indices(_pooled_input(x), *window)
            ctx.save_for_backward(x, indices.contiguous())
            return out.contiguous()

        @staticmethod
        @torch.autograd.function.once_differentiable
        def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
            x, indices = ctx.saved_tensors
            return torch.ops.aten.max_pool2d_with_indices_backward(
                grad.contiguous(), x, *window, indices)

    return MaxPool2d


def max_pool2d(input: torch.Tensor, kernel_size: Any, stride: Any = None, padding: Any = 0,
               dilation: Any = 1, ceil_mode: bool = False,
               return_indices: bool = False) -> torch.Tensor:
    """``F.max_pool2d`` (without indices: passes/cpu_pooling.py leaves those calls alone)
    of an NCHW ``input``, computed channels-last where that pays, and returned NCHW."""
    assert not return_indices, "max_pool2d with indices stays ATen's"
    kernel = _pair(kernel_size)
    window = (tuple(kernel), tuple(_pair(stride) if stride else kernel), tuple(_pair(padding)),
              tuple(_pair(dilation)), bool(ceil_mode))
    if input.requires_grad and torch.is_grad_enabled():  # (passes/cpu_pooling.py: large)
        return _max_pool2d_function(window).apply(input)
    return torch.ops.aten.max_pool2d(_pooled_input(input), *window).contiguous()
