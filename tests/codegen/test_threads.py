"""The C++ backend's thread policy (codegen/cpp_threads.py): small kernels have no OpenMP
region, large ones share their outer loops (collapsed until every thread has work), the team
is torch's thread count at each call, and results match eager on 1 and 2 threads."""

from __future__ import annotations

import ctypes
import re

import torch

import minicompile
from minicompile import config
from minicompile.codegen import cpp_threads
from minicompile.runtime import build

from graph_builder import GraphBuilder, compile_graph_text


def kernel_text(b: GraphBuilder) -> str:
    """The one C++ kernel of ``b``'s graph."""
    source = compile_graph_text(b.graph, "cpp").code.cpp_source
    (kernel,) = re.findall(r'extern "C" void \w+\(.*?\n\}\n', source, re.S)
    return kernel


def pointwise(shape: tuple[int, ...], op: str = "neg") -> GraphBuilder:
    b = GraphBuilder()
    b.output(b(op, b.input("L_x", shape)))
    return b


def test_small_kernel_has_no_parallel_region() -> None:
    assert "#pragma omp parallel" not in kernel_text(pointwise((64, 64)))
    assert "#pragma omp parallel for simd" in kernel_text(pointwise((256, 256)))


def test_expensive_elements_parallelise_sooner() -> None:
    """8192 elements: a negation (a load, an op, a store) stays on one thread; tanh of
    exp of sin (three math functions an element) is worth a team."""
    assert "#pragma omp parallel" not in kernel_text(pointwise((8192,)))
    b = GraphBuilder()
    b.output(b("tanh", b("exp", b("sin", b.input("L_x", (8192,))))))
    assert "#pragma omp parallel for simd" in kernel_text(b)


def broadcast_add(batch: int) -> GraphBuilder:
    """[batch, 64, 1024] + [64, 1]: three loops (the bias broadcasts along the last)."""
    b = GraphBuilder()
    x, bias = b.input("L_x", (batch, 64, 1024)), b.input("L_b", (64, 1))
    b.output(b("add", x, bias))
    return b


