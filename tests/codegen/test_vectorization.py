"""The C++ backend's kernels vectorise: a pointwise chain, row reductions (sum, max, any,
softmax's max and sum) and outer-dimension reductions (sum, max) are built with the
runtime's compiler flags plus GCC's vectorization report (``-fopt-info-vec-optimized``),
and every innermost loop that reads memory (an input, or an output written by an earlier
pass) must be reported vectorised and access memory along its own loop variable (unit
stride: the contiguous dim, no strided gathers)."""

from __future__ import annotations

import re
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import sympy
import torch

from minicompile import config
from minicompile.runtime import build

from graph_builder import GraphBuilder, compile_graph_text

SHAPE = (4096, 1024)
_FOR = re.compile(r"^\s*for \(int64_t (\w+) = ")
_ACCESS = re.compile(r"(?:in|out)_ptr\d+\[([^\]]+)\]")
_DEFINE = re.compile(r"^\s*const int64_t (\w+) = (.+);")
_VECTORIZED = re.compile(r":(\d+):\d+: optimized: loop vectorized")


def chain(dtype: torch.dtype) -> GraphBuilder:
    b = GraphBuilder()
    x, y = b.input("L_x", SHAPE, dtype), b.input("L_y", SHAPE, dtype)
    b.output(b("add", b("mul", b("sigmoid", x), b("tanh", y)), b("exp", x)))
    return b


def gelu(dtype: torch.dtype) -> GraphBuilder:
    """erf's GELU: mc_erf is arithmetic and one exp (codegen/cpp_helpers.h)."""
    b = GraphBuilder()
    x = b.input("L_x", SHAPE, dtype)
    b.output(b("mul", b("mul", x, 0.5), b("add", b("erf", b("mul", x, 0.7071067811865476)), 1.0)))
    return b


def softmax(dtype: torch.dtype) -> GraphBuilder:
    b = GraphBuilder()
    x = b.input("L_x", SHAPE, dtype)
    e = b("exp", b("sub", x, b("amax", x, (1,), True)))
    b.output(b("truediv", e, b("sum", e, (1,), True)))
    return b


def reduction(dim: int, op: str = "sum"):
    def build_graph(dtype: torch.dtype) -> GraphBuilder:
        b = GraphBuilder()
        b.output(b(op, b.input("L_x", SHAPE, dtype), (dim,), False))
        return b

    return build_graph


def any_positive(dtype: torch.dtype) -> GraphBuilder:
    b = GraphBuilder()
    b.output(b("any", b("gt", b.input("L_x", SHAPE, dtype), 0.0), (1,), False))
    return b


CASES = {
    "pointwise_chain": (chain, torch.float32),
    "pointwise_chain_bf16": (chain, torch.bfloat16),
    "gelu_erf": (gelu, torch.float32),
    "softmax_rows": (softmax, torch.float32),
    "sum_rows": (reduction(1), torch.float32),
    "amax_rows": (reduction(1, "amax"), torch.float32),
    "any_rows": (any_positive, torch.float32),
    "sum_outer_dim": (reduction(0), torch.float32),
    "sum_outer_dim_bf16": (reduction(0), torch.bfloat16),
    "amax_outer_dim": (reduction(0, "amax"), torch.float32),
    "pointwise_chain_f16": (chain, torch.float16),
}
# Known not to vectorise, with why (xfail, not strict: a CPU with AVX512-FP16 may).
NOT_VECTORIZED = {
    "pointwise_chain_f16": "float16 converts through _Float16, which GCC 12 vectorises only "
    "with AVX512-FP16 ('unsupported data-type float'); bit-twiddled conversions would",
}


