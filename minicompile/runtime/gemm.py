"""Matrix products written into rows padded to 16 bytes: the library calls that
passes/gemm_padding.py puts in a graph where eager's result would have rows of an odd
length (GPT-2's LM head: 50257 logits a token).

cuBLAS runs its fast kernels (on an H100 or H200, the sm90 ones) only where the matrices'
dimensions and leading dimensions are multiples of 16 bytes; a result of rows of 50257 bf16
values gets an ``align1`` kernel, 6.6 ms for GPT-2 small's LM head over 16 x 512 tokens on
an H200.  Padded rows alone are not enough (measured: the same ``align1`` kernel with the
rows written 50264 apart): the product's own column count must be aligned, as Inductor's
``pad_mm`` makes it.  Each function here computes what its PyTorch namesake does, with the
same library call (``torch.mm``/``torch.addmm``, as ATen's ``linear`` and ``matmul`` make it
for a contiguous input), on the right operand with its columns (a linear's weight rows)
zero-padded to a multiple of 16 bytes (a copy each call: GPT-2's 50257 x 768 weight is
77 MB, about 0.04 ms), and returns the result's first columns: rows :func:`padded_row`
elements apart.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

ALIGN_BYTES = 16


def padded_row(n: int, itemsize: int) -> int:
    """``n`` rounded up to a multiple of 16 bytes of elements of ``itemsize`` bytes."""
    step = max(1, ALIGN_BYTES // itemsize)
    return -(-n // step) * step


def padded_strides(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    """Row-major strides of ``shape`` whose last dim's rows are :func:`padded_row` apart."""
    strides = [1] * len(shape)
    running = padded_row(shape[-1], itemsize)
    for d in range(len(shape) - 2, -1, -1):
        strides[d] = running
        running *= shape[d]
    return tuple(strides)


def _pad_last(t: torch.Tensor, n: int) -> torch.Tensor:
    """``t`` with its last dim, of size ``n``, zero-padded to :func:`padded_row`."""
    return F.pad(t, (0, padded_row(n, t.element_size()) - n))


def _pad_bias(bias: torch.Tensor, n: int) -> torch.Tensor:
    """A bias broadcast over the product's columns: padded where it has them all."""
    return _pad_last(bias, n) if bias.ndim and bias.shape[-1] == n else bias


def linear(input: torch.Tensor, weight: torch.Tensor,
           bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(input, weight, bias)`` for a contiguous input of two or more dims: the
    product of its rows and the weight's rows padded with zeros (a copy of the weight),
    its first ``weight.shape[0]`` columns."""
    n = weight.shape[0]
    padded = F.pad(weight, (0, 0, 0, padded_row(n, weight.element_size()) - n))
    rows = input.reshape(-1, input.shape[-1])  # a view: the input is contiguous
    if bias is None:
        full = torch.mm(rows, padded.t())
    else:
        full = torch.addmm(_pad_bias(bias, n), rows, padded.t())
    return full.view(*input.shape[:-1], full.shape[-1])[..., :n]


def matmul(input: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    """``torch.matmul(input, other)`` for a contiguous input of two or more dims and a
    matrix ``other``: one product of the input's rows, as ATen folds it."""
    n = other.shape[1]
    full = torch.mm(input.reshape(-1, input.shape[-1]), _pad_last(other, n))
    return full.view(*input.shape[:-1], full.shape[-1])[..., :n]


def mm(input: torch.Tensor, mat2: torch.Tensor) -> torch.Tensor:
    """``torch.mm(input, mat2)``."""
    return torch.mm(input, _pad_last(mat2, mat2.shape[1]))[:, :mat2.shape[1]]


def addmm(input: torch.Tensor, mat1: torch.Tensor, mat2: torch.Tensor) -> torch.Tensor:
    """``torch.addmm(input, mat1, mat2)`` (beta and alpha 1)."""
    n = mat2.shape[1]
    return torch.addmm(_pad_bias(input, n), mat1, _pad_last(mat2, n))[:, :n]
