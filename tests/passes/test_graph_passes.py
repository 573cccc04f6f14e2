"""Graph passes, text in and text out: decompose, CSE, DCE; ``verify()`` after each pass;
no pass mutates its input."""

from __future__ import annotations

import textwrap

import pytest
import torch

import minicompile

from minicompile import ops
from minicompile.errors import SourceLine
from minicompile.graph import Graph
from minicompile.passes.cleanup import eliminate_common_subexpressions, eliminate_dead_code
from minicompile.passes.decompose import DECOMPOSITIONS, decompose
from minicompile.passes.pipeline import GRAPH_PASSES, run_graph_passes

from graph_builder import GraphBuilder


def text(s: str) -> str:
    return textwrap.dedent(s).strip("\n")


def one_op(op: str, dtype: torch.dtype = torch.float32, **kwargs: object) -> Graph:
    b = GraphBuilder()
    x = b.input("L_x", (4, 8), dtype)
    return b.output(b(op, x, **kwargs))


def run_pass(graph_pass, graph: Graph) -> Graph:
    """Apply ``graph_pass``; check it verified and left its input unchanged."""
    before = str(graph)
    out = graph_pass(graph)
    out.verify()
    assert str(graph) == before, f"{graph_pass.__name__} mutated its input"
    return out


# -- decompose -------------------------------------------------------------------------------


def test_decompose_relu() -> None:
    assert str(run_pass(decompose, one_op("relu"))) == text("""
        graph(L_x: f32[4, 8]):
            %0 = placeholder L_x : f32[4, 8]
            %1 = lt(%0, 0) : b8[4, 8]
            %2 = where(%1, 0, %0) : f32[4, 8]
            return (%2,)
    """)


def test_decompose_gelu_erf() -> None:
    assert str(run_pass(decompose, one_op("gelu"))) == text("""
        graph(L_x: f32[4, 8]):
            %0 = placeholder L_x : f32[4, 8]
            %1 = mul(%0, 0.7071067811865476) : f32[4, 8]
            %2 = erf(%1) : f32[4, 8]
            %3 = add(%2, 1.0) : f32[4, 8]
            %4 = mul(%3, 0.5) : f32[4, 8]
            %5 = mul(%0, %4) : f32[4, 8]
            return (%5,)
    """)


def test_decompose_gelu_tanh_in_float16_uses_opmath() -> None:
    out = str(run_pass(decompose, one_op("gelu", torch.float16, approximate="tanh")))
    lines = out.splitlines()
    assert "to_dtype(%0, dtype=torch.float32) : f32[4, 8]" in lines[2]
    assert "tanh(" in out and "0.044715" in out and "erf" not in out
    assert "dtype=torch.float16) : f16[4, 8]" in lines[-2]  # one rounding, at the end
    assert sum("to_dtype" in line for line in lines) == 2


def test_decompose_silu() -> None:
    assert str(run_pass(decompose, one_op("silu"))) == text("""
        graph(L_x: f32[4, 8]):
            %0 = placeholder L_x : f32[4, 8]
            %1 = neg(%0) : f32[4, 8]
            %2 = exp(%1) : f32[4, 8]
            %3 = add(%2, 1.0) : f32[4, 8]
            %4 = truediv(%0, %3) : f32[4, 8]
            return (%4,)
    """)


def test_decompose_clamp() -> None:
    assert str(run_pass(decompose, one_op("clamp", min=-1.0, max=1.0))) == text("""
        graph(L_x: f32[4, 8]):
            %0 = placeholder L_x : f32[4, 8]
            %1 = lt(%0, -1.0) : b8[4, 8]
            %2 = where(%1, -1.0, %0) : f32[4, 8]
            %3 = gt(%2, 1.0) : b8[4, 8]
            %4 = where(%3, 1.0, %2) : f32[4, 8]
            return (%4,)
    """)


