"""Split reductions (passes/split_reductions.py): on CUDA a reduction over few outputs
becomes a reduction into partial results and a small one over them.  The rewritten graph
is evaluated op by op with PyTorch (on the CPU) against the original."""

from __future__ import annotations

import pytest
import torch

from minicompile import ops
from minicompile.codegen import triton_reduction
from minicompile.graph import Graph
from minicompile.passes.split_reductions import split_factor, split_reductions

from graph_builder import GraphBuilder, compile_graph_text


def evaluate(graph: Graph, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    """Run ``graph`` node by node with PyTorch's own ops, on the CPU."""
    env = dict(zip(graph.placeholders, inputs))

    def value(a: object) -> object:
        return env[a] if a in env else a

    for node in graph.nodes:
        if node.op == "call":
            args = tuple(value(a) for a in node.args)
            env[node] = ops.run_eager(node.target, args, dict(node.kwargs))
    return [env[n] for n in graph.outputs]


def reduction(op: str, shape: tuple, dims: tuple, keepdim: bool = False,
              device: str = "cuda", dtype: torch.dtype = torch.float32) -> Graph:
    b = GraphBuilder(device)
    x = b.input("L_x", shape, dtype)
    return b.output(b(op, b("mul", x, x), dims, keepdim))


CASES = [
    ("sum", (4096, 512), (0,), False),  # a bias gradient
    ("sum", (16, 256, 512), (0, 1), True),  # a layer-norm weight gradient, keepdim
    ("amax", (2048, 8, 64), (0,), False),
    ("sum", (8, 1 << 16), (1,), False),  # a few long rows
    ("sum", (512, 1024), (0, 1), False),  # everything into one
    ("sum", (64, 64, 256), (0, 2), False),  # outer and inner dims: permuted first
]


@pytest.mark.parametrize("op, shape, dims, keepdim", CASES, ids=[str(c[1:3]) for c in CASES])
def test_split_reduction_computes_the_same(op: str, shape: tuple, dims: tuple,
                                           keepdim: bool) -> None:
    graph = reduction(op, shape, dims, keepdim)
    split = split_reductions(graph)
    targets = [n.target for n in split.nodes if n.op == "call"]
    assert targets.count(op) == 2, targets
    (out,) = split.outputs
    (want,) = graph.outputs
    assert (out.meta.shape, out.meta.stride) == (want.meta.shape, want.meta.stride)
    for seed in (0, 1):  # two sets of values
        torch.manual_seed(seed)
        x = torch.randn(shape)
        torch.testing.assert_close(evaluate(split, [x])[0], evaluate(graph, [x])[0],
                                   rtol=1e-5, atol=1e-3)


def test_what_is_left_alone() -> None:
    many_rows = reduction("sum", (4096, 512), (1,))  # 4096 outputs: enough programs
    small = reduction("sum", (64, 512), (0,))  # too little work to split
    on_cpu = reduction("sum", (4096, 512), (0,), device="cpu")
    half = reduction("sum", (4096, 512), (0,), dtype=torch.bfloat16)  # partials would round
    for graph in (many_rows, small, on_cpu, half):
        split = split_reductions(graph)
        assert [n.target for n in split.nodes] == [n.target for n in graph.nodes]


def test_split_factor_aims_at_enough_partial_results() -> None:
    assert split_factor(4096, 512, column=True) == 64  # 64 chunks of 64 rows
    assert split_factor(32768, 8192, column=True) == 4
    assert split_factor(1 << 20, 1, column=False) == 1024
    assert split_factor(4096, 32768, column=True) == 1  # already enough outputs
    assert split_factor(4099, 512, column=True) == 1  # no power of two divides


def test_column_reductions_tile_outputs_by_rows() -> None:
    """A sum over the outer dim reads 64 neighbouring outputs per row (coalesced), split
    into 64 chunks: 512 programs, then 8 for the partials."""
    module = compile_graph_text(split_reductions(reduction("sum", (4096, 512), (0,))),
                                "triton").code.module
    assert ("Launcher(triton_red_mul_reshape_sum_0, (0,), (), (torch.float32, torch.float32, "
            "32768, 64), XBLOCK=64, RBLOCK=64, num_warps=8)") in module
    assert "triton_red_mul_reshape_sum_0_launch(512, arg0, buf0, 32768, 64)" in module
    assert "triton_red_sum_1_launch(8, buf0, buf1, 512, 64)" in module
    assert triton_reduction.reduction_blocks(512, 4096, False, column=True) == (64, 64, 8, False)
    assert triton_reduction.reduction_blocks(512, 4096, False) == (1, 4096, 8, True)  # rows


def test_rows_gathered_by_an_embedding_are_reduced_along_the_row() -> None:
    """An embedding's index is one load per output (no move along the row), the gathered
    row is read along it: a row-wise (persistent) kernel, not the column tiling (which
    gave 16 programs for 1024 rows)."""
    b = GraphBuilder("cuda")
    idx = b.input("L_idx", (8, 128), torch.int64)
    table = b.input("L_table", (512, 256))
    rows = b("embedding", table, idx)
    module = compile_graph_text(b.output(b("sum", b("mul", rows, rows), (2,), True)),
                                "triton").code.module
    assert "XBLOCK=2, RBLOCK=256, num_warps=1," in module
    assert "triton_red_embedding_mul_sum_0_launch(512, arg0, arg1, buf0, 1024, 256)" in module
