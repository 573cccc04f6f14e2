"""The user's exceptions are the user's: whatever path runs the code (a compiled segment,
the instruction at a graph break, the code after a break, an inlined call, a loop), an
exception raised by user code or by a PyTorch op reaches the caller with eager's type and
message, and its traceback ends at the user's line, with no frame of minicompile's after
it.  Minicompile's own failures degrade to eager with one warning.

Every function is called at least twice, with values that raise and values that do not,
and compared with eager each time.
"""

from __future__ import annotations

import dataclasses
import importlib

import inspect
import traceback
import warnings

import pytest
import torch
import torch.nn.functional as F

import minicompile
from minicompile.runtime import build

from devices import device_for

HERE = __file__


def line_of(fn, text: str) -> int:
    """The line number of the first line of ``fn`` containing ``text``."""
    lines, start = inspect.getsourcelines(fn)
    return start + next(k for k, line in enumerate(lines) if text in line)


def outcome(fn, args):
    """(result, None) or (None, exception) of a call."""
    try:
        return fn(*[a.clone() if isinstance(a, torch.Tensor) else a for a in args]), None
    except Exception as e:  # noqa: BLE001 - the exception is what is compared
        return None, e


def assert_same_outcome(fn, calls, line_text: str, backend: str = "cpp") -> None:
    """Compiled and eager agree on every call: equal results, or exceptions of the same
    type and message whose traceback's last frame in this file is ``line_text``'s line and
    which has no minicompile frame after it."""
    compiled = minicompile.compile(fn, backend=backend)
    raised = returned = 0
    for args in calls:
        expected, eager_error = outcome(fn, args)
        actual, error = outcome(compiled, args)
        if eager_error is None:
            assert error is None, f"compiled raised {error!r}; eager returned"
            torch.testing.assert_close(actual, expected)
            returned += 1
            continue
        raised += 1
        assert type(error) is type(eager_error), f"{error!r} != {eager_error!r}"
        assert str(error) == str(eager_error)
        shown = [x.__context__ is not None and not x.__suppress_context__
                 for x in (error, eager_error)]
        assert shown[0] == shown[1], "a context eager does not show (the compiled attempt)"
        frames = traceback.extract_tb(error.__traceback__)
        ours = [k for k, fs in enumerate(frames) if fs.filename == HERE]
        assert ours, "no frame of the user's file in the traceback"
        assert frames[ours[-1]].lineno == line_of(fn, line_text), frames.format()
        after = [fs.filename for fs in frames[ours[-1] + 1:]]
        assert not any("minicompile" in f or "/passes/" in f or "/codegen/" in f
                       for f in after), after
    assert raised and returned, "the calls should both raise and return"


def test_raise_after_data_dependent_break(backend: str) -> None:
    def h(x):
        if x.sum() > 0:  # a graph break
            raise ValueError("user error inside")
        return x * 2

    assert_same_outcome(h, [(torch.ones(3),), (-torch.ones(3),), (torch.full((3,), 2.0),)],
                        "raise ValueError", backend)


def test_torch_error_inside_a_compiled_graph(backend: str) -> None:
    def emb(idx, w):
        y = w * 2
        return F.embedding(idx, y) + 1

    w = torch.randn(4, 3)
    assert_same_outcome(emb, [(torch.tensor([0, 3]), w), (torch.tensor([1, 7]), w),
                              (torch.tensor([2, 2]), w + 1)], "F.embedding", backend)


def test_torch_error_in_the_code_after_a_break(backend: str) -> None:
    def g(x, i):
        y = x.sin()
        print("", end="")  # a graph break
        return y[i] * 2

    assert_same_outcome(g, [(torch.ones(6), 5), (torch.ones(3), 5), (torch.zeros(4), 1)],
                        "return y[i]", backend)


def _inner(x):
    if x.sum() > 0:
        raise KeyError("from the inlined helper")
    return x + 1


