"""Mix-order reductions (passes/mix_order.py) on hand-built graphs, text only (no GPU): on
CUDA the column sums beside a row sum are left whole by split_reductions and computed by
the row kernel, a program per chunk of rows; what may not mix stays apart."""

from __future__ import annotations

import torch

from minicompile.codegen.wrapper import generate
from minicompile.lowering import lower
from minicompile.passes.fusion import fuse
from minicompile.passes.mix_order import mix
from minicompile.passes.pipeline import run_graph_passes
from minicompile.passes.split_reductions import split_reductions
from minicompile.sym import FloorDiv, ModularIndexing, index_symbol, merge_digits, simplify_bounded

from graph_builder import GraphBuilder


def groups_of(graph, log=None):  # noqa: ANN001, ANN201
    program = lower(split_reductions(run_graph_passes(graph, verify=True)[0]))
    return program, mix(fuse(program), log)


def layer_norm_backward(device: str, rows: int = 4096, dtype: torch.dtype = torch.float32):  # noqa: ANN201
    """A layer norm's backward, in the shape the decomposition gives it: the row sum of
    the input gradient, and the weight and bias gradients (sums over the rows)."""
    b = GraphBuilder(device)
    grad = b.input("L_grad", (rows, 512), dtype)
    xhat = b.input("L_xhat", (rows, 512), dtype)
    weight = b.input("L_weight", (512,), dtype)
    gw = b("mul", grad, weight)
    row = b("sum", b("mul", gw, xhat), (1,), True)
    grad_input = b("sub", gw, b("mul", xhat, row))
    return b.output(grad_input, b("sum", b("mul", grad, xhat), (0,), False),
                    b("sum", grad, (0,), False))


def test_cuda_layer_norm_backward_is_one_kernel_and_one_sum() -> None:
    """On CUDA the two weight gradients were each split (partials, then a small sum);
    here both ride on the row kernel: 256 programs of 16 rows, one workspace of partials,
    one sum over it."""
    program, groups = groups_of(layer_norm_backward("cuda"))
    assert len(groups) == 1, [g.name for g in groups]
    module = generate(program, groups, "triton").module
    assert module.count("@triton.jit") == 1
    assert "RSPLIT=16" in module and "launch(256, " in module
    assert "colpart0 = empty_strided((2, 256, 512), (131072, 512, 1)" in module
    assert module.count("colpart0[0:2].sum(1)") == 1
    # 100 rows: one program walks them all and stores the sums itself (no partials).
    program, groups = groups_of(layer_norm_backward("cuda", rows=100))
    module = generate(program, groups, "triton").module
    assert "RSPLIT=128" in module and "launch(1, " in module and "colpart" not in module


def test_what_does_not_mix_keeps_its_kernel() -> None:
    """bfloat16 gradients (their sums round: no float32 partials), fewer rows than
    mix_order.MIN_ROWS, and a row sum offered to a column sum's kernel (which reads across rows)
    stay apart."""
    log: list[str] = []
    _, groups = groups_of(layer_norm_backward("cpu", dtype=torch.bfloat16), log)
    assert len(groups) == 2 and any("not a float32 sum" in line for line in log), log
    _, groups = groups_of(layer_norm_backward("cpu", rows=8))
    assert len(groups) == 2
    _, groups = groups_of(layer_norm_backward("cpu"))
    assert len(groups) == 1
    b = GraphBuilder()
    x = b.input("L_x", (8, 64))
    square = b("mul", x, x)
    log.clear()
    _, groups = groups_of(b.output(b("sum", square, (0,), False), b("sum", square, (1,), False)),
                          log)
    assert len(groups) == 2 and any("not read along its rows" in line for line in log), log


def test_a_reshape_that_merges_rows_joins_the_row_kernel() -> None:
    """GPT-2's ``x.view(-1, C)``: the layer norm's input gradient over [2, 12, 64] read as
    [24, 64], then summed over its rows (a bias gradient): placed with the merged row
    index ``12 * p0 + p1`` (the view's floor division and modulus worked out from the
    bounds), the sum joins the row kernel.  A bound the divisor does not cover stays."""
    b = GraphBuilder()
    grad, xhat = b.input("L_grad", (2, 12, 64)), b.input("L_xhat", (2, 12, 64))
    row = b("sum", b("mul", grad, xhat), (2,), True)
    rows = b("reshape", b("sub", grad, b("mul", xhat, row)), (24, 64))
    _, groups = groups_of(b.output(rows, b("sum", rows, (0,), False)))
    assert len(groups) == 1, [g.name for g in groups]
    p0, p1 = index_symbol("p0"), index_symbol("p1")
    flat = 12 * p0 + p1
    read = 768 * FloorDiv(flat, 12) + 64 * ModularIndexing(flat, 1, 12)
    assert simplify_bounded(read, {p0: 2, p1: 12}) == 768 * p0 + 64 * p1
    assert simplify_bounded(FloorDiv(flat, 12), {p0: 2, p1: 13}) == FloorDiv(flat, 12)


def test_neighbouring_digits_of_an_index_merge() -> None:
    """``(r % 64) + 64*((r // 64) % 3)`` (a dim a reshape split, read back merged) is
    ``r % 192``, which the bounds of a loop over [0, 192) make ``r``; with a floor division
    in the second digit's place the whole is ``r // 1``, i.e. ``r``."""
    r, x = index_symbol("r0"), index_symbol("x0")
    split = ModularIndexing(r, 1, 64) + 64 * ModularIndexing(r, 64, 3)
    assert merge_digits(split + 576 * x) == ModularIndexing(r, 1, 192) + 576 * x
    assert simplify_bounded(split + 576 * x, {r: 192}) == r + 576 * x
    assert merge_digits(2 * ModularIndexing(r, 4, 8) + 16 * FloorDiv(r, 32)) == 2 * FloorDiv(r, 4)
    # digits of other strides, or of other bases, stay apart
    other = 64 * ModularIndexing(x, 64, 3)
    assert merge_digits(split + other) == ModularIndexing(r, 1, 192) + other
    assert merge_digits(ModularIndexing(r, 1, 64) + 32 * ModularIndexing(r, 64, 3)) == \
        ModularIndexing(r, 1, 64) + 32 * ModularIndexing(r, 64, 3)
