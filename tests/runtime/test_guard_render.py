"""The guard function's source (runtime/guard_render.py): shared access paths read once,
where the first check reads them unconditionally; same answers as the checks one by one."""

from __future__ import annotations

import random
import types

import pytest

from minicompile.runtime import guard_render
from minicompile.runtime.guards import GuardCheck, Guards


def _guards(params: list[str], exprs: list[str], namespace: dict | None = None) -> Guards:
    checks = [GuardCheck(f"check {i}", "value", e, "None", None) for i, e in enumerate(exprs)]
    return Guards(params, checks, dict(namespace or {}))


class Counted:
    """An object that counts reads of its attributes."""

    def __init__(self, reads: dict, **values) -> None:
        object.__setattr__(self, "_reads", reads)
        object.__setattr__(self, "_values", values)

    def __getattr__(self, name: str):
        self._reads[name] = self._reads.get(name, 0) + 1
        return self._values[name]


def test_a_path_two_checks_read_is_read_once() -> None:
    guards = _guards(["L_x"], ["L_x.inner.a == 1", "L_x.inner.b == 2", "L_x.inner.a > 0"])
    assert guards.source.count("L_x.inner") == 1  # p0 = L_x.inner
    assert "p1 = p0.a" in guards.source
    reads: dict = {}
    x = Counted(reads, inner=Counted(reads, a=1, b=2))
    assert guards.check(x)
    assert reads == {"inner": 1, "a": 1, "b": 1}


@pytest.mark.parametrize("expr", [
    "L_x is None or L_x.inner.a == 1",
    "L_x is not None and L_x.inner.a == 1",
    "L_x.inner.a == 1 if L_x is not None else True",
    "(lambda: L_x.inner.a == 1)()",
    "all(L_x.inner.a == v for v in (1,))",
    "0 < 1 <= L_x.inner.a",
])
def test_a_conditional_read_is_not_hoisted(expr: str) -> None:
    """The first check reads ``L_x.inner`` only sometimes: no local is made there, and a
    later unconditional read makes it."""
    guards = _guards(["L_x"], [expr, "L_x.inner.a == 1"])
    first, second = [line for line in guards.source.splitlines() if "if not" in line]
    assert "p0" not in first and "L_x.inner.a" in first
    assert "p0 = L_x.inner" in guards.source and "p1" in second
    if "is None" in expr:
        assert _guards(["L_x"], [expr]).check(None)
    assert guards.check(types.SimpleNamespace(inner=types.SimpleNamespace(a=1)))


def test_a_local_made_earlier_is_read_behind_or() -> None:
    guards = _guards(["L_x"], ["L_x.inner.a == 1", "L_x.inner.b == 2",
                               "L_x.c or L_x.inner.a == 1"])
    last = [line for line in guards.source.splitlines() if "if not" in line][-1]
    assert "L_x.inner" not in last and "p1 == 1" in last


def test_a_call_keeps_its_method_and_check_order_is_kept() -> None:
    guards = _guards(["L_m"], ["L_m._modules.get('a') is A", "L_m._modules['a'].w == 1",
                               "L_m._modules.get('b') is None"], {"A": int})
    lines = guards.source.splitlines()
    assert "    p0 = L_m._modules" in lines
    assert "p0.get('a') is A" in guards.source and "p0.get('b') is None" in guards.source
    comments = [line.split("# ")[1] for line in lines if "# " in line]
    assert comments == ["check 0 value", "check 1 value", "check 2 value"]


def test_a_lambda_variable_is_not_an_outer_path() -> None:
    """``stride[0]`` inside ``lambda stride: ...`` is the lambda's argument, even where a
    parameter has the same name and other checks read ``stride[0]``."""
    guards = _guards(["stride", "L_x"], [
        "stride[0] == 1", "stride[0] >= 0",
        "(lambda stride: (stride[0],) == (4,))(L_x.s)",
    ])
    assert "(lambda stride: (stride[0],) == (4,))(L_x.s)" in guards.source
    assert guards.check([1], types.SimpleNamespace(s=(4,)))
    assert not guards.check([1], types.SimpleNamespace(s=(1,)))


# -- the scanner cuts checks as ast does ---------------------------------------------------

ODD = [
    "L_x['a'].b == 1",
    'L_x["a"].b == 1',  # the other quotes: same key as ['a']
    "L_x['it\\'s'].b == 1",
    "L_x['a[b'] == 1",  # a bracket in a string
    "'L_x.a.b' == L_x.a.b",  # a path inside a string is none
    "(L_x).a.b == 1",  # brackets around the root: parsed whole
    "L_x .a.b == 1",
    "L_x.a[(0)] == 1",
    "L_x.a[0].b == 1 and L_x.a[-1] == 2",
    "f'{L_x.a.b}' == '1'",  # an f-string holds code
    "L_x.a.b == 1  # a comment",
    "L_x.a.b == (1 +\n 0)",  # over two lines
    "None.__class__ is type(None) and L_x.a.b",
    "L_x.a.b(L_x.a.c)[0].d is None",
    "[v.a for v in L_x.a.b] == [1]",
    "L_x.a.b if L_x.a.c else L_x.a.d",
    "L_x.a.b == 1.5 and L_x.a.b != 1e3 and L_x.a.c == 0x10",
    "L_x.__mcp__ == 1",
    "L_x.a.b == b'L_x.a.c' and L_x.a.c == r'\\x'",
    "L_x.a.é == 1",
    '"""L_x.a.b""" == L_x.a.b',
]


