"""Dict-version gates: the checks of a guard function that read only through dicts, skipped
while those dicts are unchanged.

PEP 509 gives each dict a version tag that every write into it changes (compat.DICT_VERSION).
A check is *covered* when it starts from an object the guards hold (a name of their
namespace: the function's globals, a module) or a parameter checked by identity
(``L_s is M``), walks only steps whose result a dict fixes: a key of a dict
(``_modules['lin']``, ``G['x']``, ``.get(k)``), an attribute found in an instance's
``__dict__`` with no data descriptor of its class in front of it, an item of a tuple; and
compares what it reads by identity (``is``, ``type()``), or by content where that is an
immutable value or a dict.  When the whole guard function passes, :class:`DictGate` records
the version of every dict the covered checks read; while each still has it, the covered
checks hold as they did, and a call runs only the others (the identities of parameters,
tensor metadata, values in lists or in objects without ``__dict__``, attributes of classes,
calls such as the grad mode), reading what dicts fix (parameters, submodules) as objects held
since that pass rather than walking their paths; so does ``get_inputs`` on the arguments
a fast pass has just checked (:meth:`DictGate.inputs`).  The versions are compared in one C
call once a gate has served ``NATIVE_AFTER`` fast calls (runtime/dict_versions.py).  A
version that moved runs the whole function again, which records anew; a dict that moves at
every pass (a script's globals, written by its loops) is left out, and a gate that keeps
recording gives up; a record that served ``RECORDS`` calls or more clears both counts.

Not seen, as in Dynamo: ``obj.__dict__ = other`` or ``obj.__class__ = other`` on an object a
check reached, and a data descriptor added to a class over an instance attribute read.
"""

from __future__ import annotations

import ast
import builtins
import dataclasses
import operator
from collections import Counter, OrderedDict
from typing import Any

import torch

from minicompile import compat
from minicompile.runtime import dict_versions
from minicompile.runtime.guard_render import inputs_items, inputs_source, render

DICTS = (dict, OrderedDict)
IMMUTABLE = frozenset({type(None), bool, int, float, complex, str, bytes, range, torch.dtype,
                       torch.device, torch.Size, torch.layout, torch.memory_format})
HELD = "__held__"  # what dicts fix that checks read, in the fast function's namespace
RECORDS = 32  # records in a row, each after fewer fast calls than this, before giving up
CHURN = 2  # such records a dict has moved at after which no check is covered through it
NATIVE_AFTER = 64  # fast calls after which the versions are compared in C (dict_versions)
IDENTITY, KEYS, VALUE = 0, 1, 2  # what of a value a check reads

Path = tuple[str, tuple[tuple[str, Any], ...]]  # root name, steps ("attr" | "item" | "get", key)


class NotCovered(Exception):
    pass


