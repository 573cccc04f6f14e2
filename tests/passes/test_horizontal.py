"""Horizontal fusion (passes/horizontal.py) and the combo kernels it leads to
(codegen/combo.py): which groups combine, in what order, and the generated text."""

from __future__ import annotations

import ast

import pytest
import torch

from minicompile import ops
from minicompile.codegen.wrapper import generate
from minicompile.lowering import lower
from minicompile.passes import horizontal
from minicompile.passes.fusion import fuse
from minicompile.passes.pipeline import run_graph_passes
from minicompile.spaces import ComboGroup

from graph_builder import GraphBuilder


def independent(n: int, base: int = 3) -> GraphBuilder:
    """n outputs ``sin(x_k) * 2`` over inputs of n different shapes."""
    b = GraphBuilder()
    xs = [b.input(f"L_x{k}", (k + base, 5)) for k in range(n)]
    b.output(*[b("mul", b("sin", x), 2.0) for x in xs])
    return b


def grouped(b: GraphBuilder, log: list[str] | None = None):
    graph, _ = run_graph_passes(b.graph, verify=True)
    program = lower(graph)
    groups = fuse(program)
    return program, groups, horizontal.combine(groups, log)


def test_independent_groups_become_one_combo() -> None:
    log: list[str] = []
    _, groups, units = grouped(independent(3), log)
    assert len(groups) == 3
    assert len(units) == 1 and isinstance(units[0], ComboGroup)
    assert [p.name for p in units[0].parts] == ["buf0", "buf1", "buf2"]
    assert log == ["combine buf0 | buf1 | buf2: 3 independent pointwise groups"]


def test_combos_are_capped() -> None:
    _, _, units = grouped(independent(horizontal.MAX_PARTS + 3))
    assert [len(u.parts) for u in units] == [horizontal.MAX_PARTS, 3]


def test_reductions_stay_alone_and_order_is_kept() -> None:
    # sum(x, 1) is a reduction (fused with its epilogue); cos(u) and sin(v) are
    # independent pointwise groups and combine.
    b = GraphBuilder()
    x, w = b.input("L_x", (4, 6)), b.input("L_w", (4,))
    u, v = b.input("L_u", (7,)), b.input("L_v", (5, 3))
    y = b("sum", x, [1], False)
    b.output(b("add", b("mul", y, 2.0), w), b("cos", u), b("sin", v))
    log: list[str] = []
    _, _, units = grouped(b, log)
    assert any(line.endswith("a reduction keeps its own kernel") for line in log)
    combos = [u for u in units if isinstance(u, ComboGroup)]
    assert len(combos) == 1 and len(combos[0].parts) == 2
    # Every unit that reads another's buffer comes after it.
    position = {id(u): k for k, u in enumerate(units)}
    owner = {buf.name: u for u in units for buf in u.buffers}
    for unit in units:
        for buf in unit.buffers:
            for read in buf.reads():
                if read in owner and owner[read] is not unit:
                    assert position[id(owner[read])] < position[id(unit)]


@pytest.mark.parametrize("backend", ["triton", "cpp"])
def test_combo_kernel_text(backend: str) -> None:
    program, _, units = grouped(independent(3, base=30))
    code = generate(program, units, backend, graph_name="three")
    assert len(code.kernels) == 1 and "combo" in code.kernels[0]
    ast.parse(code.module)
    if backend == "triton":
        text = code.module
        assert "pid = tl.program_id(0)" in text
        assert "if pid < 1:" in text and "elif pid < 2:" in text and "elif pid < 3:" in text
        assert "xoffset = (pid - 2) * XBLOCK" in text
        assert "xmask = xindex < 160" in text  # part 2: 32 * 5 elements, masked
        assert "[(3,)](" in text  # one program per part at these sizes
    else:
        text = code.cpp_source
        assert text.count("// part ") == 3
        assert "for (int64_t x0 = 0; x0 < 155; ++x0)" in text
    assert "part 0: 150 elements (buf0)" in text


def test_groups_that_cannot_join() -> None:
    b = GraphBuilder()
    x = b.input("L_x", (4, 6))
    b.output(b("sum", x, [1], False))
    _, groups, _ = grouped(b)
    ok, reason = horizontal.can_join(groups[0])
    assert not ok and reason == "a reduction keeps its own kernel"


def test_a_combo_runs_before_what_reads_its_parts() -> None:
    # sin(x) feeds a library matmul whose result feeds cos; sin(u) is independent.  The
    # two sines combine (level 0); the matmul and cos follow the combo.
    b = GraphBuilder()
    x, m, u = b.input("L_x", (4, 6)), b.input("L_m", (6, 3)), b.input("L_u", (9,))
    b.output(b("cos", b(ops.extern_op(torch.mm), b("sin", x), m)), b("sin", u))
    _, _, units = grouped(b)
    kinds = [type(unit).__name__ if unit.extern is None else "extern" for unit in units]
    assert kinds == ["ComboGroup", "extern", "FusedGroup"]


def test_hundreds_of_independent_updates_schedule_quickly() -> None:
    # 240 inputs of 12 shapes: vertical fusion merges the outputs of one shape (siblings),
    # horizontal fusion combines the 12 groups of 40 pointers each two by two (MAX_ARGS).
    # Fusion considers each pair once per version of its groups: about a second.
    import time

    b = GraphBuilder()
    xs = [b.input(f"L_x{k}", (k % 12 + 2, 3)) for k in range(240)]
    b.output(*[b("mul", b("sin", x), 2.0) for x in xs])
    start = time.perf_counter()
    _, groups, units = grouped(b)
    assert len(groups) == 12
    assert [len(u.parts) for u in units] == [2] * 6
    assert time.perf_counter() - start < 20
