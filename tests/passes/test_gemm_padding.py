"""passes/gemm_padding.py: products of odd rows written padded, read in place or copied
back to eager's strides, and left alone where that would not pay or is not allowed."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import minicompile
from minicompile import config
from minicompile.passes.gemm_padding import pad_gemm_results

from devices import device_for
from graph_builder import GraphBuilder


def _linear_graph(k: int, n: int, rows: int, then: str | None) -> GraphBuilder:
    b = GraphBuilder(torch.device("cpu"))
    x = b.input("L_x", (rows, k), torch.float32)
    w = b.input("L_w", (n, k), torch.float32)
    out = b("torch.nn.functional.linear", x, w)
    b.output(b(then, out) if then else out)
    return b


def _padded(graph_text: str) -> bool:
    return "minicompile.runtime.gemm.linear" in graph_text


def test_fused_readers_read_padded_rows_and_outputs_are_copied_only_where_it_pays() -> None:
    fused = _linear_graph(16, 1001, 4, "sin").graph
    assert _padded(str(pad_gemm_results(fused, "on")[0]))  # no copy: always
    small = _linear_graph(16, 1001, 4, None).graph
    assert not _padded(str(pad_gemm_results(small, "on")[0]))  # a copy for a small product
    large = _linear_graph(128, 1001, 1100, None).graph
    padded = str(pad_gemm_results(large, "on")[0])
    assert _padded(padded) and "to_eager_layout" in padded
    aligned = _linear_graph(128, 1000, 1100, None).graph
    assert pad_gemm_results(aligned, "on")[0] is aligned
    assert pad_gemm_results(large, "off")[0] is large
    assert pad_gemm_results(large, "auto")[0] is large  # (CPU, float32)


def test_padded_products_match_eager_with_eager_strides() -> None:
    def f(x, w, b, w2, m, bias2d):
        return (F.linear(x, w), F.gelu(F.linear(x, w, b)), torch.relu(x @ w2).sum(-1),
                torch.mm(m, w2).cos(), torch.addmm(b, m, w.t()).exp(),
                torch.addmm(bias2d, m, w2).tanh())

    compiled = minicompile.compile(f, backend="cpp")
    for _ in range(2):  # fresh values each call: nothing of the first call is baked in
        x, w, b = torch.randn(8, 160, 128), torch.randn(1001, 128), torch.randn(1001)
        w2, m, bias2d = torch.randn(128, 1003), torch.randn(33, 128), torch.randn(33, 1003)
        with config.patch(gemm_padding="on", logs=frozenset({"graph"})):
            got = compiled(x, w, b, w2, m, bias2d)
        want = f(x, w, b, w2, m, bias2d)
        for a, e in zip(got, want, strict=True):
            torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-4)
            assert a.stride() == e.stride()


def test_a_parameter_is_padded_once(backend: str, capsys: pytest.CaptureFixture) -> None:
    """A linear's weight and bias that are parameters are padded by passes/hoist_params.py's
    values, computed once: the graph that runs every call pads nothing."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 1001), torch.nn.GELU())
    model = model.to(device_for(backend))
    with config.patch(gemm_padding="on", logs=frozenset({"graph"})), torch.no_grad():
        compiled = minicompile.compile(model, backend=backend)
        for _ in range(2):
            x = torch.randn(4, 16, device=device_for(backend))
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)
            model[0].weight.mul_(0.5)
    err = capsys.readouterr().err
    main = err.split("after passes ========")[1]
    assert "minicompile.runtime.gemm.linear" in main and "pad_" not in main, main
    assert "minicompile.runtime.gemm.pad_rows" in err
