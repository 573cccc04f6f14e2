"""Matrix products written into rows padded to 16 bytes: the library calls that
passes/gemm_padding.py puts in a graph where eager's result would have rows of an odd
length (GPT-2's LM head: 50257 logits a token).

cuBLAS runs its fast kernels (on an H100 or H200, the sm90 ones) only where every matrix's
leading dimension is a multiple of 16 bytes; a result of rows of 50257 bf16 values gets an
``align1`` kernel, 7x slower on the LM head of GPT-2 small (6.7 ms against 0.88).  Each
function here computes what its PyTorch namesake does, with the same library call
(``torch.mm``/``torch.addmm``, as ATen's ``linear`` and ``matmul`` make it for a contiguous
input), into a
result whose last dim is contiguous and whose rows start every :func:`padded_row` elements.
"""

from __future__ import annotations

import torch

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


def _padded_out(shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
    return torch.empty_strided(shape, padded_strides(shape, like.element_size()),
                               dtype=like.dtype, device=like.device)


def linear(input: torch.Tensor, weight: torch.Tensor,
           bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(input, weight, bias)`` for a contiguous input of two or more dims: the
    product of its rows and ``weight.t()`` (a clean transpose), as ATen's linear does."""
    out = _padded_out((*input.shape[:-1], weight.shape[0]), input)
    rows = input.reshape(-1, input.shape[-1])  # a view: the input is contiguous
    flat = out.view(-1, out.shape[-1])  # stride (padded row, 1): written in place
    if bias is None:
        torch.mm(rows, weight.t(), out=flat)
    else:
        torch.addmm(bias, rows, weight.t(), out=flat)
    return out


def matmul(input: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    """``torch.matmul(input, other)`` for a contiguous input of two or more dims and a
    matrix ``other``: one product of the input's rows, as ATen folds it."""
    out = _padded_out((*input.shape[:-1], other.shape[1]), input)
    torch.mm(input.reshape(-1, input.shape[-1]), other, out=out.view(-1, out.shape[-1]))
    return out


def mm(input: torch.Tensor, mat2: torch.Tensor) -> torch.Tensor:
    """``torch.mm(input, mat2)``."""
    return torch.mm(input, mat2, out=_padded_out((input.shape[0], mat2.shape[1]), input))


def addmm(input: torch.Tensor, mat1: torch.Tensor, mat2: torch.Tensor) -> torch.Tensor:
    """``torch.addmm(input, mat1, mat2)`` (beta and alpha 1)."""
    out = _padded_out((mat1.shape[0], mat2.shape[1]), mat1)
    return torch.addmm(input, mat1, mat2, out=out)
