"""Guards: pass on inputs with the traced metadata, fail readably on any change."""

from __future__ import annotations

import types

import pytest
import torch
from capture_helpers import capture

from minicompile.capture import frame_args
from minicompile.runtime.guards import GuardCheck, Guards

OFFSET = 1.0


def f(x, n, flag=True, dtype=torch.float32):
    y = x * n + OFFSET
    if flag:
        y = y.to(dtype)
    return y


def frame(*args, **kwargs):
    return frame_args(f, args, kwargs)


@pytest.fixture
def cap():
    return capture(f, torch.randn(4, 8), 2)[0]


def test_source_is_readable(cap) -> None:
    src = str(cap.guards)
    assert src.startswith("def check(L_x, L_n, L_flag, L_dtype):")
    for line in (
        "if not (type(L_x) is Tensor):  # L['x'] type",
        "if not (L_x.dtype is torch.float32):  # L['x'] dtype",
        "if not (L_x.shape == (4, 8)):  # L['x'] sizes",
        "if not (L_x.stride() == (8, 1)):  # L['x'] strides",
        "if not (L_x.requires_grad is False):  # L['x'] requires_grad",
        "if not (type(L_n) is int):  # L['n'] type",
        "if not (L_n == 2):  # L['n'] value",
        "if not (L_flag is True):  # L['flag'] value",
        "if not (G['OFFSET'] == 1.0):  # G['OFFSET'] value",
        "if not (is_grad_enabled() is True):  # global grad mode",
    ):
        assert line in src, line


def test_shared_paths_are_read_once_where_always_read() -> None:
    """A path several checks read becomes a local at its first unconditional read; one
    read only behind ``or`` stays in place, so the check never reads what eager's
    short-circuit would not."""
    checks = [
        GuardCheck("L['x']", "value", "L_x is None or L_x.inner.a == 1", "L_x", None),
        GuardCheck("L['x']", "value", "L_x is None or L_x.inner.b == 2", "L_x", None),
        GuardCheck("L['y']", "value", "L_y.inner.a == 1", "L_y", None),
        GuardCheck("L['y']", "value", "L_y.inner.b == 2", "L_y", None),
    ]
    guards = Guards(["L_x", "L_y"], checks, {})
    assert "p0 = L_y.inner" in guards.source and "L_x.inner.a" in guards.source
    inner = types.SimpleNamespace(inner=types.SimpleNamespace(a=1, b=2))
    wrong = types.SimpleNamespace(inner=types.SimpleNamespace(a=1, b=3))
    assert guards.check(None, inner) and guards.check(inner, inner)
    assert not guards.check(inner, wrong) and not guards.check(wrong, inner)


def test_pass_on_same_metadata(cap) -> None:
    assert cap.guards.check(*frame(torch.zeros(4, 8), 2))
    assert cap.guards.explain_failure(*frame(torch.zeros(4, 8), 2)) is None


@pytest.mark.parametrize(
    "args,message",
    [
        ((torch.randn(4, 8).half(), 2), "L['x'] dtype: expected torch.float32, got torch.float16"),
        ((torch.randn(4, 9), 2), "L['x'] size mismatch at index 1: expected 8, got 9"),
        ((torch.randn(4, 8, 1), 2), "L['x'] sizes: expected (4, 8), got (4, 8, 1)"),
        ((torch.randn(8, 4).t(), 2), "L['x'] stride mismatch at index 0: expected 8, got 1"),
        ((torch.randn(4, 8, device="meta"), 2), "L['x'] device: expected cpu, got meta"),
        (
            (torch.randn(4, 8, requires_grad=True), 2),
            "L['x'] requires_grad: expected False, got True",
        ),
        (
            (torch.nn.Parameter(torch.randn(4, 8)), 2),
            "L['x'] type: expected torch.Tensor, got torch.nn.parameter.Parameter",
        ),
        (([1.0], 2), "L['x'] type: expected torch.Tensor, got list"),
        ((torch.randn(4, 8), 3), "L['n'] value: expected 2, got 3"),
        ((torch.randn(4, 8), 2.0), "L['n'] type: expected int, got float"),
        ((torch.randn(4, 8), 2, False), "L['flag'] value: expected True, got False"),
    ],
    ids=[
        "dtype",
        "size",
        "rank",
        "stride",
        "device",
        "requires_grad",
        "subclass",
        "type",
        "int value",
        "int type",
        "bool",
    ],
)
def test_fail_with_reason(cap, args, message) -> None:
    fr = frame(*args)
    assert cap.guards.check(*fr) is False
    assert cap.guards.explain_failure(*fr) == message


def test_dtype_argument_guard(cap) -> None:
    fr = frame(torch.randn(4, 8), 2, True, torch.float16)
    assert not cap.guards.check(*fr)
    assert cap.guards.explain_failure(*fr) == (
        "L['dtype'] value: expected torch.float32, got torch.float16"
    )


def test_unread_argument_is_not_guarded() -> None:
    cap, fr = capture(f, torch.randn(4, 8), 2, False, torch.float16)
    assert "L['dtype']" not in str(cap.guards)
    assert cap.guards.check(*frame(torch.randn(4, 8), 2, False, torch.int8))


