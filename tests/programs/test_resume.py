"""Graph breaks that resume, checked against eager on every call.

Each program breaks (a ``print``, ``.item()``, ``.numpy()``, ``.tolist()``) and goes on
through one resume path: a call that runs for real (positional, method, keyword names,
``f(*args, **kwargs)``), a call inside an inlined function, a ``functools.wraps``
decorator, or values made at the break from Python data.  Every test calls the compiled
function three times or more with new random values: a segment that reused a value of the
first call (an array baked in as a constant, a guard that does not see the data change)
gives a wrong answer on the second call and fails.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

import minicompile

CALLS = 4


def check_calls(fn, make_args, backend: str, calls: int = CALLS, capsys=None) -> None:
    """``fn`` compiled and eager agree on ``calls`` calls with fresh arguments, in
    results and in what they print."""
    compiled = minicompile.compile(fn, backend=backend)
    for call in range(calls):
        args = make_args()
        expected = fn(*args)
        printed = capsys.readouterr().out if capsys else None
        torch.testing.assert_close(compiled(*args), expected, msg=lambda m: f"call {call}: {m}")
        if capsys:
            assert capsys.readouterr().out == printed, f"call {call}"


def randn(device: torch.device, *shape: int):
    return lambda: (torch.randn(*shape, device=device),)


# -- the call at the break: each way of calling ------------------------------------------------


def _helper_prints(t, k):
    print("helper", k)
    return t * k + 1


class _Scaler:
    def __init__(self, k: float) -> None:
        self.k = k

    def apply(self, t, shift=0.0):
        print("apply")
        return t * self.k + shift


_SCALER = _Scaler(3.0)


def break_in_positional_call(x):
    y = x.sin()
    z = _helper_prints(y, 2.0)
    return z * x


def break_in_method_call(x):
    y = x.cos()
    z = _SCALER.apply(y)
    return z + x


def break_in_keyword_call(x):
    y = x.exp()
    z = _SCALER.apply(y, shift=x)
    return z - 1


def break_in_star_call(x):
    args = (x.tanh(),)
    kwargs = {"k": 0.5}
    z = _helper_prints(*args, **kwargs)
    return z * x


def _inlined_outer(t):
    u = t * 2
    return _helper_prints(u, 3.0) + u  # the break is one call deeper


def break_in_call_inside_inlined_function(x):
    y = x.abs()
    return _inlined_outer(y) * x


def print_then_call(x):
    y = x * 3
    print("between")
    return _inlined_outer(y.sin()) + x  # no break inside this one: it is inlined


def view_of_intermediate_mutated_after_break(x):
    c = x * 2
    rows = c[1:3]  # a view of c
    print("between")
    rows += 1  # after the break: c must see it, as in eager
    return c


RESUME_PROGRAMS = [
    view_of_intermediate_mutated_after_break,
    break_in_positional_call,
    break_in_method_call,
    break_in_keyword_call,
    break_in_star_call,
    break_in_call_inside_inlined_function,
    print_then_call,
]


@pytest.mark.parametrize("fn", RESUME_PROGRAMS, ids=lambda f: f.__name__)
def test_resume_through_call(fn, backend: str, device: torch.device, capsys) -> None:
    check_calls(fn, randn(device, 4, 8), backend, capsys=capsys)
    stats = minicompile.stats()
    assert stats["graph_breaks"] >= 1 and stats["eager_fallbacks"] == 0, stats


# -- decorators made with functools.wraps (how transformers wraps every forward) --------------


def _logged(func):
    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        print("calling", func.__name__)  # the break inside the wrapper
        return func(*args, **kwargs)

    return wrapper


@_logged
def _affine(x, *, scale=2.0, bias=None):
    return x * scale + (0.0 if bias is None else bias)


def calls_decorated_function(x, b):
    return _affine(x, scale=3.0, bias=b).relu() + 1


class _Decorated(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    @_logged
    def forward(self, input_ids=None, inputs_embeds=None, *, scale=1.0):
        if input_ids is None and inputs_embeds is None:
            raise ValueError("You have to specify either input_ids or inputs_embeds")
        h = inputs_embeds if input_ids is None else input_ids
        return self.lin(h) * scale


def test_decorated_function_called_with_keywords(backend: str, device: torch.device,
                                                capsys) -> None:
    def make():
        return torch.randn(4, 8, device=device), torch.randn(8, device=device)

    check_calls(calls_decorated_function, make, backend, capsys=capsys)
    assert minicompile.stats()["eager_fallbacks"] == 0


def test_decorated_forward_called_with_keywords(backend: str, device: torch.device,
                                               capsys) -> None:
    model = _Decorated().to(device)
    compiled = minicompile.compile(model, backend=backend)
    with torch.no_grad():
        for call in range(CALLS):
            x = torch.randn(2, 8, device=device)
            capsys.readouterr()
            expected = model(inputs_embeds=x, scale=0.5)
            printed = capsys.readouterr().out
            actual = compiled(inputs_embeds=x, scale=0.5)
            torch.testing.assert_close(actual, expected, msg=lambda m: f"call {call}: {m}")
            assert capsys.readouterr().out == printed == "calling forward\n"
            torch.testing.assert_close(compiled(x), model(x))  # positional, the same wrapper
    assert minicompile.stats()["eager_fallbacks"] == 0


# -- values made at the break from Python data -------------------------------------------------


def numpy_round_trip(x):
    a = (x * 2).cpu().numpy()
    b = np.tanh(a) + 1.0
    return torch.from_numpy(b).to(x.device) * x


def numpy_local_mutated_across_breaks(x):
    a = x.cpu().numpy().copy()
    print(end="")
    a *= 2.0  # in place: the array held in a local has new contents
    print(end="")
    return torch.from_numpy(a).to(x.device) + x.sin()


def list_built_at_break(x):
    rows = x.sum(1).tolist()
    return torch.tensor(rows, device=x.device) * 2 + x.mean(1)


def item_feeds_tensor_code(x):
    v = x.abs().max().item()
    return x / v + v


def item_in_python_arithmetic(x):
    v = x.sum().item()
    w = v * 2 + 1
    return x * w


DATA_PROGRAMS = [
    numpy_round_trip,
    numpy_local_mutated_across_breaks,
    list_built_at_break,
    item_feeds_tensor_code,
    item_in_python_arithmetic,
]


@pytest.mark.parametrize("fn", DATA_PROGRAMS, ids=lambda f: f.__name__)
def test_values_made_at_break_are_not_reused(fn, backend: str, device: torch.device) -> None:
    check_calls(fn, randn(device, 4, 8), backend)


def test_numpy_array_is_not_baked_in(backend: str, device: torch.device) -> None:
    """The segment after ``np.tanh`` once folded ``b + 1.0`` into the first call's array."""
    compiled = minicompile.compile(numpy_round_trip, backend=backend)
    x = torch.randn(4, 8, device=device)
    torch.testing.assert_close(compiled(x), numpy_round_trip(x))
    y = torch.randn(4, 8, device=device)
    torch.testing.assert_close(compiled(y), numpy_round_trip(y))
    # .cpu() breaks; the NumPy code after it is traced (capture/numpy_arrays.py), with the
    # array made at the break an input of its segment, read anew on every call.
    assert minicompile.stats()["graph_breaks"] >= 1


