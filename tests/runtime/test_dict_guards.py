"""Guards skipped while the dicts they read keep their versions (minicompile/runtime/
dict_guards.py): whatever is changed about a module after its compiled calls, the next
calls recompile or reuse code that still fits, and return eager's values."""

from __future__ import annotations

import ast
import json
import sys
from collections.abc import Callable
from typing import Any

import pytest
import torch

import minicompile
from minicompile import compat
from minicompile.runtime.dict_guards import CHURN, RECORDS, right_after_check
from minicompile.runtime.guard_paths import Analysis, path_of, plain_path

SCALE = 2.0  # a global the forward reads


class Cache:
    """Like transformers' StaticCache: tensors held in a list of a plain object."""

    def __init__(self) -> None:
        self.keys = [torch.randn(4), torch.randn(4)]


def make_net() -> torch.nn.Module:
    class Net(torch.nn.Module):  # a class of its own per test: one test changes it
        factor = 1.0  # a class attribute the forward reads

        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)
            self.register_buffer("offset", torch.randn(4))
            self.sizes = [1, 2]
            self.opts = {"shift": 0.5}
            self.alpha = 3.0
            self.cache = Cache()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.lin(x).sum(-1, keepdim=True) * SCALE * self.factor
            y = h + self.offset * getattr(self, "alpha", 1.0) + len(self.sizes)
            y = y + self.opts["shift"]
            for k in self.cache.keys:
                y = y + k
            return y * 2 if self.training else y

    torch.manual_seed(0)
    return Net().eval()


def compiled_net(needs_versions: bool = False) -> tuple[torch.nn.Module, Any]:
    """A fresh :func:`make_net` and its compiled form (C++ backend), after a reset;
    ``needs_versions``: the test is skipped where there are no dict versions."""
    if needs_versions and compat.DICT_VERSION is None:
        pytest.skip("no dict versions on this Python / PyTorch: every check runs")
    minicompile.reset()
    net = make_net()
    return net, minicompile.compile(net, backend="cpp")


def _set_global(value: float) -> None:
    sys.modules[__name__].SCALE = value  # type: ignore[attr-defined]


def _other_shape(m: torch.nn.Module) -> None:
    m.lin.weight.data = torch.randn(6, 4)
    m.lin.bias.data = torch.randn(6)


def _delete(m: torch.nn.Module) -> None:
    del m.alpha


MUTATIONS: dict[str, Callable[[torch.nn.Module], object]] = {
    "submodule": lambda m: setattr(m, "lin", torch.nn.Linear(4, 4)),
    "parameter": lambda m: setattr(m.lin, "weight", torch.nn.Parameter(torch.randn(4, 4))),
    "data of another shape": _other_shape,
    "requires_grad_": lambda m: m.lin.requires_grad_(False),
    "train": lambda m: m.train(),
    "del attribute": _delete,
    "class attribute": lambda m: setattr(type(m), "factor", 5.0),
    "global": lambda m: _set_global(3.0),
    "buffer": lambda m: setattr(m, "offset", torch.randn(4)),
    "list append": lambda m: m.sizes.append(3),
    "dict item": lambda m: m.opts.__setitem__("shift", 1.5),
    "cache list replaced": lambda m: setattr(m.cache, "keys", [torch.randn(4), torch.randn(4)]),
    "cache item replaced": lambda m: m.cache.keys.__setitem__(1, torch.randn(4)),
}


def _gates(compiled: torch.nn.Module) -> list:
    fn = compiled.__dict__["_compiled"]
    return [getattr(e.capture.guards.check, "__self__", None) for e in fn.entries]


def _check(compiled: torch.nn.Module, net: torch.nn.Module) -> None:
    for _ in range(2):  # fresh values each call
        x = torch.randn(3, 4)
        got, want = compiled(x), net(x)
        torch.testing.assert_close(got, want)
        assert got.requires_grad == want.requires_grad


@pytest.mark.parametrize("change", list(MUTATIONS))
def test_mutation_after_compiled_calls_matches_eager(change: str, backend: str) -> None:
    minicompile.reset()
    net = make_net()
    compiled = minicompile.compile(net, backend=backend)
    try:
        _check(compiled, net)
        _check(compiled, net)
        if compat.DICT_VERSION is not None:  # the covered checks were being skipped
            (gate,) = _gates(compiled)
            assert gate is not None and gate.versions is not None
        MUTATIONS[change](net)
        _check(compiled, net)
    finally:
        _set_global(2.0)