@pytest.mark.parametrize("expr", ODD)
def test_scanner_cuts_as_ast_does(expr: str) -> None:
    (paths, template), = guard_render._Parser().cut_all([expr])
    whole_paths, whole = guard_render._parse_whole(expr)
    assert template == whole
    assert paths == whole_paths


def test_hoisting_does_not_depend_on_spelling() -> None:
    """``L_x["a"]`` and ``L_x['a']`` are one path; ``(L_x).a`` (parsed whole) is too."""
    guards = _guards(["L_x"], ['L_x["a"].b == 1', "L_x['a'].c == 2", "(L_x)['a'].b == 1"])
    assert "p0 = L_x['a']" in guards.source and "p1 = p0.b" in guards.source
    assert guards.source.count("p1 == 1") == 2


# -- random checks on random trees ---------------------------------------------------------


def _tree(rng: random.Random, depth: int) -> types.SimpleNamespace:
    node = types.SimpleNamespace(v=rng.randint(0, 2), opt=None,
                                 d={"k": rng.randint(0, 2), "j": [rng.randint(0, 2)]})
    if depth and rng.random() < 0.7:
        node.opt = _tree(rng, depth - 1)
    for name in ("a", "b")[: depth and 2]:
        setattr(node, name, _tree(rng, depth - 1))
    return node


def _paths(node: types.SimpleNamespace, base: str) -> list[str]:
    found = [base]
    for name in ("a", "b"):
        if hasattr(node, name):
            found += _paths(getattr(node, name), f"{base}.{name}")
    return found


def _check(rng: random.Random, path: str, value: types.SimpleNamespace) -> str:
    """A check over ``path`` (a node of the traced tree) in one of the forms guards take."""
    forms = [
        f"{path}.v == {value.v}",
        f"type({path}.v) is int",
        f"{path}.d['k'] == {value.d['k']}",
        f'{path}.d["j"][0] == {value.d["j"][0]}',
        f"{path}.d.get('k') == {value.d['k']}",
        f"len({path}.d['j']) == 1",
        f"{path}.opt is None or {path}.opt.v == {value.opt.v if value.opt else 0}",
        f"{path}.opt is not None and {path}.opt.d['k'] >= 0 or {path}.opt is None",
        f"({path}.opt.v if {path}.opt is not None else -1) == "
        f"{value.opt.v if value.opt else -1}",
        f"(lambda v: v == {value.v})({path}.v)",
        f"all(x >= 0 for x in {path}.d['j'])",
        f"0 <= {path}.v <= {path}.d['k'] + 2",
        f"not ({path}.v < 0 or {path}.d['k'] < 0)",
    ]
    return rng.choice(forms)


def _mutate(rng: random.Random, node: types.SimpleNamespace) -> types.SimpleNamespace:
    """A tree of the same shape with some values changed (an ``opt`` may come or go)."""
    out = types.SimpleNamespace(**vars(node))
    out.d = {"k": node.d["k"], "j": list(node.d["j"])}
    if rng.random() < 0.15:
        out.v = rng.randint(0, 2)
    if rng.random() < 0.1:
        out.d["k"] = rng.randint(0, 2)
    if rng.random() < 0.1:
        out.opt = None if node.opt is not None else _tree(rng, 0)
    elif node.opt is not None:
        out.opt = _mutate(rng, node.opt)
    for name in ("a", "b"):
        if hasattr(node, name):
            setattr(out, name, _mutate(rng, getattr(node, name)))
    return out


@pytest.mark.parametrize("seed", range(25))
def test_random_checks_answer_as_the_checks_one_by_one(seed: int) -> None:
    rng = random.Random(seed)
    roots = {"L_x": _tree(rng, 3), "L_y": _tree(rng, 2)}
    nodes = [(p, eval(p, {}, dict(roots))) for r in roots for p in _paths(roots[r], r)]
    exprs = [_check(rng, *rng.choice(nodes)) for _ in range(rng.randint(5, 60))]
    guards = _guards(list(roots), exprs)
    scanned = guard_render._Parser().cut_all(exprs)
    assert scanned == [guard_render._parse_whole(e) for e in exprs]
    one_by_one = [eval(f"lambda L_x, L_y: {e}") for e in exprs]
    frames = [tuple(roots.values())] + [
        tuple(_mutate(rng, t) for t in roots.values()) for _ in range(12)]
    answers = []
    for frame in frames:
        want = all(c(*frame) for c in one_by_one)
        assert guards.check(*frame) is want, (guards.source, frame)
        answers.append(want)
    assert answers[0]  # the traced tree passes
