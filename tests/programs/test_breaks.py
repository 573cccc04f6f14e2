"""Graph breaks, recompiles and their reporting, checked by structure as well as by value.

- a ``print`` in the middle compiles into two graphs around it; the second call runs the
  compiled segments and interprets no bytecode (``stats()["instructions"]`` stays put);
- ``minicompile.explain`` reports graphs, breaks and each break's reason, file and line;
- ``fullgraph=True`` raises at the first break, naming the reason and the source line;
- a break inside a loop or a ``try`` runs that frame eagerly, with the right answer;
- ``MINICOMPILE_LOGS=recompiles`` names the failed guard with its old and new values;
- the recompile limit (8) ends in eager execution with exactly one warning.
"""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch

import minicompile
from minicompile.explain import ExplainOutput


def line_of(fn, text: str) -> int:
    """The line number of the first source line of ``fn`` containing ``text``."""
    lines, start = inspect.getsourcelines(fn)
    for k, line in enumerate(lines):
        if text in line:
            return start + k
    raise AssertionError(f"{text!r} not in {fn.__name__}")


def print_in_the_middle(x):
    y = torch.sin(x) * 2
    print("y has shape", tuple(y.shape))
    return y.cos() + 1


def eager_and_output(fn, *args, capsys):
    expected = fn(*[a.clone() for a in args])
    return expected, capsys.readouterr().out


# -- print in the middle --------------------------------------------------------------------


def test_print_compiles_into_two_graphs(backend: str, device: torch.device, capsys) -> None:
    x = torch.randn(4, 8, device=device)
    expected, printed = eager_and_output(print_in_the_middle, x, capsys=capsys)
    compiled = minicompile.compile(print_in_the_middle, backend=backend)
    torch.testing.assert_close(compiled(x), expected)
    assert capsys.readouterr().out == printed == "y has shape (4, 8)\n"
    stats = minicompile.stats()
    assert stats["graphs"] == 2, stats
    assert stats["graph_breaks"] == 1, stats
    assert stats["eager_fallbacks"] == 0, stats


def test_second_call_interprets_no_bytecode(backend: str, device: torch.device, capsys) -> None:
    compiled = minicompile.compile(print_in_the_middle, backend=backend)
    compiled(torch.randn(4, 8, device=device))
    after_first = minicompile.stats()
    assert after_first["instructions"] > 0, after_first
    capsys.readouterr()

    x = torch.randn(4, 8, device=device)
    torch.testing.assert_close(compiled(x), print_in_the_middle(x))
    out = capsys.readouterr().out
    assert out == "y has shape (4, 8)\n" * 2  # the print ran, once per call
    after_second = minicompile.stats()
    assert after_second["instructions"] == after_first["instructions"], (after_first, after_second)
    for key in ("frames", "graphs", "graph_breaks", "recompiles", "eager_fallbacks"):
        assert after_second[key] == after_first[key], (key, after_first, after_second)


def test_no_break_second_call_interprets_no_bytecode(backend: str, device: torch.device) -> None:
    def f(x, n=3):
        for i in range(n):
            x = x * 0.5 + i
        return x

    compiled = minicompile.compile(f, backend=backend)
    compiled(torch.randn(4, 8, device=device))
    count = minicompile.stats()["instructions"]
    assert count > 0
    x = torch.randn(4, 8, device=device)
    torch.testing.assert_close(compiled(x), f(x))
    assert minicompile.stats()["instructions"] == count


def helper_that_prints(t):
    print("inside helper")
    return t * 2


def calls_printing_helper(x):
    y = x.sin()
    z = helper_that_prints(y)
    return z.cos()


def test_break_in_inlined_function_resumes(backend: str, device: torch.device, capsys) -> None:
    x = torch.randn(4, 8, device=device)
    expected, printed = eager_and_output(calls_printing_helper, x, capsys=capsys)
    compiled = minicompile.compile(calls_printing_helper, backend=backend)
    for _ in range(2):
        torch.testing.assert_close(compiled(x.clone()), expected)
        assert capsys.readouterr().out == printed
    stats = minicompile.stats()
    assert stats["graph_breaks"] >= 1 and stats["graphs"] >= 2, stats
    assert stats["eager_fallbacks"] == 0, stats