def test_decompose_clamp_one_sided() -> None:
    out = str(run_pass(decompose, one_op("clamp", torch.int32, max=3)))
    assert "gt(%0, 3)" in out and "lt(" not in out


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("op", sorted(DECOMPOSITIONS))
def test_decompose_leaves_only_prims_and_keeps_meta(op: str, dtype: torch.dtype) -> None:
    kwargs = {"min": -0.5, "max": 0.5} if op == "clamp" else {}
    g = one_op(op, dtype, **kwargs)
    out = run_pass(decompose, g)
    assert all(ops.OPS[n.target].family != "composite" for n in out.calls())
    assert out.outputs[0].meta == g.outputs[0].meta  # same dtype, shape, stride


def test_decompose_keeps_source_lines() -> None:
    b = GraphBuilder()
    x = b.input("L_x", (4,))
    src = SourceLine("/tmp/m.py", 7, "f", "y = F.silu(x)")
    g = b.output(b("silu", x, stack=(src,)))
    out = run_pass(decompose, g)
    assert all(n.stack == (src,) for n in out.calls())
    assert "m.py:7  y = F.silu(x)" in str(out)


def test_every_composite_op_has_a_decomposition() -> None:
    composite = {n for n, d in ops.OPS.items() if d.family == "composite"}
    assert composite == set(DECOMPOSITIONS)


# -- CSE and DCE ----------------------------------------------------------------------------


def test_cse_computes_a_duplicate_once() -> None:
    b = GraphBuilder()
    x = b.input("L_x", (4, 8))
    g = b.output(b("add", b("sin", x), b("sin", x)))
    assert str(run_pass(eliminate_common_subexpressions, g)) == text("""
        graph(L_x: f32[4, 8]):
            %0 = placeholder L_x : f32[4, 8]
            %1 = sin(%0) : f32[4, 8]
            %2 = add(%1, %1) : f32[4, 8]
            return (%2,)
    """)


def test_cse_follows_chains() -> None:
    b = GraphBuilder()
    x = b.input("L_x", (4, 8))
    a1, a2 = b("exp", b("sin", x)), b("exp", b("sin", x))
    g = b.output(a1, a2)
    out = run_pass(eliminate_common_subexpressions, g)
    assert [n.target for n in out.calls()] == ["sin", "exp"]
    assert out.outputs[0] is out.outputs[1]


def test_cse_tells_constants_and_kwargs_apart() -> None:
    b = GraphBuilder()
    x = b.input("L_x", (4, 8))
    g = b.output(
        b("add", x, 1), b("add", x, 1.0), b("add", x, True),
        b("to_dtype", x, dtype=torch.float16), b("to_dtype", x, dtype=torch.bfloat16),
    )
    out = run_pass(eliminate_common_subexpressions, g)
    assert len(list(out.calls())) == 5


def test_cse_keeps_different_inputs_apart() -> None:
    b = GraphBuilder()
    x, y = b.input("L_x", (4, 8)), b.input("L_y", (4, 8))
    g = b.output(b("sin", x), b("sin", y))
    assert len(list(run_pass(eliminate_common_subexpressions, g).calls())) == 2


def test_dce_drops_unused_calls_and_keeps_placeholders() -> None:
    b = GraphBuilder()
    x, unused = b.input("L_x", (4, 8)), b.input("L_unused", (2,))
    b("cos", b("exp", x))  # dead chain
    b("neg", unused)  # dead, on an otherwise unused input
    g = b.output(b("sin", x))
    assert str(run_pass(eliminate_dead_code, g)) == text("""
        graph(L_x: f32[4, 8], L_unused: f32[2]):
            %0 = placeholder L_x : f32[4, 8]
            %1 = placeholder L_unused : f32[2]
            %2 = sin(%0) : f32[4, 8]
            return (%2,)
    """)


def test_random_calls_are_neither_merged_nor_dropped() -> None:
    drop = ops.extern_op(torch.nn.functional.dropout)
    b = GraphBuilder()
    x = b.input("L_x", (4, 8))
    b(drop, x, 0.5, True, False)  # unused: it still advances the generator
    g = b.output(b("add", b(drop, x, 0.5, True, False), b(drop, x, 0.5, True, False)))
    out = run_pass(eliminate_dead_code, run_pass(eliminate_common_subexpressions, g))
    assert [n.target for n in out.calls()] == [drop, drop, drop, "add"]