def test_global_change_fails(cap, monkeypatch) -> None:
    monkeypatch.setitem(globals(), "OFFSET", 2.0)
    fr = frame(torch.randn(4, 8), 2)
    assert not cap.guards.check(*fr)
    assert cap.guards.explain_failure(*fr) == "G['OFFSET'] value: expected 1.0, got 2.0"


def uses_torch(x):
    return torch.sin(x)


def test_global_module_identity(monkeypatch) -> None:
    cap, fr = capture(uses_torch, torch.randn(3))
    assert "if not (G.get('torch') is torch):  # G['torch'] identity" in str(cap.guards)
    monkeypatch.setitem(globals(), "torch", types.SimpleNamespace())
    assert not cap.guards.check(*fr)
    assert cap.guards.explain_failure(*fr).startswith("G['torch'] identity: expected <module")


def test_deleted_global_fails_without_raising(cap, monkeypatch) -> None:
    monkeypatch.delitem(globals(), "OFFSET")
    fr = frame(torch.randn(4, 8), 2)
    assert cap.guards.check(*fr) is False
    assert "G['OFFSET'] type" in cap.guards.explain_failure(*fr)


def test_grad_mode(cap) -> None:
    fr = frame(torch.randn(4, 8), 2)
    with torch.no_grad():
        assert not cap.guards.check(*fr)
        assert cap.guards.explain_failure(*fr) == "global grad mode: expected True, got False"


def test_closure_cell_contents() -> None:
    k = 2

    def g(x):
        return x * k

    cap, fr = capture(g, torch.randn(3))
    assert cap.guards.check(*fr)
    k = 5  # noqa: F841  (rebinds the cell g reads)
    assert not cap.guards.check(*fr)
    assert cap.guards.explain_failure(*fr) == "C['k'] value: expected 2, got 5"


def test_inlined_function_identity(monkeypatch) -> None:
    def h(x):
        return helper(x)

    cap, fr = capture(h, torch.randn(3))
    assert cap.guards.check(*fr)
    monkeypatch.setitem(globals(), "helper", lambda x: x)
    assert not cap.guards.check(*fr)
    assert "G['helper'] identity" in cap.guards.explain_failure(*fr)


def helper(x):
    return x.exp() * SCALE2


SCALE2 = 3


def test_tuple_argument_guards() -> None:
    def g(pair, x):
        a, b = pair
        return a + b + x

    cap, fr = capture(g, (torch.ones(2), torch.ones(2)), torch.ones(2))
    assert cap.guards.check(*fr)
    bad = ((torch.ones(2),), torch.ones(2))
    assert cap.guards.explain_failure(*bad) == "L['pair'] length: expected 2, got 1"
    assert cap.guards.check(*bad) is False


def test_get_inputs_is_generated_flat_code() -> None:
    def g(pair, x):
        return pair[1] + x + WEIGHT

    cap, fr = capture(g, (torch.ones(2), torch.ones(2)), torch.ones(2))
    assert cap.get_inputs_source == (
        "def get_inputs(L_pair, L_x):\n    return [L_pair[1], L_x, G['WEIGHT']]\n"
    )
    inputs = cap.get_inputs(*fr)
    assert inputs[0] is fr[0][1] and inputs[1] is fr[1] and inputs[2] is WEIGHT


WEIGHT = torch.ones(2)



class _Flag:
    pass


class _Modes:  # (transformers' deprecation Action enum: members read, compared with `is`)
    ON = _Flag()
    OFF = _Flag()


def _by_mode(x):
    mode = _Modes.ON
    return x - 1 if mode is _Modes.OFF else x + 1


class _Drop(torch.nn.Module):
    def forward(self, x):
        return torch.nn.functional.dropout(x, 0.5, self.training) * 2


def test_is_guards_identities_and_each_predicate_is_checked_once() -> None:
    """``a is b`` between two objects guards both by identity, in place of their type
    checks (before, only the types: making OFF the same object as ON went unnoticed, a
    wrong answer); a singleton read through two spellings (``m.training`` by the module
    check and by the forward) is checked once, and a flipped flag still recompiles."""
    import minicompile

    g = minicompile.compile(_by_mode, backend="cpp")
    x = torch.randn(3)
    torch.testing.assert_close(g(x), x + 1)
    (checks,) = [e.capture.guards.checks for e in g.entries]
    assert [c.kind for c in checks if c.source.endswith((".ON", ".OFF"))] == ["identity"] * 2
    old = _Modes.OFF
    try:
        _Modes.OFF = _Modes.ON  # eager now takes the other branch
        torch.testing.assert_close(g(x), _by_mode(x))
    finally:
        _Modes.OFF = old
    torch.testing.assert_close(g(x), x + 1)

    m = _Drop().eval()
    c = minicompile.compile(m, backend="cpp")
    torch.testing.assert_close(c(x), x * 2)
    (checks,) = [e.capture.guards.checks for e in c.__dict__["_compiled"].entries]
    assert len([ch for ch in checks if ch.source.endswith(".training")]) == 1
    m.train()
    y = torch.ones(64)
    torch.manual_seed(0)
    out = c(y)
    torch.manual_seed(0)
    torch.testing.assert_close(out, m(y))
    assert (out == 0).any()  # dropout ran: the flipped flag was noticed
