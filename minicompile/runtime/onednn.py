"""oneDNN's CPU convolution on a weight packed once: the two library calls that
passes/onednn_conv.py puts in place of an inference ``F.conv2d`` of a parameter.

``F.conv2d`` reorders the weight into oneDNN's layout on every call; like Inductor's
freezing, :func:`pack_conv2d_weight` packs it once (passes/hoist_params.py) and
:func:`conv2d` calls ``mkldnn._convolution_pointwise``.  One thread, resnext50 at 64x64: a
1x1 2048->1024 convolution on 2x2 pixels 0.20 ms against 0.66, grouped 3x3 ones 0.05-0.09
against 0.07-0.13.  The weight is reordered from its dense form in one pass (a warm
process packs resnet50's 53 weights at its first call: 0.06-0.09 s of one thread, against
0.10-0.15 through a ``torch._mkldnn`` copy first).
"""

from __future__ import annotations

import torch

from minicompile import compat


def pack_conv2d_weight(weight: torch.Tensor, padding: tuple[int, int], stride: tuple[int, int],
                       dilation: tuple[int, int], groups: int, input_size: tuple[int, ...],
                       scale: torch.Tensor | None = None) -> torch.Tensor:
    """``weight`` (times ``scale``, one per output channel: a folded batch norm's) reordered
    for oneDNN's convolution of inputs of ``input_size`` (a ``torch._mkldnn`` tensor of
    ``weight``'s sizes: no strides, no data pointer).  The product is written channels-last,
    the layout the reorder reads (it copies into it first otherwise): resnet50's 53 weights
    in 0.11-0.12 s of one thread, against 0.12-0.13 s multiplied and copied apart."""
    pack, _ = compat.onednn_convolution()
    if scale is not None:
        out = torch.empty_permuted(weight.shape, (0, 2, 3, 1), dtype=weight.dtype,
                                   device=weight.device)
        weight = torch.mul(weight, scale, out=out)
    return pack(weight, list(padding), list(stride), list(dilation), groups,
                list(input_size))


def conv2d(input: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None,
           padding: tuple[int, int], stride: tuple[int, int], dilation: tuple[int, int],
           groups: int, attr: str = "none", scalars: tuple[float, ...] = ()) -> torch.Tensor:
    """``F.conv2d(input, weight, bias, stride, padding, dilation, groups)`` of a
    channels-last ``input``, ``packed`` from ``weight`` by :func:`pack_conv2d_weight`,
    and oneDNN's activation ``attr`` ("swish", say, with its ``scalars``) applied to it
    (passes/onednn_conv.py gives only those that keep a NaN as eager does); the result
    channels-last (as eager's convolution of a channels-last input)."""
    _, convolve = compat.onednn_convolution()
    out = convolve(input, packed, bias, list(padding), list(stride), list(dilation), groups,
                   attr, list(scalars), "")
    return out.contiguous(memory_format=torch.channels_last)  # (a no-op: it is already)