def layer_drop(x):
    # transformers' LayerDrop before 5.x: a draw, then a branch on its value
    if torch.rand([]) < 0.0:
        return x
    return x * 2


def calls_layer_drop(x):
    return layer_drop(torch.nn.functional.dropout(x.sin(), 0.5)).cos()


def test_random_draws_before_a_break_in_a_helper_happen_once(backend: str,
                                                             device: torch.device) -> None:
    """The caller's graph stops at the call: a draw of the helper's before its break is
    not also in the caller's graph, so the generator advances as in eager."""
    compiled = minicompile.compile(calls_layer_drop, backend=backend)
    for seed in (1, 2):
        x = torch.randn(4, 8, device=device)
        torch.manual_seed(seed)
        expected, expected_next = calls_layer_drop(x), torch.rand(3, device=device)
        torch.manual_seed(seed)
        torch.testing.assert_close(compiled(x), expected)
        torch.testing.assert_close(torch.rand(3, device=device), expected_next)
    # On a GPU the helper's segment compares a CPU draw (torch.rand([]) has no device):
    # Triton's kernels run on the GPU, so that segment runs eagerly, with its warning.
    cpu_draw_on_gpu = backend == "triton" and device.type == "cuda"
    assert minicompile.stats()["eager_fallbacks"] == int(cpu_draw_on_gpu)


def item_then_python(x):
    y = x.exp()
    total = y.sum().item()  # exp > 0: the branch below always goes one way
    if total > 0:
        y = y * 2
    return y + 1


def test_item_break_reuses_segments(backend: str, device: torch.device) -> None:
    # The Python number .item() gives is specialised (the segment after the break is
    # guarded on its value, as Dynamo does by default): the same value reuses the segments,
    # a new one traces the second segment again.
    compiled = minicompile.compile(item_then_python, backend=backend)
    x = torch.randn(4, 8, device=device)
    for _ in range(3):
        torch.testing.assert_close(compiled(x), item_then_python(x))
    stats = minicompile.stats()
    assert stats["graphs"] == 2 and stats["graph_breaks"] == 1, stats
    x2 = torch.randn(4, 8, device=device)
    torch.testing.assert_close(compiled(x2), item_then_python(x2))
    assert minicompile.stats()["graphs"] == 3 and minicompile.stats()["recompiles"] == 1


# -- explain ----------------------------------------------------------------------------------


def test_explain_reports_print_break() -> None:
    out = minicompile.explain(print_in_the_middle)(torch.randn(4, 8))
    assert out.graph_count == 2, str(out)
    assert out.graph_break_count == 1, str(out)
    [reason] = out.break_reasons
    assert "print" in reason.reason
    assert reason.filename == __file__
    assert reason.lineno == line_of(print_in_the_middle, "print(")


def test_explain_reports_item_and_untraceable_call() -> None:
    def f(x):
        n = x.sum().item()
        pid = os.getpid()
        return x * 2 + (pid > 0) + (n > -1e9)

    out = minicompile.explain(f)(torch.randn(4, 8))
    assert out.graph_break_count == 2, str(out)
    first, second = out.break_reasons
    assert "item" in first.reason and first.lineno == line_of(f, ".item()")
    assert "getpid" in second.reason and second.lineno == line_of(f, "os.getpid()")
    assert out.graph_count >= 2


def test_explain_without_breaks() -> None:
    def f(x, y):
        return (x + y).relu() * 2

    out = minicompile.explain(f)(torch.randn(4, 8), torch.randn(4, 8))
    assert (out.graph_count, out.graph_break_count, out.break_reasons) == (1, 0, [])