def innermost_loops(lines: list[str]) -> list[tuple[int, int, str]]:
    """(first line, last line, loop variable) of each innermost ``for`` loop, 1-based."""
    stack: list[tuple[int, str, bool]] = []  # (line, variable, has an inner loop)
    loops = []
    for number, line in enumerate(lines, 1):
        match = _FOR.match(line)
        if match:
            if stack:
                stack[-1] = (*stack[-1][:2], True)
            stack.append((number, match.group(1), False))
        elif line.strip() == "}" and stack and _indent(line) == _indent(lines[stack[-1][0] - 1]):
            start, variable, nested = stack.pop()
            if not nested:
                loops.append((start, number, variable))
    return loops


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def unit_stride(body: list[str], variable: str) -> bool:
    """Whether every buffer the loop reads or writes is indexed with coefficient 0 or 1 in
    its loop variable (after the loop's ``const int64_t`` definitions, ``x0 = x0_base + lane``)."""
    defines: dict[sympy.Symbol, sympy.Expr] = {}
    for line in body:
        match = _DEFINE.match(line)
        if match:
            defines[sympy.Symbol(match.group(1))] = sympy.sympify(match.group(2))
    for index in (m.group(1) for line in body for m in _ACCESS.finditer(line)):
        expr = sympy.expand(sympy.sympify(index).xreplace(defines))
        if expr.coeff(sympy.Symbol(variable)) not in (0, 1):
            return False
    return True


def gcc_report(source: str, folder: Path) -> set[int]:
    """The lines GCC reports a vectorised loop at, building ``source`` as the runtime does
    (its flags, libmvec's declarations) into an object file."""
    cfg = config.get()
    flags = [f for f in (*cfg.cxx_flags, *build.vector_math_flags())
             if not f.startswith("-l") and f != "-shared"]
    path = folder / "unit.cpp"
    path.write_text(source)
    cmd = [cfg.cxx, *flags, "-fopt-info-vec-optimized", "-c", str(path), "-o",
           str(folder / "unit.o")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return {int(m.group(1)) for m in _VECTORIZED.finditer(proc.stderr)}


@pytest.fixture(scope="module")
def reports(tmp_path_factory) -> dict[str, tuple[list[str], set[int]]]:
    """Each case's generated C++ lines and GCC's vectorised lines, built at once."""
    version = subprocess.run([config.get().cxx, "--version"], capture_output=True, text=True,
                             check=False)
    if "Free Software Foundation" not in version.stdout:
        pytest.skip("the vectorization report is GCC's (-fopt-info-vec)")

    # Generated one after another (codegen is not meant for threads), built at once.
    sources = {name: compile_graph_text(make(dtype).graph, "cpp").code.cpp_source
               for name, (make, dtype) in CASES.items()}

    def one(name: str) -> tuple[list[str], set[int]]:
        folder = tmp_path_factory.mktemp(name)
        return sources[name].splitlines(), gcc_report(sources[name], folder)

    with ThreadPoolExecutor(len(CASES)) as pool:
        return dict(zip(sources, pool.map(one, sources)))


@pytest.mark.parametrize("name", [
    pytest.param(n, marks=pytest.mark.xfail(reason=NOT_VECTORIZED[n], strict=False))
    if n in NOT_VECTORIZED else n
    for n in CASES
])
def test_inner_loops_vectorize_along_the_contiguous_dim(name: str, reports) -> None:
    lines, vectorized = reports[name]
    loops = [(a, b, v) for a, b, v in innermost_loops(lines)
             if any(_ACCESS.search(line.partition("=")[2]) for line in lines[a - 1:b])]
    assert loops, "\n".join(lines)
    for start, end, variable in loops:
        body = lines[start - 1:end]
        where = f"loop over {variable} at line {start}:\n" + "\n".join(body)
        # Not at the ``omp simd`` pragma above the loop: there GCC reports the small loop
        # that combines a reduction's lanes, also when the loop itself stays scalar.
        assert any(start <= n <= end for n in vectorized), f"not vectorised: {where}"
        assert unit_stride(body, variable), f"strided loads: {where}"


def test_softmax_computes_exp_once(reports) -> None:
    """The sum's pass stores exp(x - max) in the output; the last pass reads it back and
    divides (cpp_reduction.kept_operands), as eager's softmax does."""
    lines, _ = reports["softmax_rows"]
    assert sum(line.count("std::exp(") for line in lines) == 1, "\n".join(lines)