def _dead_extern(fn, *inputs: tuple[tuple[int, ...], torch.dtype], derived: bool = False,
                 **kwargs: object) -> list[str]:
    """The calls left by DCE of a graph that calls ``fn`` on placeholders and returns
    its first input plus one."""
    b = GraphBuilder()
    b.graph.derived = derived
    xs = [b.input(f"L_x{k}", shape, dtype) for k, (shape, dtype) in enumerate(inputs)]
    b(ops.extern_op(fn), *xs, **kwargs)  # unused
    g = b.output(b("add", xs[0], 1))
    return [n.target for n in run_pass(eliminate_dead_code, g).calls()]


def test_dce_keeps_unused_library_calls_that_may_raise() -> None:
    f32, b8 = torch.float32, torch.bool
    # Raises only on sizes and dtypes that capture checks: dropped, no kernel.
    assert _dead_extern(torch.mm, ((2, 3), f32), ((3, 4), f32)) == ["add"]
    assert _dead_extern(torch.nn.functional.linear, ((2, 3), f32), ((4, 3), f32)) == ["add"]
    assert _dead_extern(torch.flip, ((2, 3), f32), dims=[0]) == ["add"]
    # A bool matmul raises in eager though its meta kernel accepts it: kept.
    assert _dead_extern(torch.mm, ((2, 3), b8), ((3, 4), b8)) == ["torch.mm", "add"]
    # Sizes the meta kernels accept but eager refuses (max of an empty tensor, a bias that
    # does not broadcast), or values (a matrix that is not positive definite): kept.
    assert _dead_extern(torch.max, ((0,), f32)) == ["torch.max", "add"]
    linear = "torch.nn.functional.linear"
    try:
        kept = _dead_extern(torch.nn.functional.linear, ((2, 1), f32), ((1, 1), f32),
                            ((3,), f32))
    except RuntimeError as e:  # PyTorch 2.15's meta kernel refuses that bias, as eager does
        assert "expanded size" in str(e)
    else:  # up to 2.14 the meta kernel accepts it
        assert kept == [linear, "add"]
    cholesky = ops.extern_op(torch.linalg.cholesky)
    assert _dead_extern(torch.linalg.cholesky, ((3, 3), f32)) == [cholesky, "add"]
    # In a graph the compiler made (a backward), an unused library call is dropped.
    assert _dead_extern(torch.linalg.cholesky, ((3, 3), f32), derived=True) == ["add"]


def test_dce_of_a_clean_graph_changes_nothing() -> None:
    g = one_op("sin")
    assert str(run_pass(eliminate_dead_code, g)) == str(g)


def test_cse_then_dce_after_decompose() -> None:
    # gelu(x) and gelu(x) again: decomposed twice, then shared by CSE, nothing left dead.
    b = GraphBuilder()
    x = b.input("L_x", (4, 8))
    g = b.output(b("add", b("gelu", x), b("gelu", x)))
    out, timings = run_graph_passes(g, verify=True)
    assert set(timings) == {p.__name__ for p in GRAPH_PASSES}
    targets = [n.target for n in out.calls()]
    assert targets.count("erf") == 1 and targets[-1] == "add"
    assert "gelu" not in targets


# -- verify ----------------------------------------------------------------------------------


def mixed_graph() -> Graph:
    b = GraphBuilder()
    x = b.input("L_x", (4, 1, 8))
    y = b.input("L_y", (5, 1), torch.float16)
    c = b.input("L_c", (5, 8), torch.bool)
    a = b("gelu", b("add", x, y))
    d = b("where", c, b("clamp", a, min=0.0), b("silu", x))
    b("relu", d)  # dead
    return b.output(d, b("permute", a, (2, 0, 1)), b("to_dtype", d, dtype=torch.int32))