def test_raise_in_an_inlined_call_after_a_break(backend: str) -> None:
    def outer(x):
        y = x * 3
        return _inner(y) * 2

    compiled = minicompile.compile(outer, backend=backend)
    torch.testing.assert_close(compiled(-torch.ones(2)), outer(-torch.ones(2)))
    with pytest.raises(KeyError, match="from the inlined helper") as info:
        compiled(torch.ones(2))
    frames = traceback.extract_tb(info.value.__traceback__)
    assert [fs.lineno for fs in frames if fs.filename == HERE][-2:] == [
        line_of(outer, "_inner(y)"), line_of(_inner, "raise KeyError")]
    torch.testing.assert_close(compiled(-torch.ones(2) * 4), outer(-torch.ones(2) * 4))


def test_raise_in_a_loop_with_a_break(backend: str) -> None:
    def loop(x):
        for i in range(3):
            if x.sum() > i:
                raise IndexError(f"step {i}")
            x = x + 1
        return x

    assert_same_outcome(loop, [(torch.zeros(2),), (-torch.ones(2) * 9,), (torch.ones(2),)],
                        "raise IndexError", backend)


def test_try_except_finally_and_with_see_eager_exceptions(backend: str) -> None:
    log: list[str] = []

    def handled(x):
        try:
            if x.sum() > 0:
                raise ValueError("caught")
            y = x * 2
        except ValueError:
            y = x - 1
        finally:
            log.append("finally")
        with torch.no_grad():
            z = torch.cat([y, x.new_ones(int(x.numel() > 2))])
        return z

    compiled = minicompile.compile(handled, backend=backend)
    for x in (torch.ones(2), -torch.ones(2), torch.full((3,), 2.0)):
        torch.testing.assert_close(compiled(x), handled(x))
    assert log == ["finally"] * 6


def _mm_unused(a, b):
    unused = torch.mm(a, b)  # noqa: F841 - nothing reads it; eager raises for bool tensors
    return a * 2


def _max_unused(x):
    unused = x.max()  # noqa: F841 - eager raises for an empty tensor
    return x + 1


def _cholesky_unused(x):
    unused = torch.linalg.cholesky(x)  # noqa: F841 - raises when x is not positive definite
    return x - 1


def _one_hot_unused(labels):
    unused = F.one_hot(labels, 3)  # noqa: F841 - raises for a class out of range
    return labels * 2


@pytest.mark.parametrize("fn, calls, line_text", [
    (_mm_unused, [(torch.ones(2, 3), torch.ones(3, 2)),
                  (torch.ones(2, 3, dtype=torch.bool), torch.ones(3, 2, dtype=torch.bool)),
                  (torch.zeros(2, 3) + 2, torch.ones(3, 2) - 4)], "torch.mm"),
    (_max_unused, [(torch.ones(3),), (torch.ones(0),), (torch.arange(4.0),)], "x.max()"),
    (_cholesky_unused, [(torch.eye(3),), (-torch.eye(3),), (torch.eye(3) * 2,)],
     "torch.linalg.cholesky"),
    (_one_hot_unused, [(torch.tensor([0, 2]),), (torch.tensor([1, 3]),),
                       (torch.tensor([2, 1]),)], "F.one_hot"),
], ids=["bool_matmul", "max_of_empty", "cholesky", "one_hot"])
def test_unused_library_calls_raise_as_in_eager(fn, calls, line_text: str,
                                                backend: str) -> None:
    # A library call nothing reads is dead code, but eager runs it, and raises there: so do
    # we (passes/cleanup.py may_raise), at the user's line.
    assert_same_outcome(fn, calls, line_text, backend)


def test_unused_library_calls_that_cannot_raise_cost_nothing(backend: str) -> None:
    def f(a, b):
        unused = torch.mm(a, b) + torch.flip(a, [0]).sum()  # noqa: F841
        return a * 2

    compiled = minicompile.compile(f, backend=backend)
    device = device_for(backend)
    for k in range(2):
        a, b = torch.randn(2, 3, device=device) + k, torch.randn(3, 4, device=device)
        torch.testing.assert_close(compiled(a, b), f(a, b))
    assert minicompile.stats()["kernels"] == 1  # a * 2, without the matmul or the flip