class DictGate:
    """``check(*args)``: the answer of ``guards.check`` (a Guards: its ``run_checks`` in
    order, ``namespace``, ``params``), the covered checks skipped while the dicts they read
    keep the versions of the last pass.  Where none is covered, or dicts keep moving, it
    puts the guard function back as ``guards.check``."""

    def __init__(self, guards: Any) -> None:
        self.guards = guards
        self.full = guards.check
        self.reads: list[list[tuple[Path, int]] | None] | None = None
        self.identities: dict[int, tuple[Path, Any]] = {}  # check -> path, object
        self.records = 0  # records since one that RECORDS fast calls or more paid for
        self.hits = 0  # fast calls since the last record
        self.fast_calls = 0  # since the gate was made
        self.dicts: tuple = ()
        # Dicts empty at the record: checked for staying empty, not by version (PyTorch's
        # tags on CPython 3.12+ miss an update() into an empty dict: the CLONED event).
        self.empties: tuple = ()
        self.versions: tuple | None = None
        self.packed: Any = None  # the versions as dict_versions.unchanged compares them
        self.fast: Any = None
        self.held: list = []
        self.functions: dict[tuple, Any] = {}
        self.moves: Counter[int] = Counter()  # id of a dict -> passes it had moved at
        self.skipped = 0  # checks the fast function leaves out
        # get_inputs, and its items reading what is held (after a record), with the
        # arguments of the last call the fast function passed (DictGate.inputs).
        self.slow_inputs: Any = None
        self.items: list[str] | None = None
        self.fast_inputs: Any = None
        self.passed: tuple | None = None

    def check(self, *args: Any) -> bool:
        if (self.packed is not None and dict_versions.unchanged(self.dicts, self.packed)
                and not any(self.empties)):
            self.hits, self.fast_calls = self.hits + 1, self.fast_calls + 1
            if self.fast_calls == NATIVE_AFTER:  # a loop: the version tags compared in C
                self.packed = dict_versions.pack(self.dicts, self.versions, build=True)
            ok = self.fast(*args)
            self.passed = args if ok else None
            return ok
        self.passed = None
        if not self.full(*args):
            return False
        try:
            self.record(args)
        except Exception:  # noqa: BLE001 - a path misread: never the guards' answer
            self.versions = self.packed = None
            self.guards.check = self.full
        return True

    def record(self, args: tuple) -> None:
        """After a pass of the whole function: the dicts of the covered checks and their
        versions, or give up (the guard function runs alone) where none or too many moved."""
        if self.hits >= RECORDS:  # the last record paid: a model put in eval() each epoch,
            self.records = 0  # or an attribute generate() writes, is no churn
            self.moves.clear()
        self.records, self.hits = self.records + 1, 0
        if self.versions is not None:
            self.moves.update(id(d) for d, v in zip(self.dicts, self.versions)
                              if compat.DICT_VERSION(d) != v)
            self.moves.update(id(d) for d in self.empties if d)
        self.versions = self.packed = self.fast_inputs = None
        g = self.guards
        if self.reads is None:
            self.reads = [analyse(c.expr, g.params, g.namespace) for c in g.run_checks]
            self.identities = {i: found for i, c in enumerate(g.run_checks)
                               if (found := _identity(c.expr, g.params, g.namespace))}
        churn = {k for k, n in self.moves.items() if n >= CHURN}  # (a script's globals)
        gates: dict[Path, Any] = {}
        while True:  # the shortest paths checked by identity that nothing covers are gates
            reader = Reader(g.namespace, g.params, args, gates, churn)
            covered, dicts = [], {}
            for i, reads in enumerate(self.reads):
                got = reader.cover(reads) if reads is not None else None
                if got is not None:
                    covered.append(i)
                    dicts.update((id(d), d) for d in got)
            more = [self.identities[i] for i in self.identities.keys() - set(covered)
                    if self.identities[i][0] not in gates]
            if not more:
                break
            depth = min(len(path[1]) for path, _ in more)
            gates.update((path, obj) for path, obj in more if len(path[1]) == depth)
        if not dicts or self.records > RECORDS or HELD in g.namespace:
            g.check, self.skipped = self.full, 0
            return
        holder = Holder(reader, g.params, g.namespace)
        skip = set(covered)
        exprs = [holder.hold(c.expr) if i not in skip else "" for i, c in enumerate(g.run_checks)]
        items = [holder.hold(e) for e in self.items or ()]
        key = (tuple(covered), tuple(holder.paths))
        if key not in self.functions:
            self.functions[key] = self.render(exprs), self.render_inputs(items)
        for path in holder.paths:
            dicts.update((id(d), d) for d in reader.read(path)[1])  # type: ignore[index]
        self.fast, self.fast_inputs = self.functions[key]
        self.dicts = tuple(d for d in dicts.values() if d)
        self.empties = tuple(d for d in dicts.values() if not d)
        self.skipped = len(covered)
        self.held[:] = [reader.read(path)[0] for path in holder.paths]  # type: ignore[index]
        self.versions = tuple(map(compat.DICT_VERSION, self.dicts))
        self.packed = dict_versions.pack(self.dicts, self.versions)

    def reading(self, get_inputs: Any, source: str) -> Any:
        """:meth:`inputs`, ``get_inputs`` (of ``source``) reading what is held after a fast
        pass; ``get_inputs`` itself where its items cannot be read back."""
        self.items = inputs_items(source)
        if self.items is None:
            return get_inputs
        self.slow_inputs, self.functions = get_inputs, {}
        self.versions = self.packed = None  # (a warm entry's first check recorded: again)
        return self.inputs

    def inputs(self, *args: Any) -> list:
        """The graph's inputs from the frame ``args``: the parameters as held since the last
        record where the call's check passed the fast function on these very arguments and
        the dicts still have their versions (nothing ran between), else by their paths."""
        passed, self.passed = self.passed, None  # (no references kept past the call)
        if (passed is not None and self.fast_inputs is not None and len(passed) == len(args)
                and all(map(operator.is_, passed, args))
                and dict_versions.unchanged(self.dicts, self.packed) and not any(self.empties)):
            return self.fast_inputs(*args)
        return self.slow_inputs(*args)

    def render_inputs(self, items: list[str]) -> Any:
        if self.items is None:
            return None
        scope = {**self.guards.namespace, HELD: self.held}
        code = compile(inputs_source(self.guards.params, items),
                       "<minicompile inputs, dicts unchanged>", "exec")
        exec(code, scope)  # noqa: S102 - the items capture wrote, reading what is held
        return scope["get_inputs"]

    def render(self, exprs: list[str]) -> Any:
        """The function of the checks not covered (``exprs``: each check's, reading what
        dicts fix as held; "" where covered)."""
        g = self.guards
        checks = [dataclasses.replace(c, expr=e) for c, e in zip(g.run_checks, exprs) if e]
        scope = {**g.namespace, HELD: self.held}
        code = compile(render(g.params, checks), "<minicompile guards, dicts unchanged>", "exec")
        exec(code, scope)  # noqa: S102 - checks the guard builder wrote
        return scope["check"]


