"""Matrix products written into rows padded to 16 bytes: the library calls that
passes/gemm_padding.py puts where eager's result would have rows of an odd length (GPT-2's
LM head: 50257 logits a token, 6.6 ms in cuBLAS's ``align1`` kernel on an H200).  As
Inductor's ``pad_mm``, the product's own column count is aligned: the right operand is
zero-padded (:func:`pad_rows`, :func:`pad_columns`: a node of its own, hoisted for a
parameter), and the result's first columns returned, rows :func:`padded_row` apart.
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


def pad_columns(t: torch.Tensor) -> torch.Tensor:
    """``t`` with its last dim zero-padded to :func:`padded_row` elements (a copy)."""
    n = t.shape[-1]
    return F.pad(t, (0, padded_row(n, t.element_size()) - n))


def pad_rows(weight: torch.Tensor) -> torch.Tensor:
    """A linear's ``weight`` [n, k] with its rows zero-padded to :func:`padded_row` (a copy)."""
    n = weight.shape[0]
    return F.pad(weight, (0, 0, 0, padded_row(n, weight.element_size()) - n))


def linear(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
           n: int) -> torch.Tensor:
    """``F.linear(input, w, b)`` for a contiguous input of two or more dims, given ``weight
    = pad_rows(w)`` and ``bias`` as :func:`matmul`'s."""
    return matmul(input, weight.t(), bias, n)


def matmul(input: torch.Tensor, other: torch.Tensor, bias: torch.Tensor | None,
           n: int) -> torch.Tensor:
    """``torch.matmul(input, o)`` (with ``bias``, ``torch.addmm(b, input, o)``) for a
    contiguous input of two or more dims, given ``other = pad_columns(o)`` and ``bias =
    pad_columns(b)`` (or ``b`` where it broadcasts, or None): its first ``n`` columns."""
    rows = input.reshape(-1, input.shape[-1])  # a view: the input is contiguous
    full = torch.mm(rows, other) if bias is None else torch.addmm(bias, rows, other)
    return full.view(*input.shape[:-1], full.shape[-1])[..., :n]