def _int_divisions(a, b):
    q = a // b  # eager raises ZeroDivisionError for a divisor of zero (integers, on CPU)
    return q * 2, (a % b).sum(), torch.cat([q, b % (a + 10)]) + 1


def _divide_by_a_scalar_tensor(a, b):
    return (a + 1) % b  # b: a 0-dim tensor


@pytest.mark.parametrize("fn, calls, line_text", [
    (_int_divisions, [(torch.tensor([5, -7, 9]), torch.tensor([2, 3, -4])),
                      (torch.tensor([5, 7, 9]), torch.tensor([1, 0, 2])),
                      (torch.tensor([[4], [-9]]), torch.tensor([3, -2, 5])),
                      (torch.tensor([0, 7], dtype=torch.int32),
                       torch.tensor([[3], [0]], dtype=torch.int32))], "q = a // b"),
    (_divide_by_a_scalar_tensor, [(torch.arange(6).view(2, 3), torch.tensor(4)),
                                  (torch.arange(6).view(2, 3).t(), torch.tensor(0)),
                                  (torch.arange(4), torch.tensor(-3))], "(a + 1) % b"),
], ids=["floordiv_remainder_cat", "scalar_divisor"])
def test_integer_division_by_zero_raises_as_in_eager(fn, calls, line_text: str,
                                                     backend: str) -> None:
    # A C++ kernel dividing by zero used to kill the process (SIGFPE), and Triton's
    # interpreter returned garbage: the kernels check the divisor (codegen: divides_by_values).
    assert_same_outcome(fn, calls, line_text, backend)


class _Recorder:
    """A context manager that logs what its ``__exit__`` sees."""

    def __init__(self, log: list) -> None:
        self.log = log

    def __enter__(self):
        self.log.append("enter")
        return self

    def __exit__(self, kind, value, tb):
        self.log.append(("exit", kind and kind.__name__, value and str(value)))
        return False


def _handled_inside(idx, w, log):
    try:
        with _Recorder(log):
            y = F.embedding(idx, w * 2)  # raises in the compiled graph for an index >= 4
    except IndexError as e:
        log.append(("caught", str(e)))
        y = w[:1] - 1
    finally:
        log.append("finally")
    return y + 1


def _helper_with_try(idx, w):
    try:
        return F.embedding(idx, w) * 3
    except IndexError:
        return w[:2] * 0


def _handled_in_an_inlined_call_after_a_break(idx, w, log):
    z = w.sin()
    print("", end="")  # a graph break: the rest is a segment of its own
    return _helper_with_try(idx, z) + 1


def _in_an_unrolled_loop(idx, w, log):
    y = w.sum(0)
    for i in range(3):
        y = y + F.embedding(idx[i:i + 1], w)[0]  # raises for an index >= 4
    return y


@pytest.mark.parametrize("fn", [_handled_inside, _handled_in_an_inlined_call_after_a_break,
                                _in_an_unrolled_loop], ids=lambda f: f.__name__.strip("_"))
def test_handlers_see_errors_of_compiled_code(fn, backend: str) -> None:
    # The graph runs as one piece, outside the user's try / with blocks: an error it raises
    # (one eager raises too) is met by running the code for real, where they see it.
    compiled = minicompile.compile(fn, backend=backend)
    w = torch.randn(4, 3)
    raised = 0
    for idx in (torch.tensor([0, 3, 1]), torch.tensor([1, 2, 9]), torch.tensor([3, 2, 1]),
                torch.tensor([7, 0, 0])):
        eager_log, compiled_log = [], []
        expected, eager_error = outcome(fn, (idx, w, eager_log))
        actual, error = outcome(compiled, (idx, w, compiled_log))
        assert compiled_log == eager_log
        if eager_error is not None:
            raised += 1
            assert type(error) is type(eager_error) and str(error) == str(eager_error)
            frames = traceback.extract_tb(error.__traceback__)
            assert [fs.lineno for fs in frames if fs.filename == HERE][-1] == line_of(
                fn, "F.embedding")
            continue
        assert error is None, error
        torch.testing.assert_close(actual, expected)
    assert raised == (2 if fn is _in_an_unrolled_loop else 0)