class Holder:
    """Rewrites checks to read what dicts fix (a parameter, a submodule) as held objects,
    ``__held__[k]``, in place of walking the path there each call."""

    def __init__(self, reader: Reader, params: list[str], namespace: dict) -> None:
        self.reader, self.params, self.namespace = reader, set(params), namespace
        self.index: dict[Path, int] = {}
        self.paths: list[Path] = []
        self.changed = False

    def hold(self, expr: str) -> str:
        try:
            tree = ast.parse(expr, mode="eval")
        except SyntaxError:
            return expr
        self.changed = False
        tree.body = self.visit(tree.body)
        return ast.unparse(tree) if self.changed else expr

    def visit(self, node: ast.AST) -> ast.AST:
        if isinstance(node, (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp,
                             ast.GeneratorExp)):
            return node  # (names bound inside)
        path = _path(node, self.params, self.namespace)
        if (path is not None and path[1] and path not in self.reader.gates
                and self.reader.read(path) is not None):
            if path not in self.index:
                self.index[path] = len(self.paths)
                self.paths.append(path)
            self.changed = True
            return ast.Subscript(ast.Name(HELD, ast.Load()), ast.Constant(self.index[path]),
                                 ast.Load())
        for field, value in ast.iter_fields(node):
            if isinstance(value, list):
                value[:] = [self.visit(v) if isinstance(v, ast.AST) else v for v in value]
            elif isinstance(value, ast.AST):
                setattr(node, field, self.visit(value))
        return node


def per_call(guards: Any) -> str:
    """What a passing call of ``guards.check`` runs now, in words (for benchmarks)."""
    gate = getattr(guards.check, "__self__", None)
    live = isinstance(gate, DictGate) and gate.versions is not None
    tensors = len(guards.tensors.paths) if guards.tensors is not None else 0
    python = len(guards.run_checks) - (gate.skipped if live else 0) - (tensors > 0)
    return (f"{len(guards)} guard checks; a call runs {python} in Python, "
            f"{len(gate.dicts) if live else 0} dict versions, {tensors} tensors' metadata in C++")


