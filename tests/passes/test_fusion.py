"""Fusion: which loop-IR buffers share a kernel, and why not when they do not."""

from __future__ import annotations

import sympy
import torch

from minicompile import ops
from minicompile.ir import ComputedBuffer, Layout, Load, Op, dim_symbols
from minicompile.lowering import lower
from minicompile.passes.fusion import (
    FusedGroup,
    can_fuse,
    dependency_graph,
    fuse,
    score_fusion,
)
from minicompile.passes.pipeline import run_graph_passes

from graph_builder import GraphBuilder

CPU = torch.device("cpu")


def lowered(b: GraphBuilder):
    g, _ = run_graph_passes(b.graph, verify=True)
    return lower(g)


def test_two_outputs_of_one_shape_fuse() -> None:
    b = GraphBuilder()
    x = b.input("L_x", (4, 8))
    b.output(b("sin", x), b("cos", x))
    program = lowered(b)
    log: list[str] = []
    groups = fuse(program, log)
    assert len(groups) == 1
    assert [buf.name for buf in groups[0].buffers] == ["buf0", "buf1"]
    assert groups[0].name == "buf0+buf1"
    assert any(line.startswith("fuse buf0 buf1") for line in log), log


def test_outputs_of_different_shapes_do_not_fuse() -> None:
    b = GraphBuilder()
    x, y = b.input("L_x", (4, 8)), b.input("L_y", (8, 4))
    b.output(b("sin", x), b("cos", y))
    program = lowered(b)
    log: list[str] = []
    groups = fuse(program, log)
    assert len(groups) == 2
    assert "keep apart buf0 buf1: different iteration spaces" in log


def test_can_fuse_gives_a_reason() -> None:
    b = GraphBuilder()
    x, y = b.input("L_x", (4, 8)), b.input("L_y", (3, 3))
    b.output(b("sin", x), b("cos", x), b("exp", y))
    program = lowered(b)
    g0, g1, g2 = (FusedGroup(k, [buf]) for k, buf in enumerate(program.buffers))
    dag = dependency_graph([g0, g1, g2])
    assert can_fuse(g0, g1, dag) == (True, "same iteration space")
    ok, reason = can_fuse(g0, g2, dag)
    assert not ok and reason == "different iteration spaces"


def test_pointwise_chain_is_inlined_into_one_buffer() -> None:
    b = GraphBuilder()
    x = b.input("L_x", (4, 8))
    b.output(b("sin", b("sin", x)))
    program = lowered(b)
    assert len(program.buffers) == 1
    assert str(program.buffers[0].body) == "sin(sin(load(arg0, 8*i0 + i1)))"
    assert len(fuse(program)) == 1


# Hand-made buffers for what lowering does not produce today: a buffer that reads another.


def _buffer(name: str, reads: list[str], shape=(4, 8), device=CPU) -> ComputedBuffer:
    shape = tuple(sympy.Integer(s) for s in shape)
    stride = (shape[1], sympy.Integer(1))
    layout = Layout(shape, stride, torch.float32, device)
    i0, i1 = dim_symbols(2)
    loads = [Load(r, 8 * i0 + i1, torch.float32) for r in reads]
    body = loads[0]
    for ld in loads[1:]:
        body = Op("add", (body, ld), torch.float32)
    return ComputedBuffer(name, layout, body)


def test_a_realized_producer_fuses_with_a_consumer_reading_the_same_element() -> None:
    a = FusedGroup(0, [_buffer("buf0", ["arg0"])])
    b = FusedGroup(1, [_buffer("buf1", ["buf0"])])
    dag = dependency_graph([a, b])
    assert list(dag.edges()) == [(0, 1)]
    assert can_fuse(a, b, dag) == (True, "same iteration space")


def test_a_consumer_reading_other_elements_of_a_producer_is_not_fused() -> None:
    a = FusedGroup(0, [_buffer("buf0", ["arg0"])])
    i0, i1 = dim_symbols(2)
    shifted = _buffer("buf1", ["arg0"])
    shifted = ComputedBuffer(  # reads buf0 one row down: another point of the space
        "buf1", shifted.layout, Load("buf0", 8 * ((i0 + 1) % 4) + i1, torch.float32)
    )
    b = FusedGroup(1, [shifted])
    ok, reason = can_fuse(a, b, dependency_graph([a, b]))
    assert not ok and reason == "buf1 reads buf0 at other points of the space"


def test_fusing_that_would_make_a_cycle_is_refused() -> None:
    # buf0 -> buf1 -> buf2, and buf0 -> buf2: merging buf0 with buf2 would put buf1 on a
    # cycle.
    a = FusedGroup(0, [_buffer("buf0", ["arg0"])])
    mid = FusedGroup(1, [_buffer("buf1", ["buf0"], shape=(2, 8))])
    c = FusedGroup(2, [_buffer("buf2", ["arg0", "buf1"])])
    dag = dependency_graph([a, mid, c])
    ok, reason = can_fuse(a, c, dag)
    assert not ok and reason == "fusing would create a cycle"


def test_different_devices_do_not_fuse() -> None:
    a = FusedGroup(0, [_buffer("buf0", ["arg0"])])
    b = FusedGroup(1, [_buffer("buf1", ["arg0"], device=torch.device("cuda"))])
    assert can_fuse(a, b, dependency_graph([a, b])) == (False, "different devices")


def test_score_counts_shared_loads() -> None:
    a = FusedGroup(0, [_buffer("buf0", ["arg0", "arg1"])])
    b = FusedGroup(1, [_buffer("buf1", ["arg1", "arg2"])])
    c = FusedGroup(2, [_buffer("buf2", ["arg3"])])
    assert score_fusion(a, b) == 1
    assert score_fusion(a, c) == 0


def test_fuse_returns_groups_in_dependency_order() -> None:
    from minicompile.ir import InputBuffer, LoopProgram

    inp = InputBuffer("arg0", _buffer("x", ["arg0"]).layout)
    # buf1 reads buf0 but is listed first.
    program = LoopProgram([inp], [_buffer("buf1", ["buf0"]), _buffer("buf0", ["arg0"])],
                          ["buf1"])
    groups = fuse(program)
    order = [buf.name for g in groups for buf in g.buffers]
    assert order.index("buf0") < order.index("buf1")


def test_random_library_calls_keep_their_program_order() -> None:
    # Two dropouts that nothing orders: an edge from the first to the second keeps the
    # generator's draws in eager's order.
    drop = ops.extern_op(torch.nn.functional.dropout)
    b = GraphBuilder()
    x, y = b.input("L_x", (4, 8)), b.input("L_y", (4, 8))
    b.output(b(drop, b("sin", y), 0.5, True, False), b(drop, x, 0.5, True, False))
    program = lowered(b)
    groups = [FusedGroup(k, [buf]) for k, buf in enumerate(program.buffers)]
    randoms = [g.key for g in groups if g.extern is not None and g.extern.op == drop]
    assert len(randoms) == 2 and dependency_graph(groups).has_edge(*randoms)
