"""1x1 convolutions over at most :data:`MAX_PIXELS` output pixels on the CPU become
one matrix product of the pixels' rows (``minicompile/runtime/conv_gemm.py`` says why and
what it measured): the deep stages of a CNN on small images (resnext50's 2x2 pixels of
1024 and 2048 channels at 64x64 input) spend most of their time there.

Only for float32 and float64 on the CPU, static sizes, a contiguous input and result
(channels-last ones: below); any other convolution stays the
call it was.  From 16 pixels on the convolution was the faster (by 4-90%, 13 shapes
measured on one thread), so the rule stops below.  A convolution of a parameter in float32
runs on a packed oneDNN weight instead where it can (passes/onednn_conv.py, which is
faster still: 0.11 ms against 0.31 for 1024 channels on 2x2 pixels).  In a graph laid out
channels-last (for oneDNN in inference, for its depthwise convolutions in training), a 1x1
convolution with a small product (:func:`_small_rows_product`) is that product all the
same: the pixel rows are then a view of the input and the product's rows the result's
pixels, and MKL ran those faster than oneDNN's convolution (in training as graph ops,
:func:`_rows_product`, whose backward is two more products on views).

One pixel an image (a squeeze-excite block's convolutions), in any layout and with any
stride, is one ``F.linear`` between views (:func:`_pixel_product`), in inference too: on one
thread the two were alike (4-15 us forward, 11-38 backward, 32 -> 8 up to 1152 -> 48
channels), but from two threads on oneDNN's convolution took 33-60 us and its backward
90-140, against 6-15 and 11-41 for the products; train steps on two threads took 0.73
(mobilenetv3_small) and 0.87 (efficientnet_b0) of their time as convolutions.

A convolution that takes a gradient (stride 1) becomes the same product in graph ops
instead (:func:`_rows_product`: its pixel rows, ``F.linear``, the result back in eager's
layout), whose backward is derived as matrix products too (passes/derivatives.py's
``linear_rule``): efficientnet_b0's 2x2-pixel stages at 64x64 input, one thread, took 0.9 ms
a forward and 1.0-1.2 ms a backward as convolutions against 0.12 and 0.24 as products
(1152 -> 320 channels on 2x2x2 pixels; 320 -> 1280 alike).

Any other convolution that takes a gradient over few output pixels (:func:`_small_windows`)
is the product of its windows' rows (:func:`_window_product`: the padded input's taps,
views stacked into rows by one kernel, then ``F.linear``; a stride views the input as
phases, :func:`_taps`): ATen's convolution and backward cost far more there than their
arithmetic (3x3, 512 -> 512 channels on 2x2x2 pixels: 13-20 ms on one thread, 1.5 on 16,
the product 3.4 and 0.5; a 1x1 of 1024 -> 2048 with stride 2: 19 ms, the product 3).
Measured over 25 ResNet and DenseNet shapes (README: the train steps): products took
0.15-0.96 of the time at up to 32 output pixels on 1-16 threads (a strided 1x1's one tap:
up to 128), 1.15-1.64 at 128 on one thread.

A patch embedding (stride equal to the kernel, a vision transformer's 16x16 or a ConvNeXt
stem's 4x4) of at most :data:`MAX_PATCH_ROWS` patches is the same product of the patches'
rows (:func:`rewrite_of`).  Train steps, as products over as convolutions (``.gpu/ab.py``;
one thread's CPU time, then two threads' wall time): torchvision's vit 0.82 and 0.90,
vit_tiny 0.99 and 0.95, convnext_atto 0.98 and 0.98, mlp_mixer 0.99 and 1.00; inference:
vit 0.65 and 0.81, the others 0.98-1.02 (convnext_atto's packed oneDNN stem 1.02 both).
On 224x224 images (1568 patches of 768) the convolution was the faster.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from minicompile import ops
from minicompile.graph import Graph, Node, TensorMeta, copy_graph
from minicompile.lowering import MAX_CAT_PIECES
from minicompile.meta_rules import int_tuple
from minicompile.passes.decompose import _Builder
from minicompile.passes.decompose_reductions import bind
from minicompile.passes.layout import CONV2D, channels_last, contiguous, plain
from minicompile.runtime import conv_gemm

MAX_PIXELS = 8  # output pixels (batch x height x width)
MAX_STRIDED_PIXELS = 128  # of a strided one that takes a gradient
MAX_ROWS_MACS = 4 << 20  # multiply-adds of a channels-last 1x1 convolution's product
MAX_ROWS = 2048  # its pixel rows: 8192 rows of 32 -> 16 channels took 1.4x oneDNN's time
MIN_ROWS_DEPTH = 16  # input channels: at 16 or fewer, oneDNN's convolution was the faster
MAX_WINDOW_PIXELS = 32  # output pixels of a k x k convolution as its windows' product
MAX_PATCH_ROWS = 512  # patches (batch x patch rows x patch columns)
DTYPES = frozenset({torch.float32, torch.float64})
PARAMS = ("input", "weight", "bias", "stride", "padding", "dilation", "groups")
DEFAULTS = {"bias": None, "stride": 1, "padding": 0, "dilation": 1, "groups": 1}


def _convolution(node: Node) -> dict[str, Any] | None:
    """The bound arguments of ``node`` where it is a 2-d convolution of static sizes on
    the CPU in float32 or float64, without dilation or groups."""
    if node.target not in CONV2D or len(node.args) > len(PARAMS):
        return None
    bound = bind(node.args, node.kwargs, PARAMS, DEFAULTS)
    if set(bound) != set(PARAMS):
        return None  # an argument this pass does not know
    x, w, meta = bound["input"], bound["weight"], node.meta
    tensors = [x, w] + ([bound["bias"]] if bound["bias"] is not None else [])
    if not all(isinstance(t, Node) and isinstance(t.meta, TensorMeta) and not t.meta.is_symbolic
               for t in tensors) or not isinstance(meta, TensorMeta) or meta.is_symbolic:
        return None
    bound["stride"] = int_tuple(bound["stride"], 2)
    bound["padding"] = int_tuple(bound["padding"], 2) if bound["padding"] != "valid" else (0, 0)
    if (meta.device.type != "cpu" or meta.dtype not in DTYPES or x.meta.ndim != 4
            or bound["stride"] is None or bound["padding"] is None
            or int_tuple(bound["dilation"], 2) != (1, 1) or bound["groups"] != 1):
        return None
    return bound


def rewrite_of(node: Node) -> tuple[Callable[..., Node], tuple] | None:
    """How this pass rewrites ``node`` (a builder of the product and its graph operands),
    or None where it stays the convolution it is."""
    bound = _convolution(node)
    if bound is None:
        return None
    x, w, bias, stride = bound["input"], bound["weight"], bound["bias"], bound["stride"]
    kernel = tuple(int(s) for s in w.meta.shape[2:])
    n, _, h, width = (int(s) for s in x.meta.shape)
    if bound["padding"] != (0, 0) or kernel not in ((1, 1), stride):  # (not a patch)
        return (_window_product, (x, w, bias, bound["padding"], stride)) if _small_windows(
            node, bound) else None
    if kernel == (1, 1) and (h, width) == (1, 1):
        return _pixel_product, (x, w, bias)  # one pixel an image: any layout, any stride
    if kernel != (1, 1):  # a patch embedding, or a convolution this pass leaves
        patches = (h // kernel[0]) * (width // kernel[1])
        if (kernel != stride or h % kernel[0] or width % kernel[1]
                or n * patches > MAX_PATCH_ROWS):
            return None
        return _rows_product, (x, w, bias, kernel)
    pixels = math.prod(int(s) for s in node.meta.shape[2:])
    if all(channels_last(m) for m in (x.meta, node.meta)):  # (passes/layout.py's choice)
        if not _small_rows_product(node, bound):
            return None  # (oneDNN's: passes/onednn_conv.py)
        if node.requires_grad:  # the rows a view of the input, the result's a view of them
            return _rows_product, (x, w, bias)
        return _library_product, (x, w, bias, stride, True)
    if not all(contiguous(m) for m in (x.meta, node.meta)):
        return None
    if node.requires_grad and stride != (1, 1):  # (its one tap: every stride-th pixel)
        return (_window_product, (x, w, bias, (0, 0), stride)) if _small_windows(
            node, bound) else None
    if not 1 < pixels <= n * pixels <= MAX_PIXELS:
        return None  # too many pixels
    if node.requires_grad:
        return _rows_product, (x, w, bias)
    return _library_product, (x, w, bias, stride)


def _small_windows(node: Node, bound: dict[str, Any]) -> bool:
    """Whether a convolution that takes a gradient is the product of its windows' rows
    (:func:`_window_product`): eager's layout and at most :data:`MAX_WINDOW_PIXELS` output
    pixels (:data:`MAX_STRIDED_PIXELS` for a 1x1 filter's one tap)."""
    x, w = bound["input"], bound["weight"]
    pixels = math.prod(int(s) for s in node.meta.shape) // int(w.meta.shape[0])
    one_tap = all(int(k) == 1 for k in w.meta.shape[2:])
    return (node.requires_grad and all(contiguous(m) for m in (x.meta, node.meta))
            and pixels <= (MAX_STRIDED_PIXELS if one_tap else MAX_WINDOW_PIXELS))


def _small_rows_product(node: Node, bound: dict[str, Any]) -> bool:
    """Whether a 1x1 convolution of a channels-last input (stride 1, float32) is a product
    small enough that MKL's runs it faster than oneDNN's convolution: at most
    :data:`MAX_ROWS_MACS` multiply-adds and :data:`MAX_ROWS` pixel rows, over more than
    :data:`MIN_ROWS_DEPTH` input channels.  Timed on 15 such shapes (MobileNet's,
    ConvNeXt's and ResNet's stages at 64x64) in inference, MKL's product took 0.34-0.96 of
    oneDNN's time on a packed weight on one thread (and once 1.17, for a shape another run
    put at 0.81), 0.38-0.78 on two, 0.55-0.88 on four, and 0.52-1.02 on 16 but for 512
    rows of 24 -> 144 channels there (1.2).  In training, forward and backward of 19
    MobileNet and ConvNeXt shapes (``.gpu/mb_cl1x1.py``): 0.24-0.92 on two threads (ATen's
    convolution ran slower on two threads than on one), 0.63-1.25 on one."""
    x, w = bound["input"].meta, bound["weight"].meta
    rows = math.prod(int(s) for s in node.meta.shape) // int(w.shape[0])
    depth = int(x.shape[1])
    return (bound["stride"] == (1, 1) and x.dtype == torch.float32
            and depth > MIN_ROWS_DEPTH and rows <= MAX_ROWS
            and rows * depth * int(w.shape[0]) <= MAX_ROWS_MACS)


def convs_as_products(graph: Graph) -> tuple[Graph, str]:
    """``graph`` with its small 1x1 convolutions and its patch embeddings as products (or
    ``graph`` itself), and what was done, for the logs ("" where nothing)."""
    found = {n: r for n in graph.calls() if (r := rewrite_of(n)) is not None}
    if not found:
        return graph, ""

    def rewrite(new: Graph, node: Node, remap: Callable) -> Node | None:
        if node not in found:
            return None
        build, operands = found[node]
        return build(_Builder(new, node), *(remap(v) if isinstance(v, Node) else v
                                           for v in operands))

    names = ", ".join(f"{tuple(int(s) for s in n.meta.shape)}" for n in found)
    return copy_graph(graph, rewrite), f"convolutions as products of pixel rows: {names}"


def _library_product(b: _Builder, x: Node, w: Node, bias: Node | None,
                     stride: tuple[int, int], channels_last: bool = False) -> Node:
    """The product as one library call (runtime/conv_gemm.py), in inference; its result
    ``channels_last`` where the graph's layout has it so."""
    origin = b.origin
    args = (x, w, bias, stride) + ((True,) if channels_last else ())
    return b.graph.call(ops.extern_op(conv_gemm.conv2d_1x1), args, {}, origin.meta,
                        origin.stack)


def _rows_product(b: _Builder, x: Node, w: Node, bias: Node | None,
                  kernel: tuple[int, int] = (1, 1)) -> Node:
    """``F.conv2d(x, w, bias, stride=kernel)`` of a ``kernel``-sized ``w`` as graph ops:
    the rows of ``x``'s pixels (patches) times ``w``'s matrix, the result laid out as the
    convolution's."""
    n, c, h, width = (int(s) for s in x.meta.shape)
    (kh, kw), out = kernel, int(w.meta.shape[0])
    h, width, depth = h // kh, width // kw, c * kh * kw
    patches = b("reshape", x, (n, c, h, kh, width, kw))
    rows = b("reshape", b("permute", patches, (0, 2, 4, 1, 3, 5)), (n * h * width, depth))
    product = b(ops.extern_op(F.linear), rows, b("reshape", w, (out, depth)), bias)
    return _as_convolution(b, b("reshape", product, (n, h, width, out)))


def _as_convolution(b: _Builder, pixels: Node) -> Node:
    """``pixels`` (n, rows, columns, channels) as the convolution's result: a view where
    that has its strides, else a copy in them."""
    result, want = b("permute", pixels, (0, 3, 1, 2)), plain(b.origin.meta.stride)
    return result if plain(result.meta.stride) == want else b("to_eager_layout", result, want)


def _window_product(b: _Builder, x: Node, w: Node, bias: Node | None,
                    padding: tuple[int, int], stride: tuple[int, int]) -> Node:
    """``F.conv2d(x, w, bias, stride, padding)`` as graph ops: each output pixel's window
    of the padded input is a row (every channel's ``kh x kw`` taps, in ``w``'s order),
    times ``w``'s matrix; the result in the convolution's layout.  The taps are views
    stacked into the rows by one kernel; autograd derives the products, and the taps'
    gradients add back into the input's pixels (:func:`_taps`)."""
    n, c = (int(s) for s in x.meta.shape[:2])
    out, _, kh, kw = (int(s) for s in w.meta.shape)
    rows_out, columns_out = (int(s) for s in b.origin.meta.shape[2:])
    depth = c * kh * kw
    taps = _taps(b, x, (kh, kw), padding, stride, (rows_out, columns_out))
    stack = ops.extern_op(torch.stack)  # (8 taps a kernel at most: its cat's pieces)
    groups = [b(stack, taps[k:k + MAX_CAT_PIECES], 4) for k in range(0, len(taps), MAX_CAT_PIECES)]
    windows = groups[0] if len(groups) == 1 else b(ops.extern_op(torch.cat), groups, 4)
    rows = b("reshape", windows, (n * rows_out * columns_out, depth))
    product = b(ops.extern_op(F.linear), rows, b("reshape", w, (out, depth)), bias)
    return _as_convolution(b, b("reshape", product, (n, rows_out, columns_out, out)))


def _taps(b: _Builder, x: Node, kernel: tuple[int, int], padding: tuple[int, int],
          stride: tuple[int, int], size: tuple[int, int]) -> list[Node]:
    """Each filter tap's view of the padded input, (n, rows, columns, channels), row-major
    over the taps.  With a stride, the padded input (cut or padded to whole strides) is
    viewed as stride x stride phases, (n, c, rows, row phase, columns, column phase): a
    tap is one phase's rows and columns from an offset, so that every view steps by 1 and
    its gradient is a fused placement into zeros (not a strided scatter)."""
    h, width = (int(s) for s in x.meta.shape[2:])
    # the padded input's rows and columns that the windows span, in whole strides
    need = [s * ((k - 1) // s + o) for k, s, o in zip(kernel, stride, size)]
    keep = [min(full, spanned - p) for full, spanned, p in zip((h, width), need, padding)]
    if keep[0] < h:
        x = b("slice", x, 2, 0, keep[0], 1)  # rows no window reads
    if keep[1] < width:
        x = b("slice", x, 3, 0, keep[1], 1)
    pads = (padding[1], need[1] - padding[1] - keep[1],
            padding[0], need[0] - padding[0] - keep[0])
    padded = b(ops.extern_op(F.pad), x, pads) if any(pads) else x
    (sh, sw), (rows, columns) = stride, size
    if stride != (1, 1):
        n, c = (int(s) for s in x.meta.shape[:2])
        padded = b("reshape", padded, (n, c, need[0] // sh, sh, need[1] // sw, sw))
    taps = []
    for i in range(kernel[0]):
        band = b("slice", padded, 2, i // sh, i // sh + rows, 1)
        for j in range(kernel[1]):
            tap = b("slice", band, 3 if stride == (1, 1) else 4, j // sw, j // sw + columns, 1)
            if stride != (1, 1):
                tap = b("select", b("select", tap, 5, j % sw), 3, i % sh)
            taps.append(b("permute", tap, (0, 2, 3, 1)))
    return taps


def _pixel_product(b: _Builder, x: Node, w: Node, bias: Node | None) -> Node:
    """``F.conv2d(x, w, bias)`` of a 1x1 ``w`` over one pixel an image (a squeeze-excite
    block's) as views around one ``F.linear``, the result in the convolution's strides."""
    n, c = (int(s) for s in x.meta.shape[:2])
    out = int(w.meta.shape[0])
    product = b(ops.extern_op(F.linear), b("reshape", x, (n, c)), b("reshape", w, (out, c)),
                bias)
    want = plain(b.origin.meta.stride)
    if want == (out, 1, out, out):  # channels-last
        return b("permute", b("reshape", product, (n, 1, 1, out)), (0, 3, 1, 2))
    pixels = b("reshape", product, (n, out, 1, 1))
    return pixels if want == (out, 1, 1, 1) else b("to_eager_layout", pixels, want)