# -- a frame that cannot be compiled after its break runs eagerly, not interpreted ------------


def print_then_loop_of_prints(x):
    y = x.sin()
    print("start")
    for i in range(3):
        y = y * 2 + i
        print("step", i)
    return y.cos()


def test_uncompilable_rest_runs_the_original_function(backend: str, device: torch.device,
                                                      capsys) -> None:
    check_calls(print_then_loop_of_prints, randn(device, 4, 8), backend, calls=1,
                capsys=capsys)
    first = minicompile.stats()
    assert first["concrete_instructions"] > 0, first  # this call finished for real
    compiled = minicompile.compile(print_then_loop_of_prints, backend=backend)
    compiled(torch.randn(4, 8, device=device))  # a new wrapper: the same path again
    capsys.readouterr()
    after_fallback = minicompile.stats()
    for call in range(3):
        x = torch.randn(4, 8, device=device)
        expected = print_then_loop_of_prints(x)
        printed = capsys.readouterr().out
        torch.testing.assert_close(compiled(x), expected)
        assert capsys.readouterr().out == printed, f"call {call}"
    later = minicompile.stats()
    for key in ("instructions", "concrete_instructions", "frames", "graphs"):
        assert later[key] == after_fallback[key], (key, after_fallback, later)


def _try_after_break(x):
    print("start")
    for i in range(2):
        print(i)
    try:
        if x.sum().item() > 1e6:
            raise ValueError("big")
        y = x * 2
    except ValueError:
        y = x * 0
    return y


def _with_after_break(x):
    print("start")
    for i in range(2):
        print(i)
    with torch.no_grad():
        y = x * 2
    return y


@pytest.mark.parametrize("fn", [_try_after_break, _with_after_break], ids=["try", "with"])
def test_try_or_with_after_a_break(fn, backend: str, device: torch.device) -> None:
    """The concrete executor does not unwind exceptions: a frame whose rest has a handler
    is not resumed there, and its answers (and exceptions) stay eager's."""

    def make():
        x = torch.randn(4, device=device)
        return (x if torch.rand(()) < 0.5 else x + 1e7,)

    check_calls(fn, make, backend, calls=6)
