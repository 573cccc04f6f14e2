"""Structure beside values: kernel counts, guards and recompiles, the on-disk cache across
processes, graph breaks and eager fallbacks, tracing, build failures, argument errors.
Every value is still compared with eager."""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import minicompile
from minicompile import config

from devices import CUDA, device_for

ROOT = Path(__file__).resolve().parents[2]


def sin_sin(x: torch.Tensor) -> torch.Tensor:
    return torch.sin(torch.sin(x))


def tutorial(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    a = torch.sin(x)
    b = torch.sin(y)
    return a + b


# -- kernel counts ---------------------------------------------------------------------------


def test_chain_is_one_kernel(backend: str, device: torch.device) -> None:
    f = minicompile.compile(sin_sin, backend=backend)
    x = torch.randn(4, 8, device=device)
    torch.testing.assert_close(f(x), sin_sin(x))
    assert minicompile.stats()["kernels"] == 1
    assert minicompile.stats()["graphs"] == 1


def test_tutorial_is_one_kernel(backend: str, device: torch.device) -> None:
    f = minicompile.compile(tutorial, backend=backend)
    x, y = torch.randn(4, 8, device=device), torch.randn(4, 8, device=device)
    torch.testing.assert_close(f(x, y), tutorial(x, y))
    assert minicompile.stats()["kernels"] == 1


def test_sibling_outputs_of_one_shape_share_a_kernel(backend: str, device: torch.device) -> None:
    def two(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x.sin(), x.cos() * 2

    f = minicompile.compile(two, backend=backend)
    x = torch.randn(4, 8, device=device)
    torch.testing.assert_close(f(x), two(x))
    assert minicompile.stats()["kernels"] == 1


def test_outputs_of_different_shapes_get_a_kernel_each(
    backend: str, device: torch.device
) -> None:
    def two(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x.sin(), y.cos()

    f = minicompile.compile(two, backend=backend)
    x, y = torch.randn(4, 8, device=device), torch.randn(3, 5, device=device)
    torch.testing.assert_close(f(x, y), two(x, y))
    assert minicompile.stats()["kernels"] == 2


def test_returning_an_input_needs_no_kernel_and_returns_it(
    backend: str, device: torch.device
) -> None:
    def ident(x: torch.Tensor) -> torch.Tensor:
        return x

    f = minicompile.compile(ident, backend=backend)
    x = torch.randn(4, 8, device=device)
    assert f(x) is x
    assert minicompile.stats()["kernels"] == 0


def _output_code(fn, args: tuple, backend: str, capsys: pytest.CaptureFixture) -> str:  # noqa: ANN001
    """Compile and run ``fn`` (checking its value against eager); the generated module."""
    capsys.readouterr()
    with config.patch(logs=frozenset({"output_code"})):
        compiled = minicompile.compile(fn, backend=backend)
        torch.testing.assert_close(compiled(*args), fn(*args))
    return capsys.readouterr().err


def _calls(code: str, name: str) -> list[str]:
    """The generated lines (not comments, which quote the user's source) calling ``name``."""
    return [line for line in code.splitlines()
            if f"{name}(" in line and not line.strip().startswith(("#", "//"))]


def cat_relu(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.cat([a.sin(), b], 1).relu()


def test_cat_of_pointwise_is_one_kernel_and_no_library_call(
    backend: str, device: torch.device, capsys: pytest.CaptureFixture
) -> None:
    args = (torch.randn(4, 3, device=device), torch.randn(4, 5, device=device))
    code = _output_code(cat_relu, args, backend, capsys)
    assert minicompile.stats()["kernels"] == 1
    assert not _calls(code, "torch.cat"), code


def atan_sin(x: torch.Tensor) -> torch.Tensor:
    return torch.atan(x).sin() + x.arctan() * 2


def test_an_op_table_row_is_captured_fused_and_differentiated(
    backend: str, device: torch.device
) -> None:
    """atan, added as one row of minicompile/op_table.py: both spellings are captured as
    the pointwise op (not a library call), fused into one kernel on each backend, and its
    gradient comes from the row's rule; values and gradients match eager."""
    assert minicompile.explain(atan_sin)(torch.randn(2)).ops_per_graph == [
        ["atan", "sin", "atan", "mul", "add"]]
    f = minicompile.compile(atan_sin, backend=backend)
    for _ in range(2):
        x = torch.randn(4, 8, device=device, requires_grad=True)
        out, expected = f(x), atan_sin(x)
        torch.testing.assert_close(out, expected)
        w = torch.randn_like(out)
        grad, = torch.autograd.grad((out * w).sum(), x)
        torch.testing.assert_close(grad, torch.autograd.grad((expected * w).sum(), x)[0])
    assert minicompile.stats()["graphs"] == 1 and minicompile.stats()["eager_fallbacks"] == 0
    assert minicompile.stats()["kernels"] == 2  # the forward's and the backward's


def test_stack_into_a_reduction_is_one_kernel(
    backend: str, device: torch.device, capsys: pytest.CaptureFixture
) -> None:
    def fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.softmax(torch.stack([x, y.exp()], -1) * 2, -1)

    args = (torch.randn(4, 6, device=device), torch.randn(4, 6, device=device))
    code = _output_code(fn, args, backend, capsys)
    assert minicompile.stats()["kernels"] == 1
    assert not _calls(code, "torch.stack"), code


def test_cat_of_many_pieces_stays_a_library_call(
    backend: str, device: torch.device, capsys: pytest.CaptureFixture
) -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        return torch.cat([x * k for k in range(10)], 0).sin()

    code = _output_code(fn, (torch.randn(2, 3, device=device),), backend, capsys)
    assert _calls(code, "torch.cat"), code


def test_cat_keeps_eager_errors(backend: str, device: torch.device) -> None:
    """cat never broadcasts: sizes that differ outside the cat dim raise eager's error."""
    compiled = minicompile.compile(cat_relu, backend=backend)
    a, b = torch.randn(4, 3, device=device), torch.randn(1, 5, device=device)
    with pytest.raises(RuntimeError, match="Sizes of tensors must match"):
        cat_relu(a, b)
    with pytest.raises(RuntimeError, match="Sizes of tensors must match"):
        compiled(a, b)


# -- guards and recompiles -------------------------------------------------------------------


def test_fresh_inputs_with_same_metadata_are_a_guard_hit(
    backend: str, device: torch.device
) -> None:
    f = minicompile.compile(tutorial, backend=backend)
    for _ in range(3):
        x, y = torch.randn(4, 8, device=device), torch.randn(4, 8, device=device)
        torch.testing.assert_close(f(x, y), tutorial(x, y))
    stats = minicompile.stats()
    assert stats["frames"] == 1 and stats["graphs"] == 1 and stats["recompiles"] == 0


def test_dtype_change_recompiles(backend: str, device: torch.device) -> None:
    f = minicompile.compile(sin_sin, backend=backend)
    x = torch.randn(4, 8, device=device)
    torch.testing.assert_close(f(x), sin_sin(x))
    h = x.half()
    out = f(h)
    assert out.dtype == torch.float16
    torch.testing.assert_close(out, sin_sin(h), rtol=2e-3, atol=2e-3)
    stats = minicompile.stats()
    assert stats["recompiles"] == 1 and stats["graphs"] == 2, stats
    # Both entries stay: going back to float32 is a hit, not a third graph.
    torch.testing.assert_close(f(x), sin_sin(x))
    assert minicompile.stats()["graphs"] == 2


def test_reset_forgets_compiled_code(backend: str, device: torch.device) -> None:
    f = minicompile.compile(sin_sin, backend=backend)
    x = torch.randn(4, 8, device=device)
    f(x)
    minicompile.reset()
    assert all(v == 0 for v in minicompile.stats().values())
    torch.testing.assert_close(f(x), sin_sin(x))
    assert minicompile.stats()["frames"] == 1  # captured again


def test_recompile_limit_falls_back_to_eager_with_a_warning() -> None:
    with config.patch(recompile_limit=2):
        f = minicompile.compile(sin_sin, backend="cpp")
    f(torch.randn(4))
    f(torch.randn(4).double())
    with pytest.warns(UserWarning, match="recompile limit"):
        x = torch.randn(4).half()
        torch.testing.assert_close(f(x), sin_sin(x))
    assert minicompile.stats()["eager_fallbacks"] == 1


# -- the on-disk cache, across processes -----------------------------------------------------

CACHE_SCRIPT = """
import json, torch, minicompile

def f(x, y):
    return torch.sin(x) * 2 + torch.cos(y)

g = minicompile.compile(f, backend={backend!r})
x, y = torch.randn(4, 8, device={device!r}), torch.randn(4, 8, device={device!r})
torch.testing.assert_close(g(x, y), f(x, y))
print(json.dumps(minicompile.stats()))
"""


def _env(**extra: str) -> dict[str, str]:
    """The child's environment: no inherited MINICOMPILE_* settings, Triton's interpreter
    where there is no GPU, then ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MINICOMPILE_")}
    if not CUDA:
        env.setdefault("TRITON_INTERPRET", "1")
    env.update(extra)
    return env


def _run(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    proc = subprocess.run(args, env=env, cwd=cwd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


def _snapshot(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_mtime_ns for p in folder.rglob("*")
            if p.is_file()}


def test_warm_cache_in_a_new_process(backend: str, device: torch.device, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    env = _env(MINICOMPILE_CACHE_DIR=str(cache))
    script = CACHE_SCRIPT.format(backend=backend, device=str(device))
    cmd = [sys.executable, "-c", script]

    cold = json.loads(_run(cmd, env, tmp_path).stdout.splitlines()[-1])
    assert cold["graphs"] == 1 and cold["cache_hits"] == 0, cold
    before = _snapshot(cache)
    assert before, "nothing was written to the cache directory"
    if backend == "cpp":
        assert any(name.startswith("cpp") and name.endswith(".so") for name in before)

    warm = json.loads(_run(cmd, env, tmp_path).stdout.splitlines()[-1])
    assert warm["graphs"] == 0 and warm["warm_entries"] == 1 and warm["cache_hits"] >= 1, warm
    assert warm["kernels"] == cold["kernels"]
    assert _snapshot(cache) == before, "the warm process rebuilt or rewrote cache files"


def test_default_cache_dir_is_the_sessions(cache_dir: str) -> None:
    # conftest points MINICOMPILE_CACHE_DIR at a session tmp dir before minicompile is
    # imported: the suite never writes to ~/.cache/minicompile.
    assert str(config.get().cache_dir) == cache_dir


# -- graph breaks and eager fallbacks -------------------------------------------------------


def with_print(x: torch.Tensor) -> torch.Tensor:
    y = torch.sin(x)
    print(x)
    return y + 1


def with_item(x: torch.Tensor) -> torch.Tensor:
    s = x.item()
    return torch.sin(x) * s


def _line_of(fn: object, text: str) -> int:
    lines, first = inspect.getsourcelines(fn)  # type: ignore[arg-type]
    return first + next(k for k, line in enumerate(lines) if text in line)


def test_print_breaks_the_graph_and_resumes(
    backend: str, device: torch.device, capsys: pytest.CaptureFixture
) -> None:
    f = minicompile.compile(with_print, backend=backend)
    x = torch.randn(3, device=device)
    torch.testing.assert_close(f(x), torch.sin(x) + 1)
    torch.testing.assert_close(f(x), torch.sin(x) + 1)
    stats = minicompile.stats()
    assert stats["eager_fallbacks"] == 0 and stats["graph_breaks"] == 1, stats
    assert stats["graphs"] == 2, stats  # before and after the print, compiled once
    # The print happened, once a call: capture has no side effects of its own.
    assert capsys.readouterr().out.count("tensor(") == 2


def test_item_breaks_the_graph_with_the_right_result(backend: str, device: torch.device) -> None:
    f = minicompile.compile(with_item, backend=backend)
    x = torch.randn(1, device=device)
    torch.testing.assert_close(f(x), with_item(x))
    stats = minicompile.stats()
    assert stats["eager_fallbacks"] == 0 and stats["graph_breaks"] == 1, stats


@pytest.mark.parametrize("fn, text, word", [
    (with_print, "print(x)", "print"),
    (with_item, "x.item()", "item"),
])
def test_fullgraph_raises_with_reason_and_line(fn, text: str, word: str) -> None:
    f = minicompile.compile(fn, fullgraph=True)
    with pytest.raises(minicompile.Unsupported) as info:
        f(torch.randn(1))
    message = str(info.value)
    assert word in info.value.reason
    assert f"{Path(__file__).name}:{_line_of(fn, text)}" in message or (
        f"{__file__}:{_line_of(fn, text)}" in message
    ), message
    assert minicompile.stats()["eager_fallbacks"] == 0


def test_explain_reports_the_break() -> None:
    out = minicompile.explain(with_print)(torch.randn(2))
    assert out.graph_count == 2 and out.graph_break_count == 1  # around the print
    (reason,) = out.break_reasons
    assert "print" in reason.reason
    assert Path(reason.filename).name == Path(__file__).name
    assert reason.lineno == _line_of(with_print, "print(x)")
    ok = minicompile.explain(tutorial)(torch.randn(2), torch.randn(2))
    assert ok.graph_count == 1 and ok.graph_break_count == 0
    assert ok.ops_per_graph == [["sin", "sin", "add"]]


# -- tracing -------------------------------------------------------------------------------

TRACE_SCRIPT = '''\
import torch
import minicompile


def f(x, y):
    a = torch.sin(x)
    b = torch.cos(y)
    return a + b


g = minicompile.compile(f, backend={backend!r})
x, y = torch.randn(4, 8, device={device!r}), torch.randn(4, 8, device={device!r})
torch.testing.assert_close(g(x, y), f(x, y))
'''


def test_trace_prints_graph_and_code_with_sources(
    backend: str, device: torch.device, tmp_path: Path
) -> None:
    script = tmp_path / "traced.py"
    script.write_text(TRACE_SCRIPT.format(backend=backend, device=str(device)))
    env = _env(
        MINICOMPILE_TRACE="1",
        MINICOMPILE_CACHE_DIR=str(tmp_path / "cache"),
        MINICOMPILE_TRACE_DIR=str(tmp_path / "trace"),
    )
    err = _run([sys.executable, str(script)], env, tmp_path).stderr
    # The captured graph, with the user's source lines.
    assert "= sin(" in err and "= cos(" in err and "= add(" in err, err
    assert "a = torch.sin(x)" in err
    # The generated kernel and its header comment naming nodes and source lines.
    if backend == "triton":
        assert "@triton.jit" in err
        comment = "#"
    else:
        assert 'extern "C"' in err
        comment = "//"
    header = [line.strip() for line in err.splitlines() if line.strip().startswith(comment)]
    assert any("graph nodes:" in h and "sin" in h and "cos" in h and "add" in h
               for h in header), "\n".join(header)
    assert any("traced.py:6" in h and "a = torch.sin(x)" in h for h in header), err
    assert any("traced.py:7" in h and "b = torch.cos(y)" in h for h in header), err
    # Written to the trace directory too.
    assert any((tmp_path / "trace").iterdir())


# -- build failures and bad arguments -------------------------------------------------------


def test_cpp_build_failure_falls_back_to_eager_with_a_warning() -> None:
    with config.patch(cxx="/nonexistent/g++"):
        f = minicompile.compile(tutorial, backend="cpp")
        x, y = torch.randn(4, 8), torch.randn(4, 8)
        with pytest.warns(UserWarning, match="eager"):
            out = f(x, y)
    torch.testing.assert_close(out, tutorial(x, y))
    assert minicompile.stats()["eager_fallbacks"] == 1
    # The fallback sticks: a second call neither warns nor rebuilds.
    torch.testing.assert_close(f(x, y), tutorial(x, y))
    assert minicompile.stats()["eager_fallbacks"] == 1


def test_cpp_build_failure_raises_in_strict_mode() -> None:
    from minicompile.errors import BackendCompilerFailed

    with config.patch(cxx="/nonexistent/g++", strict=True):
        f = minicompile.compile(tutorial, backend="cpp")
        with pytest.raises(BackendCompilerFailed, match="nonexistent"):
            f(torch.randn(4, 8), torch.randn(4, 8))


@pytest.mark.parametrize("kwargs, match", [
    (dict(backend="nope"), "backend"),
    (dict(mode="fastest"), "mode"),
    (dict(dynamic="yes"), "dynamic"),
])
def test_bad_options_raise_value_error(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        minicompile.compile(sin_sin, **kwargs)
    with pytest.raises(ValueError, match=match):  # the decorator form checks early too
        minicompile.compile(**kwargs)


def test_compiling_a_non_function_raises_type_error() -> None:
    with pytest.raises(TypeError, match="function"):
        minicompile.compile(42)


def test_decorator_forms(device: torch.device) -> None:
    @minicompile.compile
    def bare(x: torch.Tensor) -> torch.Tensor:
        return x * 2 + 1

    @minicompile.compile(backend="auto")
    def with_options(x: torch.Tensor) -> torch.Tensor:
        return x * 2 + 1

    x = torch.randn(8, device=device)
    torch.testing.assert_close(bare(x), x * 2 + 1)
    torch.testing.assert_close(with_options(x), x * 2 + 1)
    assert minicompile.stats()["graphs"] == 2


def test_wrong_arguments_raise_like_eager(backend: str, device: torch.device) -> None:
    f = minicompile.compile(tutorial, backend=backend)
    with pytest.raises(TypeError):
        f(torch.randn(2, device=device))  # a missing argument: Python's own error


def test_shape_mismatch_raises_pytorchs_error(backend: str, device: torch.device) -> None:
    f = minicompile.compile(tutorial, backend=backend)
    x, y = torch.randn(4, device=device), torch.randn(5, device=device)
    with pytest.raises(RuntimeError, match="size"):
        tutorial(x, y)
    with pytest.raises(RuntimeError, match="size"):
        f(x, y)


def test_source_is_not_imported_from_the_cwd() -> None:
    # The editable install serves minicompile from the repository.
    assert Path(minicompile.__file__).resolve().is_relative_to(ROOT)


def test_trace_script_is_valid_python() -> None:
    compile(textwrap.dedent(TRACE_SCRIPT.format(backend="cpp", device="cpu")), "t", "exec")