def test_wrong_argument_count_is_eager_type_error() -> None:
    def f(x, y):
        return x + y

    compiled = minicompile.compile(f)
    torch.testing.assert_close(compiled(torch.ones(2), torch.ones(2)), f(torch.ones(2),
                                                                          torch.ones(2)))
    with pytest.raises(TypeError):
        compiled(torch.ones(2))
    torch.testing.assert_close(compiled(torch.zeros(2), torch.ones(2)), f(torch.zeros(2),
                                                                           torch.ones(2)))


def test_a_user_error_found_while_tracing_does_not_disable_compiling() -> None:
    def f(x, y):
        return (x * 2) @ y

    compiled = minicompile.compile(f, backend="cpp")
    with pytest.raises(RuntimeError, match="cannot be multiplied"):
        compiled(torch.ones(2, 3), torch.ones(2, 3))
    for k in range(2):
        x, y = torch.randn(2, 3), torch.randn(3, 4) + k
        torch.testing.assert_close(compiled(x, y), f(x, y))
    # The break at the failing matmul was forgotten: one entry, the whole frame, no break.
    assert compiled.eager_reason is None
    assert len(compiled.entries) == 1 and compiled.entries[0].stop is None


def _sin_cos(x):
    return torch.sin(x) * torch.cos(x)


def _raising(error: Exception):
    def broken(*args, **kwargs):
        raise error

    return broken


@pytest.mark.parametrize("module, stage, error, message", [
    ("minicompile.capture", "capture_segment", AssertionError("a bug in capture"),
     "internal error while capturing: AssertionError"),
    ("minicompile.lowering", "lower", KeyError("a bug in lowering"),
     "internal error while compiling: KeyError"),
])
def test_internal_errors_warn_once_and_run_eagerly(monkeypatch, module: str, stage: str,
                                                    error: Exception, message: str) -> None:
    monkeypatch.setattr(importlib.import_module(module), stage, _raising(error))
    compiled = minicompile.compile(_sin_cos)
    with pytest.warns(UserWarning, match=message):
        torch.testing.assert_close(compiled(torch.ones(3)), _sin_cos(torch.ones(3)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # one warning only
        torch.testing.assert_close(compiled(torch.zeros(3) + 2), _sin_cos(torch.zeros(3) + 2))
    assert minicompile.stats()["eager_fallbacks"] == 1


def test_compiled_code_that_raises_where_eager_does_not_falls_back(monkeypatch) -> None:
    real = build.load

    def raising_call(*args, **kwargs):
        loaded = real(*args, **kwargs)  # built as usual, then wrong when called
        return dataclasses.replace(loaded, call=_raising(RuntimeError("a bug in generated code")))

    monkeypatch.setattr(build, "load", raising_call)
    compiled = minicompile.compile(_sin_cos)
    with pytest.warns(UserWarning, match="compiled code raised RuntimeError where eager"):
        torch.testing.assert_close(compiled(torch.ones(3)), _sin_cos(torch.ones(3)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        torch.testing.assert_close(compiled(torch.zeros(3) - 1), _sin_cos(torch.zeros(3) - 1))
    assert minicompile.stats()["eager_fallbacks"] == 1


def test_strict_mode_raises_internal_errors(monkeypatch) -> None:
    monkeypatch.setattr(importlib.import_module("minicompile.lowering"), "lower",
                        _raising(KeyError("a bug in lowering")))
    with minicompile.config.patch(strict=True):
        compiled = minicompile.compile(_sin_cos)
        for x in (torch.ones(3), torch.zeros(2)):
            with pytest.raises(KeyError):
                compiled(x)
    monkeypatch.undo()  # without the bug, the same function compiles and matches eager
    with minicompile.config.patch(strict=True):
        compiled = minicompile.compile(_sin_cos)
        for x in (torch.ones(3), torch.zeros(2)):
            torch.testing.assert_close(compiled(x), _sin_cos(x))