def _identity(expr: str, params: list[str], namespace: dict) -> tuple[Path, Any] | None:
    """The path from a parameter and the object of a check ``<path> is <name>``, or None."""
    try:
        node = ast.parse(expr, mode="eval").body
    except SyntaxError:
        return None
    if not (isinstance(node, ast.Compare) and len(node.ops) == 1
            and isinstance(node.ops[0], ast.Is) and isinstance(node.comparators[0], ast.Name)
            and node.comparators[0].id in namespace):
        return None
    path = _path(node.left, set(params), namespace)
    if path is None or path[0] not in params:
        return None
    return path, namespace[node.comparators[0].id]


def analyse(expr: str, params: list[str], namespace: dict) -> list[tuple[Path, int]] | None:
    """The paths ``expr`` reads, each with what of it counts (IDENTITY: only what it is
    or its type; KEYS: its length, keys or truth; VALUE: all of it); None where ``expr``
    does anything else (calls, lambdas, arithmetic)."""
    out: list[tuple[Path, int]] = []
    try:
        _visit(ast.parse(expr, mode="eval").body, VALUE, out, set(params), namespace)
    except (NotCovered, SyntaxError, RecursionError):
        return None
    return out


def _visit(node: ast.AST, mode: int, out: list, params: set, namespace: dict) -> None:
    path = _path(node, params, namespace)
    if path is not None:
        out.append((path, mode))
    elif isinstance(node, ast.Constant):
        pass
    elif isinstance(node, ast.Compare):
        modes = [VALUE] * (len(node.ops) + 1)
        if all(isinstance(op, (ast.Is, ast.IsNot)) for op in node.ops):
            modes = [IDENTITY] * len(modes)
        elif len(node.ops) == 1 and isinstance(node.ops[0], (ast.In, ast.NotIn)):
            modes[1] = KEYS
        for child, child_mode in zip((node.left, *node.comparators), modes):
            _visit(child, child_mode, out, params, namespace)
    elif isinstance(node, (ast.BoolOp, ast.UnaryOp, ast.Tuple, ast.List)) and (
            not isinstance(node, ast.UnaryOp) or isinstance(node.op, ast.Not)):
        mode = VALUE if isinstance(node, (ast.Tuple, ast.List)) else KEYS
        children = node.operand if isinstance(node, ast.UnaryOp) else getattr(
            node, "values", None) or node.elts  # type: ignore[attr-defined]
        for child in children if isinstance(children, list) else [children]:
            _visit(child, mode, out, params, namespace)
    elif (isinstance(node, ast.Call) and _builtin(node.func, namespace) in ("type", "len", "list")
          and len(node.args) == 1 and not node.keywords):
        mode = IDENTITY if node.func.id == "type" else KEYS  # type: ignore[attr-defined]
        _visit(node.args[0], mode, out, params, namespace)
    elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
          and node.func.attr == "get" and len(node.args) == 2 and not node.keywords
          and isinstance(node.args[0], ast.Constant)):  # G.get('len', B.get('len'))
        base = _path(node.func.value, params, namespace)
        if base is None:
            raise NotCovered
        out.append(((base[0], (*base[1], ("get", node.args[0].value))), mode))
        _visit(node.args[1], mode, out, params, namespace)
    elif _builtin(node, namespace) is None:
        raise NotCovered


def _builtin(node: ast.AST, namespace: dict) -> str | None:
    """The name of the builtin that ``node`` names in the guard function."""
    if isinstance(node, ast.Name) and hasattr(builtins, node.id) and namespace.get(
            node.id, getattr(builtins, node.id)) is getattr(builtins, node.id):
        return node.id
    return None