def test_covered_checks_are_skipped() -> None:
    """Module, parameter and hook checks run only when a dict they read moved; the
    identity of the module, the input's checks and the tensor metadata run every call."""
    net, compiled = compiled_net(needs_versions=True)
    with torch.no_grad():
        compiled(torch.randn(3, 4))
        compiled(torch.randn(3, 4))
    (gate,) = _gates(compiled)
    (covered, *_), = gate.functions
    exprs = [gate.guards.run_checks[i].expr for i in covered]
    assert any("_parameters" in e for e in exprs) and any("_forward_hooks" in e for e in exprs)
    assert any("'training'" in e or ".training" in e for e in exprs)
    assert not any(e.startswith(("L_self is", "type(L_x)", "L_x.")) for e in exprs)
    assert not any(e.startswith("len(") or "keys[" in e or "factor" in e for e in exprs)
    # The tensors read through dicts are held; the cache's, in a list, read each call.
    assert all(any(h is t for h in gate.held) for t in (*net.lin.parameters(), net.offset))
    assert not any(h is t for h in gate.held for t in net.cache.keys)
    before = gate.records
    net.lin.weight.data.add_(1.0)  # values only: no dict moved, no recompile
    x = torch.randn(3, 4)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), net(x))
    assert gate.records == before and minicompile.stats()["recompiles"] == 0


def test_a_dict_written_every_call_stops_being_recorded() -> None:
    """A loop that writes an attribute of the module between calls moves its ``__dict__``
    every call: after two moves that dict is left out (the checks through it run every
    call) and the gate stops recording, with eager's values throughout."""
    net, compiled = compiled_net()
    with torch.no_grad():
        for step in range(8):
            net.step = step  # (read by nothing compiled)
            x = torch.randn(3, 4)
            torch.testing.assert_close(compiled(x), net(x))
        if compat.DICT_VERSION is not None:
            (gate,) = _gates(compiled)
            assert gate.records <= 4 and gate.versions is not None, gate.records
            before = gate.records
            net.alpha = 4.0  # a value a check reads, through the dict left out
            x = torch.randn(3, 4)
            torch.testing.assert_close(compiled(x), net(x))
            assert gate.records == before


def test_a_dict_written_now_and_then_stays_covered() -> None:
    """An attribute written once per many calls (an epoch's ``eval()``, what ``generate``
    sets per call) moves the module's ``__dict__`` now and then: each record pays for
    itself, so the dict is never counted as churning and its checks stay covered."""
    net, compiled = compiled_net()
    skipped = []
    with torch.no_grad():
        for epoch in range(CHURN + 2):
            net.epoch = epoch  # (read by nothing compiled)
            for _ in range(RECORDS + 1):
                x = torch.randn(3, 4)
                torch.testing.assert_close(compiled(x), net(x))
            if compat.DICT_VERSION is not None:
                (gate,) = _gates(compiled)
                skipped.append(gate.skipped)
        net.alpha = 5.0  # a value a check reads through that dict: noticed
        x = torch.randn(3, 4)
        torch.testing.assert_close(compiled(x), net(x))
    if compat.DICT_VERSION is not None:
        assert gate.versions is not None and skipped[0] > 0, skipped
        assert skipped == [skipped[0]] * len(skipped)


def test_inputs_read_what_is_held_only_right_after_a_fast_pass() -> None:
    """get_inputs reads the parameters the gate holds only on the arguments whose check
    just passed the fast function, the dicts unchanged since: a parameter replaced in
    between, or other arguments, are read by their paths."""
    net, compiled = compiled_net(needs_versions=True)
    x = torch.randn(3, 4)
    torch.set_grad_enabled(False)
    try:
        _held_inputs(compiled, net, x)
    finally:
        torch.set_grad_enabled(True)


