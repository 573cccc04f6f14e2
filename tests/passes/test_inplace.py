"""In-place stores (passes/inplace.py): which write-backs a kernel may store straight into
the mutated input, the reason when not, and the wrapper and kernel text that follow."""

from __future__ import annotations

import pytest
import torch

from minicompile import ops
from minicompile.codegen.wrapper import generate
from minicompile.lowering import lower
from minicompile.passes.fusion import fuse
from minicompile.passes.inplace import stores_in_place
from minicompile.passes.pipeline import run_graph_passes

from graph_builder import GraphBuilder


def planned(b: GraphBuilder, writebacks: tuple):
    graph, _ = run_graph_passes(b.graph, verify=True)
    program = lower(graph)
    groups = fuse(program)
    log: list[str] = []
    return program, groups, stores_in_place(program, groups, writebacks, log), log


def test_an_elementwise_update_is_stored_in_place() -> None:
    b = GraphBuilder()
    x, g = b.input("L_x", (4, 8)), b.input("L_g", (4, 8))
    b.output(b("add", x, b("mul", g, 0.5)))  # x.add_(g * 0.5): output 0 back into input 0
    program, groups, chosen, log = planned(b, ((0, 0),))
    assert chosen == {"buf0": "arg0"} and log == ["store buf0 into arg0"]
    code = generate(program, groups, "cpp", in_place=chosen)
    assert "buf0 = arg0  # stored in place" in code.module
    assert "empty_strided_cpu((4, 8)" not in code.module  # (CPU buffers)
    # arg0 is read through the output's pointer: no two parameters alias.
    assert "const float* __restrict__ in_ptr0, float* __restrict__ out_ptr0)" in code.cpp_source
    assert "float tmp0 = out_ptr0[x0];" in code.cpp_source


def read_by_a_library_call(b: GraphBuilder) -> None:
    x, m = b.input("L_x", (4, 8)), b.input("L_m", (8, 3))
    b.output(b("mul", x, 2.0), b(ops.extern_op(torch.mm), x, m))  # mm reads the old x


def kernel_with_a_reduction(b: GraphBuilder) -> None:
    x = b.input("L_x", (4, 8))
    b.output(b("mul", x, 2.0), b("sum", x, [1], False))  # one kernel with the row sums


def read_of_other_elements(b: GraphBuilder) -> None:
    y = b.input("L_y", (4, 4))
    b.output(b("add", y, b("permute", y, [1, 0])))  # y.add_(y.t()): reads y[j, i]


def value_also_returned(b: GraphBuilder) -> None:
    x = b.input("L_x", (4, 8))
    y = b("mul", x, 2.0)
    b.output(y, y)  # written back, and returned as a tensor of its own


REFUSED = [
    (read_by_a_library_call, "copy buf1 back into arg0: library call buf0 reads the input"),
    (kernel_with_a_reduction,
     "copy buf1 back into arg0: not made by a pointwise kernel or a library call"),
    (read_of_other_elements, "copy buf0 back into arg0: buf0 reads other elements of the input"),
    (value_also_returned, "copy buf0 back into arg0: the value is also returned"),
]


@pytest.mark.parametrize(("build", "reason"), REFUSED, ids=lambda v: getattr(v, "__name__", ""))
def test_write_backs_that_keep_the_copy(build, reason: str) -> None:
    b = GraphBuilder()
    build(b)
    _, _, chosen, log = planned(b, ((0, 0),))
    assert chosen == {} and log == [reason]


def cache_update(b: GraphBuilder, read_after: bool = False, source_is_cache: bool = False):
    """A KV cache's ``cache.index_copy_(1, at, k)``, then attention-like reads of the new
    cache (``read_after``: of the old one too, after the update)."""
    cache, at = b.input("L_cache", (2, 6, 4)), b.input("L_at", (1,), torch.int64)
    k = b.input("L_k", (2, 1, 4))
    src = b(ops.extern_op(torch.narrow), cache, 1, 0, 1) if source_is_cache else k
    new = b(ops.extern_op(torch.Tensor.index_copy), cache, 1, at, src)
    scores = b(ops.extern_op(torch.bmm), k, b("permute", new, [0, 2, 1]))
    if read_after:
        scores = b("add", scores, b("sum", b(ops.extern_op(torch.bmm), k,
                                            b("permute", cache, [0, 2, 1])), [2], True))
    b.output(new, scores)


def test_a_library_update_is_called_in_place_on_the_input() -> None:
    b = GraphBuilder()
    cache_update(b)
    program, groups, chosen, log = planned(b, ((0, 0),))
    assert chosen == {"buf0": "arg0"} and log == ["store buf0 into arg0"]
    module = generate(program, groups, "cpp", in_place=chosen).module
    assert "torch.Tensor.index_copy_(arg0, 1, arg1, arg2)  # in place" in module
    assert "buf0 = arg0" in module and "torch.Tensor.index_copy(" not in module


@pytest.mark.parametrize(("options", "reason"), [
    ({"read_after": True}, "copy buf0 back into arg0: buf2 reads the input after the library call"),
    ({"source_is_cache": True},
     "copy buf0 back into arg0: the library call reads the input in another argument too"),
])
def test_library_updates_that_keep_the_copy(options: dict, reason: str) -> None:
    b = GraphBuilder()
    cache_update(b, **options)
    _, _, chosen, log = planned(b, ((0, 0),))
    assert chosen == {} and log == [reason]