@pytest.mark.parametrize("graph_pass", GRAPH_PASSES, ids=lambda p: p.__name__)
def test_each_pass_keeps_the_invariants(graph_pass) -> None:
    g = mixed_graph()
    run_pass(graph_pass, g)


def test_pipeline_verifies_after_every_pass() -> None:
    g = mixed_graph()
    out, _ = run_graph_passes(g, verify=True)
    assert "relu" not in str(out) and "gelu" not in str(out)


def test_verify_catches_a_broken_graph() -> None:
    g = one_op("sin")
    g.nodes[1].users.clear()  # the sin node forgets its user
    g.nodes[0].users.clear()  # the input forgets the sin
    with pytest.raises(AssertionError, match="does not list its user"):
        g.verify()
    g = one_op("sin")
    g.nodes[0], g.nodes[1] = g.nodes[1], g.nodes[0]  # use before definition
    with pytest.raises(AssertionError):
        g.verify()
    g = one_op("sin")
    g.nodes[1].meta = None
    with pytest.raises(AssertionError, match="no meta"):
        g.verify()


def test_graph_text_is_stable() -> None:
    assert str(mixed_graph()) == str(mixed_graph())
    g = mixed_graph()
    assert [n.index for n in g.nodes] == list(range(len(g.nodes)))


def test_embedding_with_padding_idx_is_a_gather_without_gradient(backend: str) -> None:
    """nn.Embedding(padding_idx=...) (RoBERTa's word and position embeddings): in inference
    a gather fused into the kernel after it; where the weight takes a gradient, the library
    call (the padding row's gradient is zero in eager's backward)."""
    from devices import device_for

    device = device_for(backend)
    emb = torch.nn.Embedding(11, 6, padding_idx=1).to(device)

    def fn(ids, x):  # noqa: ANN001, ANN202
        return emb(ids) * 2 + x

    compiled = minicompile.compile(fn, backend=backend)
    with torch.no_grad():
        for _ in range(2):
            ids, x = torch.randint(0, 11, (3, 4), device=device), torch.randn(3, 4, 6, device=device)
            torch.testing.assert_close(compiled(ids, x), fn(ids, x))
    stats = minicompile.stats()
    assert (stats["kernels"], stats["eager_fallbacks"]) == (1, 0), stats
    trained = minicompile.compile(fn, backend=backend)
    ids, x = torch.tensor([[1, 2, 1]], device=device), torch.randn(1, 3, 6, device=device)
    trained(ids, x).sum().backward()
    got, emb.weight.grad = emb.weight.grad, None
    fn(ids, x).sum().backward()
    torch.testing.assert_close(got, emb.weight.grad)
    assert got[1].abs().sum() == 0  # the padding row


def test_a_cat_drops_the_legacy_empty_piece_and_what_made_it(
        capsys: pytest.CaptureFixture) -> None:
    """transformers' DynamicLayer starts its keys as ``torch.tensor([])`` and cats the new
    ones after it (eager's cat skips a legacy empty 1-d piece): the piece leaves the cat and
    the ``torch.tensor`` call is dead code, not a library call each step.  A piece of
    another dtype takes part in the type promotion: it stays."""
    def f(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        keys = torch.tensor([], dtype=x.dtype, device=x.device)
        wide = torch.tensor([], dtype=torch.float64)
        return torch.cat([keys, x * 2], dim=-2), torch.cat([wide, x], dim=-1)

    compiled = minicompile.compile(f, backend="cpp")
    with minicompile.config.patch(logs=frozenset({"output_code"})):
        for _ in range(2):
            x = torch.randn(2, 3, 4)
            for got, want in zip(compiled(x), f(x), strict=True):
                torch.testing.assert_close(got, want)
                assert got.dtype == want.dtype
    calls = [line for line in capsys.readouterr().err.splitlines()
             if "torch.tensor(" in line and not line.lstrip().startswith("#")]
    assert len(calls) == 1 and "float64" in calls[0]  # the float64 piece's
    assert minicompile.stats()["eager_fallbacks"] == 0