def _held_inputs(compiled: torch.nn.Module, net: torch.nn.Module, x: torch.Tensor) -> None:
    for _ in range(3):
        compiled(torch.randn(3, 4))
    function = compiled.__dict__["_compiled"]
    (entry,) = function.entries
    guards, get_inputs = entry.capture.guards, entry.capture.get_inputs
    (gate,) = _gates(compiled)
    frame = function.bind(net, x)
    slow = gate.slow_inputs(*frame)
    assert guards.check(*frame)
    gate.slow_inputs = None  # (the held parameters alone answer)
    fast = get_inputs(*frame)
    assert len(fast) == len(slow) and all(a is b for a, b in zip(fast, slow))
    gate.slow_inputs = entry.capture.guards.namespace["get_inputs"]
    assert guards.check(*frame)
    net.lin.weight = torch.nn.Parameter(torch.randn(4, 4))  # between check and inputs
    assert any(t is net.lin.weight for t in get_inputs(*frame))
    assert guards.check(*frame)
    other = function.bind(net, torch.randn(3, 4))
    assert get_inputs(*other)[slow.index(next(t for t in slow if t is x))] is other[1]
    for _ in range(2):
        y = torch.randn(3, 4)
        torch.testing.assert_close(compiled(y), net(y))


def test_a_run_reads_what_is_held_on_its_own_check_pass_only() -> None:
    """An entry's run, which the API calls right after its check passed, reads the held
    parameters on that pass alone (the versions are not compared again); a run after no
    pass of its own reads by paths; a parameter replaced between calls is read anew."""
    net, compiled = compiled_net(needs_versions=True)
    with torch.no_grad():
        for _ in range(3):
            compiled(torch.randn(3, 4))
        function = compiled.__dict__["_compiled"]
        (entry,) = function.entries
        (gate,) = _gates(compiled)
        run_inputs = right_after_check(entry.capture.get_inputs)
        frame = function.bind(net, torch.randn(3, 4))
        slow, read = gate.slow_inputs, []
        gate.slow_inputs = lambda *a: read.append(a) or slow(*a)
        assert entry.capture.guards.check(*frame)
        held = run_inputs(*frame)
        assert not read and any(t is net.lin.weight for t in held)
        run_inputs(*frame)  # (the token was taken)
        assert len(read) == 1
        gate.slow_inputs = slow
        for _ in range(2):
            net.lin.weight = torch.nn.Parameter(torch.randn(4, 4))
            for _ in range(2):
                x = torch.randn(3, 4)
                torch.testing.assert_close(compiled(x), net(x))


class ArgLayer:
    def __init__(self, scale: float, device: torch.device) -> None:
        self.scale = scale
        self.offset = torch.randn(4, device=device)


class ArgCache:
    """Like transformers' StaticCache passed at each decode step: layers in a list."""

    def __init__(self, device: torch.device) -> None:
        self.layers = [ArgLayer(1.0, device), ArgLayer(2.0, device)]


def _through_cache(x: torch.Tensor, cache: ArgCache) -> torch.Tensor:
    for layer in cache.layers:
        x = x * layer.scale + layer.offset
    return x


def test_objects_held_from_an_argument_are_seen_changed(backend: str,
                                                         device: torch.device) -> None:
    """Objects reached from an argument (a cache's layers, in a list) are held by identity
    while the same ones come back, their checks skipped: a value changed in one, a layer
    replaced in the list, a new cache, each is seen (eager's values)."""
    minicompile.reset()
    compiled = minicompile.compile(_through_cache, backend=backend)
    cache = ArgCache(device)

    def same(calls: int = 2) -> None:
        for _ in range(calls):
            x = torch.randn(4, device=device)
            torch.testing.assert_close(compiled(x, cache), _through_cache(x, cache))

    same(4)
    if compat.DICT_VERSION is not None:
        (entry,) = compiled.entries
        gate = entry.capture.guards.check.__self__
        assert gate.held[-1] == cache.layers, gate.held[-1]  # (held by identity)
    cache.layers[1].scale = 5.0  # read by a check through the layer's dict
    same()
    cache.layers[0] = ArgLayer(3.0, device)  # the list's item: another object
    same()
    cache = ArgCache(device)  # a new cache (the next generate call)
    cache.layers[0].scale = 7.0
    same()
    for _ in range(2):  # new caches with the first one's values: its entry, no compile
        cache = ArgCache(device)
        same()
    assert minicompile.stats()["graphs"] == 4  # (one per new value of a scale)