def _path(node: ast.AST, params: set, namespace: dict) -> Path | None:
    """``node`` as a root and steps: ``a.b``, ``a['k']``, ``a.get('k')``, ``getattr(a, 'b', d)``."""
    if isinstance(node, ast.Name):
        return (node.id, ()) if node.id in params or node.id in namespace else None
    step: tuple[str, Any] | None = None
    if isinstance(node, ast.Attribute):
        base, step = node.value, ("attr", node.attr)
    elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
        base, step = node.value, ("item", node.slice.value)
    elif isinstance(node, ast.Call) and not node.keywords and all(
            isinstance(a, ast.Constant) for a in node.args[1:]):
        if (_builtin(node.func, namespace) == "getattr" and len(node.args) == 3
                and isinstance(node.args[1].value, str)):  # type: ignore[attr-defined]
            base, step = node.args[0], ("attr", node.args[1].value)  # type: ignore
        elif (isinstance(node.func, ast.Attribute) and node.func.attr == "get"
              and len(node.args) == 1 and isinstance(node.args[0], ast.Constant)):
            base, step = node.func.value, ("get", node.args[0].value)
    if step is None:
        return None
    parent = _path(base, params, namespace)
    return None if parent is None else (parent[0], (*parent[1], step))


class Reader:
    """Reads paths on one call's values, each prefix once, with the dicts that fix it."""

    def __init__(self, namespace: dict, params: list[str], args: tuple, gates: dict[Path, Any],
                 churn: set[int]) -> None:
        self.namespace = namespace
        self.params = set(params)
        self.gates = gates  # paths checked by identity every call -> their objects
        self.churn = churn  # ids of dicts that keep moving
        self.memo: dict[Path, tuple[Any, tuple] | None] = {}

    def cover(self, reads: list[tuple[Path, int]]) -> tuple | None:
        """The dicts that fix what a check reads, or None where something else could
        change it."""
        dicts: tuple = ()
        for path, mode in reads:
            got = self.read(path)
            if got is None or path in self.gates:
                return None  # (a gate itself: its identity check runs every call)
            value, fixed = got
            if mode != IDENTITY:
                extra = _content(value, mode)
                if extra is None:
                    return None
                fixed += extra
            dicts += fixed
        return dicts

    def read(self, path: Path) -> tuple[Any, tuple] | None:
        if path in self.memo:
            return self.memo[path]
        root, steps = path
        got: tuple[Any, tuple] | None = None
        if path in self.gates:
            got = (self.gates[path], ())
        elif not steps:
            got = (self.namespace[root], ()) if root in self.namespace else None
        else:
            parent = self.read((root, steps[:-1]))
            if parent is not None:
                try:
                    value, fixed = _step(parent[0], *steps[-1])
                    if not any(id(d) in self.churn for d in fixed):
                        got = (value, parent[1] + fixed)
                except Exception:  # noqa: BLE001 - NotCovered; a user's __getattr__ raising
                    got = None
        self.memo[path] = got
        return got


def _step(obj: Any, kind: str, key: Any) -> tuple[Any, tuple]:
    """One step from ``obj``: its result and the dicts that fix it (NotCovered where none)."""
    if kind != "attr":
        if type(obj) is tuple and kind == "item":
            return obj[key], ()
        if type(obj) not in DICTS:
            raise NotCovered
        return (obj[key] if kind == "item" else obj.get(key)), (obj,)
    cls = type(obj)
    found = getattr(obj, "__dict__", None)
    if type(found) is not dict or cls.__getattribute__ is not object.__getattribute__:
        raise NotCovered
    if key == "__dict__":
        return found, ()
    if key not in found or _data_descriptor(cls, key):
        raise NotCovered  # (a class attribute, or one a property computes)
    return found[key], (found,)


def _data_descriptor(cls: type, name: str) -> bool:
    for klass in cls.__mro__:
        if name in klass.__dict__:
            kind = type(klass.__dict__[name])
            return hasattr(kind, "__set__") or hasattr(kind, "__delete__")
    return False


def _content(value: Any, mode: int) -> tuple | None:
    """The dicts that fix what ``mode`` reads of ``value``: none for an immutable value,
    the dict for a dict (and its values' for VALUE); None where something else could change
    it (a list, an object)."""
    if type(value) in IMMUTABLE:
        return ()
    items = value.values() if type(value) in DICTS else value if type(value) is tuple else None
    if items is None:
        return None
    own = (value,) if type(value) in DICTS else ()
    if mode == KEYS:
        return own
    parts = [_content(v, VALUE) for v in items]
    return None if None in parts else sum(parts, own)
