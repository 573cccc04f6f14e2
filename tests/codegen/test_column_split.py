"""Column reductions split along their reduced points (codegen/cpp_column_split.py): where the
blocks of columns leave threads idle, chunks of the reduced points are shared among them, and
the results match eager for every reduction op, with outputs per element after them, on
two calls with fresh inputs and on 1 and 2 threads."""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F
from graph_builder import GraphBuilder, compile_graph_text
from minicompile.codegen import cpp_threads

import minicompile


def kernels(b: GraphBuilder) -> list[str]:
    source = compile_graph_text(b.graph, "cpp").code.cpp_source
    return re.findall(r'extern "C" void \w+\(.*?\n\}\n', source, re.DOTALL)


def column_sum(rows: int, columns: int) -> GraphBuilder:
    b = GraphBuilder()
    b.output(b("sum", b.input("L_x", (rows, columns)), [0], False))
    return b


def test_narrow_columns_split_their_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    """32 columns are one block: on 16 threads the 4096 rows are cut into chunks shared
    among them; 2048 columns (32 blocks) already have work for each thread."""
    monkeypatch.setattr(cpp_threads, "planned_threads", lambda: 16)
    (kernel,) = kernels(column_sum(4096, 32))
    assert "the reduced points in 64 chunks of 64" in kernel
    assert "#pragma omp parallel for\n        for (int64_t chunk = 0; chunk < 64;" in kernel
    (kernel,) = kernels(column_sum(4096, 2048))
    assert "chunk" not in kernel and "#pragma omp parallel for" in kernel


def test_small_columns_stay_on_one_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpp_threads, "planned_threads", lambda: 16)
    (kernel,) = kernels(column_sum(64, 32))  # (too little work to share)
    assert "chunk" not in kernel and "#pragma omp parallel" not in kernel


def test_blocks_with_little_work_each_are_not_split(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each block of columns runs the split kernel's parallel loops (one a reduction batch,
    one for the outputs per element): a mobilenet_v2 batch norm's 384 channels of 32 pixels
    (6 blocks) made 18 OpenMP regions of 2 chunks, 140 us on 16 threads for 12,288
    elements.  Too little work a block, or no more chunks than blocks (already shared in one
    loop), keeps the column kernel."""
    monkeypatch.setattr(cpp_threads, "planned_threads", lambda: 16)
    b = GraphBuilder()
    x = b.input("L_x", torch.empty(2, 384, 4, 4).to(memory_format=torch.channels_last))
    centred = b("sub", x, b("truediv", b("sum", x, [0, 2, 3], True), 32))
    var = b("truediv", b("sum", b("mul", centred, centred), [0, 2, 3], True), 32)
    normal = b("add", b("mul", b("mul", centred, b("rsqrt", b("add", var, 1e-5))), 0.5), 0.1)
    w, bias = b.input("L_w", (1, 384, 1, 1)), b.input("L_b", (1, 384, 1, 1))
    b.output(b("clamp", b("add", b("mul", normal, w), bias), 0.0, 6.0), var)
    (kernel,) = kernels(b)
    assert "chunk" not in kernel and kernel.count("#pragma omp parallel") <= 1
    b = GraphBuilder()
    y = b.input("L_x", (48, 192))  # 3 blocks, 3 chunks of 16 rows (costly math: much work)
    for op in ["exp", "sin", "cos", "tanh", "sigmoid", "erf", "log1p", "exp2", "expm1", "sin"]:
        y = b(op, y)
    b.output(b("sum", y, [0], False))
    (kernel,) = kernels(b)
    assert "chunk" not in kernel and kernel.count("#pragma omp parallel for") == 1


def normalized(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Reductions over dim 0, then a value per element that reads them."""
    mean = x.mean(0)
    return mean, x - mean, x.amax(0), x.amin(0), (x * 0.001 + 1).prod(0), (x > 2).any(0), \
        (x > -4).all(0)


def batch_norm_silu(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.silu(F.batch_norm(x, None, None, w, b, training=True))


def int_sums(x: torch.Tensor) -> torch.Tensor:
    return x.sum(0)


def rows(shape: tuple, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    if not dtype.is_floating_point:
        return torch.randint(-50, 50, shape, dtype=dtype)
    return torch.randn(shape, dtype=dtype)


@pytest.mark.parametrize("threads", [1, 2])
def test_split_columns_match_eager(threads: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpp_threads, "planned_threads", lambda: 4)
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for fn, make in [
            (normalized, lambda: (rows((3000, 40)),)),
            (normalized, lambda: (rows((2500, 24), torch.float64),)),
            (int_sums, lambda: (rows((5000, 20), torch.int64),)),
            (batch_norm_silu, lambda: (torch.randn(2, 32, 32, 32).to(
                memory_format=torch.channels_last), torch.randn(32), torch.randn(32))),
        ]:
            compiled = minicompile.compile(fn, backend="cpp")
            for call in range(2):
                args = make()
                if call and fn is normalized:
                    args[0][7, 3] = float("nan")  # max and min propagate it
                expected, got = fn(*args), compiled(*args)
                for e, g in zip(*(v if isinstance(v, tuple) else (v,) for v in (expected, got))):
                    assert g.dtype == e.dtype and g.stride() == e.stride()
                    torch.testing.assert_close(g, e, equal_nan=True, rtol=1e-5, atol=1e-5)
        assert minicompile.stats()["eager_fallbacks"] == 0  # (the values alone would pass)
    finally:
        torch.set_num_threads(saved)


def test_the_split_kernel_runs_in_the_model(monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture) -> None:
    """A channels-last batch norm's statistics take the split kernel (the generated code)."""
    monkeypatch.setattr(cpp_threads, "planned_threads", lambda: 4)
    with minicompile.config.patch(logs=frozenset({"output_code"})):
        compiled = minicompile.compile(batch_norm_silu, backend="cpp")
        x = torch.randn(2, 32, 32, 32).to(memory_format=torch.channels_last)
        compiled(x, torch.randn(32), torch.randn(32))
    assert "shared among threads; each chunk's partials combined" in capsys.readouterr().err


def transposed_layer_norm(a: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.layer_norm(a.transpose(1, 2), (a.shape[1],), w, b)


def test_a_split_kernel_writes_its_per_element_output(monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture) -> None:
    """A layer norm of rows stored transposed (as mlp_mixer's first one, longer): its
    statistics are column sums over one block of 16 columns, split on 16 planned threads,
    and the normalised output is written in the same kernel, per element (a TypeError there
    once made it run eagerly, with the right values).  (mlp_mixer's own, 512 long in 2
    blocks, is too little work to split.)"""
    monkeypatch.setattr(cpp_threads, "planned_threads", lambda: 16)
    with minicompile.config.patch(logs=frozenset({"output_code"})):
        compiled = minicompile.compile(transposed_layer_norm, backend="cpp")
        for _ in range(2):  # fresh values each call
            args = torch.randn(1, 8192, 16), torch.randn(8192), torch.randn(8192)
            torch.testing.assert_close(compiled(*args), transposed_layer_norm(*args),
                                       rtol=1e-5, atol=1e-5)
    assert minicompile.stats()["eager_fallbacks"] == 0
    assert "shared among threads; each chunk's partials combined" in capsys.readouterr().err