def test_outer_loops_collapse_until_each_thread_has_work(monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setattr(cpp_threads, "planned_threads", lambda: 2)
    two = kernel_text(broadcast_add(2))
    assert "#pragma omp parallel for\n" in two + "\n" and "collapse" not in two
    monkeypatch.setattr(cpp_threads, "planned_threads", lambda: 16)
    assert "#pragma omp parallel for collapse(2)" in kernel_text(broadcast_add(2))
    # the innermost (simd) loop is never collapsed into the parallel one
    assert kernel_text(broadcast_add(2)).count("#pragma omp simd") == 1


def test_a_small_kernel_stays_on_one_thread_of_many(monkeypatch) -> None:  # noqa: ANN001
    """GPT-2's GELU over 24x256 (a tanh an element): worth two threads, not sixteen (each
    thread's share must be MIN_THREAD_WORK)."""
    def gelu() -> GraphBuilder:
        b = GraphBuilder()
        x = b.input("L_x", (24, 256))
        b.output(b("mul", x, b("tanh", b("add", x, b("mul", b("mul", x, x), x)))))
        return b

    monkeypatch.setattr(cpp_threads, "planned_threads", lambda: 2)
    assert "#pragma omp parallel" in kernel_text(gelu())
    monkeypatch.setattr(cpp_threads, "planned_threads", lambda: 16)
    assert "#pragma omp parallel" not in kernel_text(gelu())


def test_reduction_rows_and_columns_follow_the_policy(monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setattr(cpp_threads, "planned_threads", lambda: 16)
    for dim, shape, parallel in ((1, (8, 64), False), (1, (512, 512), True),
                                 (0, (512, 512), True), (0, (2048, 32), False)):
        b = GraphBuilder()
        b.output(b("sum", b.input("L_x", shape), (dim,), False))
        text = kernel_text(b)
        assert ("#pragma omp parallel for" in text) == parallel, (dim, shape, text)


def transposed_layer_norm(tokens: int = 16) -> GraphBuilder:
    """A layer norm of rows stored transposed (mlp_mixer's residual after its token mixer):
    row i's elements ``tokens`` apart, so 16 rows share each cache line of the output."""
    b = GraphBuilder()
    mixed = b("permute", b.input("L_x", (8, 512, tokens)), (0, 2, 1))
    x = b("add", mixed, b.input("L_y", (8, tokens, 512)))  # (in the mixed tokens' strides)
    mean = b("truediv", b("sum", x, (2,), True), 512.0)
    b.output(b("add", b("sub", x, mean), 1.0))
    return b


def test_threads_take_whole_cache_lines_of_their_rows(monkeypatch) -> None:  # noqa: ANN001
    """128 rows on 16 threads would be eight a thread, and every thread would write into the
    lines of the others (mlp_mixer's layer norms ran as slowly on 16 threads as on one): the
    rows go 16 at a time.  A loop with more iterations than that a thread keeps the equal
    shares, and so does a row stored contiguously."""
    monkeypatch.setattr(cpp_threads, "planned_threads", lambda: 16)
    assert "collapse(2) schedule(static, 16)" in kernel_text(transposed_layer_norm())
    assert "schedule(" not in kernel_text(transposed_layer_norm(tokens=1024))
    assert "schedule(" not in kernel_text(pointwise((256, 256)))
    b = GraphBuilder()
    x = b.input("L_x", (2, 16, 512))
    b.output(b("sub", x, b("truediv", b("sum", x, (2,), True), 512.0)))
    assert "schedule(" not in kernel_text(b)

    def norm(a: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        x = a.transpose(1, 2) + y
        return x - x.mean(2, keepdim=True) + 1.0

    fn = minicompile.compile(norm, backend="cpp")
    before = torch.get_num_threads()
    try:
        for n in (2, 1):  # fresh inputs each call
            torch.set_num_threads(n)
            a, y = torch.randn(8, 512, 16), torch.randn(8, 16, 512)
            torch.testing.assert_close(fn(a, y), norm(a, y), rtol=1e-5, atol=1e-5)
    finally:
        torch.set_num_threads(before)
    assert minicompile.stats()["eager_fallbacks"] == 0


def test_openmp_team_is_torchs_thread_count(tmp_path) -> None:  # noqa: ANN001
    """The kernels' OpenMP runtime is torch's: set_num_threads sizes their teams."""
    source = ("#include <omp.h>\n"
              'extern "C" int team() {\n  int n = 0;\n#pragma omp parallel\n'
              "  {\n#pragma omp single\n    n = omp_get_num_threads();\n  }\n  return n;\n}\n")
    with config.patch(cache_dir=tmp_path):
        lib, _ = build.build_unit(source, config.get())
    team = ctypes.CDLL(str(lib)).team
    before = torch.get_num_threads()
    try:
        for n in (1, 2, 1):
            torch.set_num_threads(n)
            assert team() == n
    finally:
        torch.set_num_threads(before)


def work(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, ...]:
    y = torch.sigmoid(x) * w + x
    return y, y.sum(0), (y * y).sum(-1), torch.softmax(y, -1)


def test_results_match_eager_as_thread_count_changes() -> None:
    """One compiled function called on 1, 2, 1 threads, fresh inputs each call: large
    enough that every kernel is parallel.  The C++ backend only: threads are its concern,
    and Triton's interpreter takes minutes over these sizes."""
    fn = minicompile.compile(work, backend="cpp")
    before = torch.get_num_threads()
    try:
        for n in (1, 2, 1):
            torch.set_num_threads(n)
            x, w = torch.randn(384, 320), torch.randn(320)
            for got, want in zip(fn(x, w), work(x, w), strict=True):
                torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    finally:
        torch.set_num_threads(before)
    assert minicompile.stats()["graphs"] == 1  # a new count recompiles nothing
