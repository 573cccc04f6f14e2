"""The program suite: small realistic functions and modules, compiled and compared with eager.

For each (case, backend) the function (or a module built by the case) is compiled once and
called twice on fresh random inputs.  Each call is compared with an eager run of the same
code on deep copies of the inputs (and of the module): the return value, every input after
the call (in-place updates, views, list appends, object attributes), the module's
parameters, buffers and Python attributes, the globals the case declares, the text printed,
and which outputs alias which inputs.  The first call must compile the case's graphs
without falling back to eager; the second must reuse them: no capture, no recompile, no
bytecode interpreted (``stats()["instructions"]`` does not move).
"""

from __future__ import annotations

import contextlib
import copy
import io
import zlib
from typing import Any

import pytest
import torch
from compare import assert_aliasing, assert_matches, assert_modules_match
from effect_programs import BREAK_CASES, EFFECT_CASES
from module_programs import MODULE_CASES
from programs import FUNCTION_CASES, Program

import minicompile

from devices import device_for

CASES: list[Program] = FUNCTION_CASES + EFFECT_CASES + MODULE_CASES + BREAK_CASES
CALLS = 2
# Counters the second call must leave alone ("instructions": bytecode instructions the
# capture interpreted since reset()).
REUSE_KEYS = ("frames", "graphs", "graph_breaks", "recompiles", "eager_fallbacks", "instructions")


def _check_names() -> None:
    names = [c.name for c in CASES]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    assert not duplicates, f"duplicate program names: {duplicates}"


_check_names()


def run(fn: Any, args: tuple, kwargs: dict, case: Program) -> tuple[Any, str, Any]:
    """Call ``fn`` with the case's global state reset; return (result, stdout, state)."""
    if case.state is not None:
        case.state.reset()
    out = io.StringIO()
    grad = torch.no_grad() if (case.no_grad or case.module) else contextlib.nullcontext()
    with grad, contextlib.redirect_stdout(out):
        result = fn(*args, **kwargs)
    state = copy.deepcopy(case.state.read()) if case.state is not None else None
    return result, out.getvalue(), state


def why_eager(compiled: Any) -> str:
    """The recorded reasons a compiled function (or its entries) runs eagerly, for messages."""
    compiled = vars(compiled).get("_compiled", compiled)  # a module wrapper's forward
    reasons = [getattr(compiled, "eager_reason", None)]
    reasons += [getattr(e, "eager_reason", None) for e in getattr(compiled, "entries", ())]
    return "; ".join(r.splitlines()[0] for r in reasons if r) or "reason not recorded"


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_program_matches_eager(
    case: Program, backend: str, request: pytest.FixtureRequest
) -> None:
    device = device_for(backend)
    torch.manual_seed(zlib.crc32(case.name.encode()))
    repro = f"repro: pytest '{request.node.nodeid}'"
    model = eager_model = None
    if case.module is not None:
        model = case.module().to(device)
        eager_model = copy.deepcopy(model)
        compiled, eager = minicompile.compile(model, backend=backend), eager_model
    else:
        compiled, eager = minicompile.compile(case.fn, backend=backend), case.fn

    first: dict[str, int] = {}
    for call in range(CALLS):
        where = f"{case.name} on {backend}, call {call} ({repro})"
        args, kwargs = case.sample(device)
        eager_args, eager_kwargs = copy.deepcopy((args, kwargs))
        expected, expected_out, expected_state = run(eager, eager_args, eager_kwargs, case)
        actual, actual_out, actual_state = run(compiled, args, kwargs, case)

        assert_matches(actual, expected, f"{where}: result", case.tol)
        assert_matches(args, eager_args, f"{where}: positional inputs after the call", case.tol)
        assert_matches(kwargs, eager_kwargs, f"{where}: keyword inputs after the call", case.tol)
        assert_aliasing(actual, expected, (args, kwargs), (eager_args, eager_kwargs), where)
        assert actual_out == expected_out, (
            f"{where}: printed {actual_out!r}, eager printed {expected_out!r}"
        )
        if case.state is not None:
            assert_matches(actual_state, expected_state, f"{where}: globals", case.tol)
        if model is not None:
            assert_modules_match(model, eager_model, where, case.tol)

        stats = minicompile.stats()
        if call == 0:
            first = stats
            assert stats["eager_fallbacks"] == 0, f"{where}: ran eagerly ({why_eager(compiled)})"
            assert stats["graphs"] == case.graphs, f"{where}: {case.graphs} graphs wanted: {stats}"
            assert stats["graph_breaks"] == case.breaks, (
                f"{where}: {case.breaks} graph breaks expected: {stats}"
            )
            assert stats["recompiles"] == 0, f"{where}: {stats}"
        elif case.max_recompiles:
            assert stats["recompiles"] <= case.max_recompiles, f"{where}: {stats}"
            assert stats["eager_fallbacks"] == 0, f"{where}: ran eagerly: {stats}"
        else:
            moved = {
                k: (first.get(k), stats.get(k)) for k in REUSE_KEYS if first.get(k) != stats.get(k)
            }
            assert not moved, f"{where}: the second call did not reuse the first's code: {moved}"

        if case.between is not None:
            case.between(model)
            case.between(eager_model)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_case_is_deterministic_in_eager(case: Program, device: torch.device) -> None:
    """The table itself: eager against eager on deep copies agrees, so a failure of the
    differential test above is the compiler's, never a flaky case."""
    torch.manual_seed(zlib.crc32(case.name.encode()))
    if case.module is not None:
        first = case.module().to(device)
        second = copy.deepcopy(first)
    else:
        first = second = case.fn
    for call in range(CALLS):
        args, kwargs = case.sample(device)
        copies = copy.deepcopy((args, kwargs))
        expected, expected_out, expected_state = run(second, *copies, case)
        actual, actual_out, actual_state = run(first, args, kwargs, case)
        where = f"{case.name}, eager, call {call}"
        assert_matches(actual, expected, where, case.tol)
        assert_matches((args, kwargs), copies, f"{where}: inputs", case.tol)
        assert_aliasing(actual, expected, (args, kwargs), copies, where)
        assert actual_out == expected_out, where
        assert_matches(actual_state, expected_state, f"{where}: globals", case.tol)
        if case.module is not None:
            assert_modules_match(first, second, where, case.tol)
            if case.between is not None:
                case.between(first)
                case.between(second)