class PrintingBlock(torch.nn.Module):
    """A module whose forward breaks at a print between two submodule calls."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = torch.nn.Linear(8, 8)
        self.norm = torch.nn.LayerNorm(8)

    def forward(self, x):
        y = torch.relu(self.inner(x))
        print("y has shape", tuple(y.shape))
        return self.norm(y) + x


def test_explain_accepts_a_module(capsys) -> None:
    """``explain(model)(x)`` as ``torch._dynamo.explain`` takes it: the module's forward
    runs once (its print happens) and its graphs and breaks are reported as for a
    function; a compiled module is explained as its original."""
    model = PrintingBlock().eval()
    stats = minicompile.stats()
    with torch.no_grad():
        for target in (model, minicompile.compile(model)):
            out = minicompile.explain(target)(torch.randn(4, 8))
            assert isinstance(out, ExplainOutput)
            assert (out.graph_count, out.graph_break_count, out.eager_frames) == (2, 1, 0), out
            [reason] = out.break_reasons
            assert "print" in reason.reason and reason.filename == __file__
            assert reason.lineno == line_of(PrintingBlock.forward, "print(")
            first, second = out.ops_per_graph
            assert "torch.nn.functional.linear" in first, first
            assert "torch.nn.functional.layer_norm" in second, second
            assert capsys.readouterr().out == "y has shape (4, 8)\n"
    assert minicompile.stats() == stats


# -- fullgraph --------------------------------------------------------------------------------


def test_fullgraph_raises_at_first_break(backend: str, device: torch.device, capsys) -> None:
    compiled = minicompile.compile(print_in_the_middle, backend=backend, fullgraph=True)
    with pytest.raises(minicompile.Unsupported) as info:
        compiled(torch.randn(4, 8, device=device))
    e = info.value
    assert "print" in e.reason
    line = line_of(print_in_the_middle, "print(")
    assert e.stack[-1].filename == __file__ and e.stack[-1].lineno == line
    assert f"{__file__}:{line}" in str(e)
    assert capsys.readouterr().out == ""  # raised while capturing: nothing ran


def test_fullgraph_names_the_first_of_two_breaks(backend: str, device: torch.device) -> None:
    def f(x):
        n = x.sum().item()
        print(n)
        return x * 2

    compiled = minicompile.compile(f, backend=backend, fullgraph=True)
    with pytest.raises(minicompile.Unsupported) as info:
        compiled(torch.randn(4, 8, device=device))
    assert "item" in info.value.reason
    assert info.value.stack[-1].lineno == line_of(f, ".item()")


def test_fullgraph_passes_without_breaks(backend: str, device: torch.device) -> None:
    def f(x):
        return torch.tanh(x) * 3

    x = torch.randn(4, 8, device=device)
    compiled = minicompile.compile(f, backend=backend, fullgraph=True)
    torch.testing.assert_close(compiled(x), f(x))


# -- breaks inside loops and try blocks: eager for that frame ---------------------------------


def print_in_loop(x):
    for i in range(3):
        x = x * 2 + i
        print("step", i)
    return x.sin()


def print_in_try(x):
    y = x.cos()
    try:
        print("computing")
        y = y * 3
    except ValueError:
        y = y * 0
    return y + 1


@pytest.mark.parametrize("fn", [print_in_loop, print_in_try], ids=["loop", "try"])
def test_break_in_loop_or_try_runs_eagerly(fn, backend: str, device: torch.device, capsys) -> None:
    compiled = minicompile.compile(fn, backend=backend)
    for call in range(2):
        x = torch.randn(4, 8, device=device)
        expected, printed = eager_and_output(fn, x, capsys=capsys)
        torch.testing.assert_close(compiled(x), expected)
        assert capsys.readouterr().out == printed, f"call {call}"
        if call == 0:
            first = minicompile.stats()
    stats = minicompile.stats()
    assert stats["eager_fallbacks"] >= 1, stats
    assert stats["frames"] == first["frames"], (first, stats)  # not captured again


# -- recompiles -------------------------------------------------------------------------------

RECOMPILE_SCRIPT = textwrap.dedent(
    """
    import torch
    import minicompile

    @minicompile.compile(backend="cpp")
    def scale(x, n):
        return x * n + 1

    scale(torch.ones(4, 8), 2)
    scale(torch.ones(4, 8), 2)  # a guard hit: nothing logged
    print("----", flush=True)
    scale(torch.ones(4, 8), 3)  # n changed
    scale(torch.ones(4, 8, dtype=torch.float64), 3)  # dtype changed
    """
)


def run_script(script: str, tmp_path, **env: str) -> subprocess.CompletedProcess:
    full = {**os.environ, "MINICOMPILE_CACHE_DIR": str(tmp_path / "cache"), **env}
    full.pop("MINICOMPILE_TRACE", None)
    return subprocess.run(
        [sys.executable, "-c", script], env=full, capture_output=True, text=True, timeout=300
    )


def test_recompile_log_names_guard_and_values(tmp_path) -> None:
    proc = run_script(RECOMPILE_SCRIPT, tmp_path, MINICOMPILE_LOGS="recompiles")
    assert proc.returncode == 0, proc.stderr
    log = proc.stderr
    assert "recompiles" in log and "scale" in log, log
    assert "L['n'] value: expected 2, got 3" in log, log
    assert "L['x'] dtype: expected torch.float32, got torch.float64" in log, log
    assert log.count("recompiles") >= 2, log


def test_no_recompile_log_without_the_variable(tmp_path) -> None:
    proc = run_script(RECOMPILE_SCRIPT, tmp_path, MINICOMPILE_LOGS="")
    assert proc.returncode == 0, proc.stderr
    assert "expected 2, got 3" not in proc.stderr


def test_eval_toggle_logs_training_guard(tmp_path) -> None:
    script = textwrap.dedent(
        """
        import torch
        import minicompile

        model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Dropout(0.5))
        compiled = minicompile.compile(model, backend="cpp")
        with torch.no_grad():
            model.eval()
            compiled(torch.randn(2, 8))
            model.train()
            compiled(torch.randn(2, 8))
        """
    )
    proc = run_script(script, tmp_path, MINICOMPILE_LOGS="recompiles")
    assert proc.returncode == 0, proc.stderr
    assert "training" in proc.stderr and "expected False, got True" in proc.stderr, proc.stderr


def test_recompile_limit_warns_once_then_runs_eagerly(backend: str, device: torch.device) -> None:
    def f(x, tag):  # a string guard: no automatic dynamic can absorb the change
        return x * len(tag) + 1

    compiled = minicompile.compile(f, backend=backend)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in range(12):
            x, tag = torch.randn(4, 8, device=device), "t" * (n + 1)
            torch.testing.assert_close(compiled(x, tag), f(x, tag))
    limit_warnings = [w for w in caught if "recompile limit" in str(w.message)]
    assert len(limit_warnings) == 1, [str(w.message) for w in caught]
    assert "8" in str(limit_warnings[0].message)
    stats = minicompile.stats()
    assert stats["graphs"] == 8, stats
    assert stats["recompiles"] == 7, stats
    assert stats["eager_fallbacks"] == 1, stats


# -- a break at a call with keyword arguments ------------------------------------------------


def _scaled_after_a_print(x, *, scale):
    print(end="")
    return x * scale


def break_at_keyword_call(x):
    y = x + 1
    z = _scaled_after_a_print(y, scale=2.0)  # the break: the call runs for real, with kwargs
    print("a", "b", sep="", end="|\n")
    return z.sin()


def test_break_at_a_call_with_keyword_arguments(backend: str, device: torch.device,
                                                capsys) -> None:
    """The keyword names (KW_NAMES, run by the trace) reach the call that runs for real."""
    x = torch.randn(5, device=device)
    expected, out = eager_and_output(break_at_keyword_call, x, capsys=capsys)
    compiled = minicompile.compile(break_at_keyword_call, backend=backend)
    for _ in range(2):
        torch.testing.assert_close(compiled(x), expected)
        assert capsys.readouterr().out == out == "ab|\n"
    assert minicompile.stats()["graph_breaks"] >= 2