def test_objects_new_at_every_call_are_not_held() -> None:
    """An argument's object new at every call is held no more after a few records, and the
    gate over the module's dicts keeps serving (it never gives up for that)."""
    if compat.DICT_VERSION is None:
        pytest.skip("no dict versions on this Python / PyTorch: every check runs")
    minicompile.reset()
    lin = torch.nn.Linear(4, 4)

    class CacheNet(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = lin

        def forward(self, x: torch.Tensor, cache: ArgCache) -> torch.Tensor:
            return _through_cache(self.lin(x), cache)

    net = CacheNet()
    compiled = minicompile.compile(net, backend="cpp")
    with torch.no_grad():
        for _ in range(RECORDS + 2):
            x, cache = torch.randn(4), ArgCache(torch.device("cpu"))
            torch.testing.assert_close(compiled(x, cache), net(x, cache))
    (gate,) = _gates(compiled)
    assert gate.versions is not None and gate.held[-1] == [] and gate.records <= 4


SETTINGS: dict = {}


def test_an_empty_dict_filled_by_update_is_seen(backend: str, device: torch.device) -> None:
    """A value read from a dict that was empty (``SETTINGS.get``): PyTorch's version tags on
    CPython 3.12+ miss an ``update()`` into an empty dict (the CLONED event), so the gate
    checks a dict empty at its record for staying empty, not by its tag."""
    SETTINGS.clear()

    def f(x):
        return x * SETTINGS.get("scale", 1.0)

    compiled = minicompile.compile(f, backend=backend)
    for _ in range(3):
        x = torch.randn(8, device=device)
        torch.testing.assert_close(compiled(x), f(x))
    SETTINGS.update(scale=3.0)
    for _ in range(2):
        x = torch.randn(8, device=device)
        torch.testing.assert_close(compiled(x), x * 3.0)
    SETTINGS.clear()


def test_what_checks_read_survives_json() -> None:
    """runtime/guard_paths.py: the paths and modes of each check, and the identity checks,
    read back from JSON as worked out; a key JSON cannot keep stores nothing."""
    namespace = {"M": object(), "G": {}, "T": int}
    exprs = ["L_self._modules['fc'].training == False", "L_self._modules['fc'] is M",
             "G.get('k', G.get('j')) is None", "type(getattr(L_self, 'alpha', 1.0)) is T",
             "len(L_self.sizes[0]) == 2", "L_self.f(1) == 2", "not L_self.opts"]
    analysis = Analysis.of(exprs, ["L_self"], namespace)
    assert analysis.reads[5] is None and analysis.identities == {
        1: (("L_self", (("attr", "_modules"), ("item", "fc"))), "M")}
    back = Analysis.from_json(json.loads(json.dumps(analysis.to_json())), len(exprs))
    assert back == analysis
    assert Analysis.from_json(analysis.to_json(), len(exprs) + 1) is None
    assert Analysis.of(["L_self._modules[b'fc'] is M"], ["L_self"], namespace).to_json() is None


def test_paths_written_plainly_are_read_without_parsing() -> None:
    """guard_paths.plain_path: a path written plainly is what ``ast`` makes of it; anything
    else (other spellings, keywords, escapes, names the guards do not know) is left to it."""
    params, namespace = {"L_self", "L_x"}, {"G": {}}
    plain = ["L_self._modules['features']._modules['conv0']._parameters['weight']", "L_x",
             "G['a b'][0].c", "L_self['a]b']['']", "L_self.match[10]"]
    other = ["L_self[00]", "L_self[-1]", "L_self.None", "True.x", r"L_self['a\'b']",
             "L_self['é']", "L_self .a", 'L_self["a"]', "H.x", "L_self[0x1]", "L_self[1_0]",
             "L_self.f(1)", "L_self._modules['fc'] is G"]
    for expr in plain + other:
        got = plain_path(expr, params, namespace)
        if expr in other:
            assert got is None, expr
        else:
            assert got == path_of(ast.parse(expr, mode="eval").body, params, namespace), expr
