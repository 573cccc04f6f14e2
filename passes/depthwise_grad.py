"""The weight gradient of a depthwise 2-d convolution on the CPU, as graph ops.

ATen's CPU weight gradient of a depthwise convolution (one filter per channel: MobileNet,
EfficientNet) costs far more than its input gradient or its forward on few pixels: 0.8-1.7
ms against 0.05-0.09 for 1152 and 672 channels of 2x2 and 4x4 pixels, 5x5 filters (one
thread, NCHW and channels-last alike), where the sums below took 0.44 and 0.32.
It is ``kh * kw`` sums, one per filter tap, over (batch, rows, columns) of the output's
gradient times the padded input's window at that tap; as graph ops they fuse into one
reduction kernel with an accumulator per tap (:func:`weight_grad`), stacked into the
weight's shape.  The bias's gradient, a sum of the output's gradient, joins that kernel
(asked for it, ATen computes the weight's as well: 0.29-0.91 ms against 0.06-0.08 without);
the input's stays ATen's (passes/derivatives.py's ``conv_rule``).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from minicompile.graph import Node, TensorMeta
from minicompile.lowering import MAX_CAT_PIECES

DTYPES = frozenset({torch.float32, torch.float64})
# Up to a 7x7 filter (ConvNeXt's), one accumulator a tap in the kernel.
MAX_TAPS = 49
PIECES = MAX_CAT_PIECES  # (49 taps: 7 stacks of up to 8, then one cat of 7)
# Output pixels (batch x rows x columns) up to which the taps' sums are the faster: 2-4x
# at 8-32 (the shapes above, 3x3 to 7x7 filters); from 512 on ATen's was (0.10-0.23 ms
# against 0.23-0.35 for 96-144 channels of 3x3 filters, one thread).  efficientnet_b0,
# mobilenetv3_small_100 and mobilenet_v2 train steps took 5%, 6% and 6% less (two threads).
# (Measured in NCHW; channels-last, without the bound efficientnet_b0's step was the same.)
MAX_PIXELS = 64
SMALL_TAPS = 25  # (up to 5x5 filters: MAX_PIXELS; larger ones MAX_PIXELS_7X7)
# ATen's weight gradient of a 7x7 depthwise filter is slower still: 1.3-2.1 ms for 40
# channels of 2x16x16 pixels, 0.65-0.9 for 80 of 2x8x8 (one thread, its input gradient
# 0.1), so those filters take the sums up to 512 pixels: convnext_atto's train step 0.76
# of its time with ATen's (one thread's CPU time; taking the sums from 64 pixels on only,
# 1.13 of that).  (Before the cat pieces of reduction kernels, 7x7 filters at 4x4 and 2x2
# pixels had made that step 10-28% slower.)
MAX_PIXELS_7X7 = 512


def applies(g: Node, x: Node, w: Node, groups: Any, spatial: list) -> bool:
    """Whether ``conv2d(x, w, groups=groups)``, whose result's gradient is ``g``, is a
    depthwise convolution on the CPU whose weight gradient :func:`weight_grad` computes:
    float32/float64, static sizes, one filter per channel, at most :data:`MAX_TAPS` taps
    and :data:`MAX_PIXELS` output pixels (:data:`MAX_PIXELS_7X7` above :data:`SMALL_TAPS` taps)."""
    metas = (g.meta, x.meta, w.meta)
    if not all(isinstance(m, TensorMeta) and m.ndim == 4 and not m.is_symbolic
               and m.device.type == "cpu" and m.dtype in DTYPES for m in metas):
        return False
    channels, per_group, kh, kw = (int(s) for s in w.meta.shape)
    batch, _, rows, columns = (int(s) for s in g.meta.shape)
    return (len(spatial) == 3 and groups == channels == int(x.meta.shape[1]) and per_group == 1
            and kh * kw <= MAX_TAPS
            and batch * rows * columns <= (MAX_PIXELS if kh * kw <= SMALL_TAPS else MAX_PIXELS_7X7))


def gradients(d: Any, g: Node, x: Node, w: Node, bias: Node | None, spatial: list) -> list:
    """(value, gradient) pairs for the weight and, where it takes one, the bias."""
    grads = [(w, weight_grad(d, g, x, w, spatial))]
    if bias is not None and d.needs(bias):
        grads.append((bias, d("sum", g, (0, 2, 3), False)))
    return grads


def weight_grad(d: Any, g: Node, x: Node, w: Node, spatial: list) -> Node:
    """d(loss)/d(w) of ``conv2d(x, w, stride, padding, dilation, groups=channels)`` from
    ``g``, the gradient of its result: tap (i, j) sums ``g * window(i, j)`` over (batch,
    rows, columns), where the window is the padded input from (i * dilation) on, every
    stride-th pixel, one a pixel of the result."""
    (sh, sw), (ph, pw), (dh, dw) = spatial
    xv = d.fwd(x)
    if ph or pw:
        xv = d.extern(F.pad, xv, (pw, pw, ph, ph))
    rows, columns = (int(s) for s in g.meta.shape[2:])
    kh, kw = (int(s) for s in w.meta.shape[2:])
    taps = []
    for i in range(kh):
        band = d("slice", xv, 2, i * dh, i * dh + (rows - 1) * sh + 1, sh)
        for j in range(kw):
            window = d("slice", band, 3, j * dw, j * dw + (columns - 1) * sw + 1, sw)
            taps.append(d("sum", d("mul", g, window), (0, 2, 3), False))
    # (stacked 8 at a time, then joined: the kernels' cat takes up to 8 pieces)
    groups = [d.extern(torch.stack, taps[k:k + PIECES], 1) for k in range(0, len(taps), PIECES)]
    joined = groups[0] if len(groups) == 1 else d.extern(torch.cat, groups, 1)
    return d("reshape", joined, tuple(int(s) for s in w.meta.shape))
