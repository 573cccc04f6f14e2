"""Dict-version gates: the checks of a guard function that read only through dicts, skipped
while those dicts are unchanged.

PEP 509 gives each dict a version tag that every write into it changes (compat.DICT_VERSION).
A check is *covered* when it starts from an object the guards hold (a name of their
namespace: the function's globals, a module) or a parameter checked by identity
(``L_s is M``), walks only steps whose result a dict fixes: a key of a dict
(``_modules['lin']``, ``G['x']``, ``.get(k)``), an attribute found in an instance's
``__dict__`` with no data descriptor of its class in front of it, an item of a tuple; and
compares what it reads by identity (``is``, ``type()``), or by content where that is an
immutable value or a dict.  Objects reached from the arguments that nothing fixes, plain
instances (a static KV cache passed at each decode step, each of its layers in a list), are
held the same way: their identities are checked first at each call, and another object there
(the next ``generate`` call's cache) runs the whole function, which records anew; until
then the gate keeps the last ones alive, as a CUDA graph recorded on them does.  When the
whole guard function passes, :class:`DictGate` records the version of every dict the covered checks read; while each still has it, the covered
checks hold as they did, and a call runs only the others (the identities of parameters,
tensor metadata, values in lists or in objects without ``__dict__``, attributes of classes,
calls such as the grad mode), reading what dicts fix (parameters, submodules) as objects held
since that pass rather than walking their paths; so does ``get_inputs`` on the arguments
a fast pass has just checked (:meth:`DictGate.inputs`; an entry's run takes the pass as
its token, :meth:`DictGate.inputs_right_after_check`).  The versions are compared in one C
call once a gate has served ``NATIVE_AFTER`` fast calls (runtime/dict_versions.py).  A
version that moved runs the whole function again, which records anew; a dict that moves at
every pass (a script's globals, written by its loops) is left out, and a gate that keeps
recording gives up; a record that served ``RECORDS`` calls or more clears both counts.

Not seen, as in Dynamo: ``obj.__dict__ = other`` or ``obj.__class__ = other`` on an object a
check reached, and a data descriptor added to a class over an instance attribute read.
"""

from __future__ import annotations

import ast
import operator
from collections import Counter, OrderedDict
from typing import Any

import torch

from minicompile import compat
from minicompile.runtime import dict_versions
from minicompile.runtime.guard_paths import (
    IDENTITY,
    KEYS,
    VALUE,
    NotCovered,
    Path,
    path_of,
    plain_path,
)
from minicompile.runtime.guard_render import inputs_source, render
from minicompile.runtime.tensor_checks import TENSOR_CHECKS

DICTS = (dict, OrderedDict)
IMMUTABLE = frozenset({type(None), bool, int, float, complex, str, bytes, range, torch.dtype,
                       torch.device, torch.Size, torch.layout, torch.memory_format})
HELD = "__held__"  # what dicts fix that checks read, in the fast function's namespace
RECORDS = 32  # records in a row, each after fewer fast calls than this, before giving up
CHURN = 2  # such records a dict has moved at after which no check is covered through it
NATIVE_AFTER = 64  # fast calls after which the versions are compared in C (dict_versions)
ARGUMENTS_PAY = 4  # fast calls a record on a new argument's object must serve (else churn)
_GATES = -1  # where in the held list the objects held from the arguments are
_NOTHING = object()  # (no value: not read yet, or a step that would run code)


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
        self.promoted = 0  # objects held from the arguments since the last record
        self.arguments_moved = 0  # records after fewer than ARGUMENTS_PAY calls with some
        # get_inputs, and its items reading what is held (after a record), with the
        # arguments of the last call the fast function passed (DictGate.inputs).
        self.slow_inputs: Any = None
        self.items: list[str] | None = None
        self.fast_inputs: Any = None
        self.passed: tuple | None = None

    def check(self, *args: Any) -> bool:
        moved = False  # an object held from the arguments is another one (no dict churn)
        if (self.packed is not None and dict_versions.unchanged(self.dicts, self.packed)
                and not any(self.empties)):
            self.hits, self.fast_calls = self.hits + 1, self.fast_calls + 1
            if self.fast_calls == NATIVE_AFTER:  # a loop: the version tags compared in C
                self.packed = dict_versions.pack(self.dicts, self.versions, build=True)
            try:
                ok = self.fast(*args)
            except Exception:  # noqa: BLE001 - an argument's object read in another shape
                ok = None
            if ok is not None:
                self.passed = args if ok else None
                return ok
            moved = True
        self.passed = None
        if not self.full(*args):
            return False
        try:
            self.record(args, counted=not moved)
        except Exception:  # noqa: BLE001 - a path misread: never the guards' answer
            self.versions = self.packed = None
            self.guards.check = self.full
        return True

    def record(self, args: tuple, counted: bool = True) -> None:
        """After a pass of the whole function: the dicts of the covered checks and their
        versions, or give up (the guard function runs alone) where none or too many moved
        (``counted``: this record is one of those; not where only an object held from the
        arguments was another)."""
        if self.hits >= RECORDS:  # the last record paid: a model put in eval() each epoch,
            self.records = self.arguments_moved = 0  # or an attribute generate() writes, is
            self.moves.clear()  # no churn
        if self.promoted and self.hits < ARGUMENTS_PAY:  # held from the arguments, and
            self.arguments_moved += 1  # recorded anew at (almost) every call: stop that
        self.records, self.hits = self.records + counted, 0
        if self.versions is not None:
            self.moves.update(id(d) for d, v in zip(self.dicts, self.versions)
                              if compat.DICT_VERSION(d) != v)
            self.moves.update(id(d) for d in self.empties if d)
        self.versions = self.packed = self.fast_inputs = None
        g = self.guards
        if self.reads is None:  # (a warm entry's guards come with their analysis)
            self.reads = g.analysis.reads
            self.identities = {i: (path, g.namespace[name])
                               for i, (path, name) in g.analysis.identities.items()}
        churn = {k for k, n in self.moves.items() if n >= CHURN}  # (a script's globals)
        gates: dict[Path, Any] = {}
        promoted: list[Path] = []  # gates on objects reached from the arguments, shortest first
        while True:  # the shortest paths checked by identity that nothing covers are gates
            reader = Reader(g.namespace, g.params, args, gates, churn)
            covered, dicts = [], {}
            # Without gates no identity is covered (each reads from a parameter): where there
            # are some, this pass only finds them all, and they are known (a model: 0.01 s).
            known = not gates and self.identities and not any(
                path[0] in g.namespace for path, _ in self.identities.values())
            for i, reads in enumerate(() if known else self.reads):
                gate = i in self.identities and self.identities[i][0] in gates
                if reads is not None and not gate and reader.cover(reads, dicts):
                    covered.append(i)
            more = [self.identities[i] for i in self.identities.keys() - set(covered)
                    if self.identities[i][0] not in gates]
            arguments = not more and self.arguments_moved < CHURN
            if arguments:  # (identities first: what they cover needs no gate of ours)
                more = _of_arguments(self.reads, covered, reader, g.params, args)
            if not more:
                break
            depth = min(len(path[1]) for path, _ in more)
            new = [(path, obj) for path, obj in more if len(path[1]) == depth]
            gates.update(new)
            promoted += [path for path, _ in new] if arguments else []
        if not dicts or self.records > RECORDS or HELD in g.namespace:
            g.check, self.skipped = self.full, 0
            return
        holder = Holder(reader, g.params, g.namespace)
        skip = set(covered)
        exprs = [holder.hold_check(c.expr, g.tensors) if i not in skip else ""
                 for i, c in enumerate(g.run_checks)]
        items = [holder.hold(e) for e in self.items or ()]
        key = (tuple(covered), tuple(holder.paths))
        first = [holder.hold(f"{_text(path)} is {HELD}[{_GATES}][{k}]")
                 for k, path in enumerate(promoted)]
        key = (*key, tuple(first))
        if key not in self.functions:
            self.functions[key] = self.render(exprs, first), self.render_inputs(items)
        for path in holder.paths:
            reader.gather(reader.read(path)[1], dicts)  # type: ignore[index]
        self.fast, self.fast_inputs = self.functions[key]
        self.dicts = tuple(d for d in dicts.values() if d)
        self.empties = tuple(d for d in dicts.values() if not d)
        self.skipped = len(covered)
        self.held[:] = [reader.read(path)[0] for path in holder.paths]  # type: ignore[index]
        self.held.append([gates[path] for path in promoted])
        self.promoted = len(promoted)
        self.versions = tuple(map(compat.DICT_VERSION, self.dicts))
        self.packed = dict_versions.pack(self.dicts, self.versions)

    def reading(self, get_inputs: Any, items: list[str]) -> Any:
        """:meth:`inputs`, ``get_inputs`` (the list of ``items``, expressions of the
        parameters) reading what is held after a fast pass."""
        self.items = items
        self.slow_inputs, self.functions = get_inputs, {}
        self.versions = self.packed = None  # (a record made before: again, with the items)
        return self.inputs

    def inputs(self, *args: Any) -> list:
        """The graph's inputs from the frame ``args``: the parameters as held since the last
        record where the call's check passed the fast function on these very arguments and
        the dicts still have their versions (nothing ran between), else by their paths."""
        if self._passed(args) and dict_versions.unchanged(self.dicts, self.packed) and not any(
                self.empties):
            return self.fast_inputs(*args)
        return self.slow_inputs(*args)

    def inputs_right_after_check(self, *args: Any) -> list:
        """:meth:`inputs` for an entry's run, which the API calls right after this check
        passed with nothing of the caller's run in between: the check's pass on these very
        arguments is the token, the dicts' versions are not compared again (25 us on 3.12
        for GPT-2 small's 584 dicts).  (A check's own reads write nothing into the model.)"""
        return self.fast_inputs(*args) if self._passed(args) else self.slow_inputs(*args)

    def _passed(self, args: tuple) -> bool:
        """Whether the last check passed the fast function on ``args`` (taken: once)."""
        passed, self.passed = self.passed, None  # (no references kept past the call)
        return (passed is not None and self.fast_inputs is not None and len(passed) == len(args)
                and all(map(operator.is_, passed, args)))

    def render_inputs(self, items: list[str]) -> Any:
        if self.items is None:
            return None
        scope = {**self.guards.namespace, HELD: self.held}
        code = compile(inputs_source(self.guards.params, items),
                       "<minicompile inputs, dicts unchanged>", "exec")
        exec(code, scope)  # noqa: S102 - the items capture wrote, reading what is held
        return scope["get_inputs"]

    def render(self, exprs: list[str], first: list[str]) -> Any:
        """The function of the checks not covered (``exprs``: each check's, reading what
        dicts fix as held; "" where covered), after ``first``: the identities of the objects
        held from the arguments (a KV cache), each None where it fails (then the whole
        function runs, and records anew)."""
        g = self.guards
        checks = [c._replace(expr=e) for c, e in zip(g.run_checks, exprs) if e]
        scope = {**g.namespace, HELD: self.held}
        head, body = render(g.params, checks).split("\n", 1)
        text = "\n".join([head, *(f"    if not ({e}):\n        return None" for e in first), body])
        code = compile(text, "<minicompile guards, dicts unchanged>", "exec")
        exec(code, scope)  # noqa: S102 - checks the guard builder wrote
        return scope["check"]


class Holder:
    """Rewrites checks to read what dicts fix (a parameter, a submodule) as held objects,
    ``__held__[k]``, in place of walking the path there each call."""

    def __init__(self, reader: Reader, params: list[str], namespace: dict) -> None:
        self.reader, self.params, self.namespace = reader, set(params), namespace
        self.index: dict[Path, int] = {}
        self.paths: list[Path] = []
        self.spans: list[tuple[int, int, int]] = []  # (start, end, k) of each path held
        self.done: dict[str, str] = {}  # each expression held: the same each time

    def hold(self, expr: str) -> str:
        done = self.done.get(expr)  # (a model's parameters: inputs, and in tensor checks)
        if done is None:
            done = self.done[expr] = self._hold(expr)
        return done

    def _hold(self, expr: str) -> str:
        path = plain_path(expr, self.params, self.namespace)  # (a model's inputs: most)
        if path is not None and self.held(path):
            return f"{HELD}[{self.index[path]}]"
        try:
            tree = ast.parse(expr, mode="eval")
        except SyntaxError:
            return expr
        self.spans = []
        tree.body = self.visit(tree.body)
        if not self.spans:
            return expr
        if not expr.isascii() or "\n" in expr:  # (offsets count bytes, on lines)
            return ast.unparse(tree)
        for start, end, k in sorted(self.spans, reverse=True):  # each path for its object
            expr = f"{expr[:start]}{HELD}[{k}]{expr[end:]}"  # (ast.unparse: 4x slower)
        return expr

    def hold_check(self, expr: str, tensors: Any) -> str:
        """:meth:`hold`; the call of the TensorChecks ``tensors`` (or None) path by path (a
        model's: hundreds of paths, read plainly, not parsed as one call)."""
        if tensors is None or expr != tensors.call:
            return self.hold(expr)
        return f"{TENSOR_CHECKS}({', '.join(self.hold(path) for path in tensors.paths)})"

    def visit(self, node: ast.AST) -> ast.AST:
        if isinstance(node, (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp,
                             ast.GeneratorExp)):
            return node  # (names bound inside)
        path = path_of(node, self.params, self.namespace)
        if path is not None and self.held(path):
            self.spans.append((node.col_offset, node.end_col_offset,  # type: ignore[arg-type]
                               self.index[path]))
            return ast.Subscript(ast.Name(HELD, ast.Load()), ast.Constant(self.index[path]),
                                 ast.Load())
        for field, value in ast.iter_fields(node):
            if isinstance(value, list):
                value[:] = [self.visit(v) if isinstance(v, ast.AST) else v for v in value]
            elif isinstance(value, ast.AST):
                setattr(node, field, self.visit(value))
        return node

    def held(self, path: Path) -> bool:
        """Whether ``path`` reads what dicts fix (then it is held, as ``__held__[index]``)."""
        if not path[1] or path in self.reader.gates or self.reader.read(path) is None:
            return False
        if path not in self.index:
            self.index[path] = len(self.paths)
            self.paths.append(path)
        return True


def right_after_check(get_inputs: Any) -> Any:
    """``get_inputs`` of an entry's run (called right after the entry's check passed): a
    gate's :meth:`DictGate.inputs_right_after_check` where it is a gate's inputs."""
    gate = getattr(get_inputs, "__self__", None)
    return gate.inputs_right_after_check if isinstance(gate, DictGate) else get_inputs


def per_call(guards: Any) -> str:
    """What a passing call of ``guards.check`` runs now, in words (for benchmarks)."""
    gate = getattr(guards.check, "__self__", None)
    live = isinstance(gate, DictGate) and gate.versions is not None
    tensors = len(guards.tensors.paths) if guards.tensors is not None else 0
    python = len(guards.run_checks) - (gate.skipped - gate.promoted if live else 0) - (
        tensors > 0)  # (the identities of the objects held from the arguments run too)
    return (f"{len(guards)} guard checks; a call runs {python} in Python, "
            f"{len(gate.dicts) if live else 0} dict versions, {tensors} tensors' metadata in C++")


class Reader:
    """Reads paths on one call's values, each prefix once, with the dicts that fix it: a
    chain, ``(dicts of the last step, the parent's chain)`` or None, so that the dicts of
    thousands of paths sharing prefixes are gathered once each (:meth:`gather`)."""

    def __init__(self, namespace: dict, params: list[str], args: tuple, gates: dict[Path, Any],
                 churn: set[int]) -> None:
        self.namespace = namespace
        self.params = set(params)
        self.gates = gates  # paths checked by identity every call -> their objects
        self.churn = churn  # ids of dicts that keep moving
        self.memo: dict[Path, tuple[Any, Any] | None] = {}
        self.roots = {root for root, _ in gates}  # (other paths from a parameter read nothing)
        self.gathered: set[int] = set()  # chains (kept alive by the memo) gathered already
        # id(path) -> the path (alive while it is here), its read, whether it is a gate:
        # found without hashing the path, as the memo must.
        self.by_id: dict[int, tuple[Path, Any, bool]] = {}

    def cover(self, reads: list[tuple[Path, int]], dicts: dict[int, Any]) -> bool:
        """Whether the dicts fix what a check reads (False where something else could
        change it); if so they go into ``dicts`` (by id)."""
        chains, extras = [], []
        for path, mode in reads:
            seen = self.by_id.get(id(path))  # (a warm entry's checks share their paths)
            if seen is None or seen[0] is not path:
                seen = self.by_id[id(path)] = (path, self.read(path), path in self.gates)
            _, got, gate = seen
            if got is None or (mode != IDENTITY and gate):
                return False  # (a gate: its identity, which runs every call, fixes only that)
            value, chain = got
            chains.append(chain)
            if mode != IDENTITY:
                extra = _content(value, mode)
                if extra is None:
                    return False
                extras += extra
        for chain in chains:
            self.gather(chain, dicts)
        for d in extras:
            dicts[id(d)] = d
        return True

    def gather(self, chain: Any, dicts: dict[int, Any]) -> None:
        """The dicts of a chain :meth:`read` made into ``dicts``.  (Loops, not
        ``dicts.update`` of a generator: a chain's step fixes one dict or two, and a
        model's record gathers thousands.)"""
        gathered = self.gathered
        while chain is not None and id(chain) not in gathered:
            gathered.add(id(chain))
            fixed, chain = chain
            for d in fixed:
                dicts[id(d)] = d

    def read(self, path: Path) -> tuple[Any, Any] | None:
        got = self.memo.get(path, _NOTHING)
        if got is not _NOTHING:
            return got
        root, steps = path
        got = None
        if root not in self.roots and root not in self.namespace:
            pass  # (a parameter no gate is on, at once: the first record has no gates)
        elif path in self.gates:
            got = (self.gates[path], None)
        elif not steps:
            got = (self.namespace[root], None) if root in self.namespace else None
        else:
            parent = self.read((root, steps[:-1]))
            if parent is not None:
                try:
                    value, fixed = _step(parent[0], *steps[-1])
                    if not (self.churn and any(id(d) in self.churn for d in fixed)):
                        got = (value, (fixed, parent[1]) if fixed else parent[1])
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
    if cls.__getattribute__ is not object.__getattribute__:
        raise NotCovered  # (before reading ``__dict__``: no code of the user's runs)
    found = getattr(obj, "__dict__", None)
    if type(found) is not dict:
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


def _of_arguments(reads: list, covered: list[int], reader: Reader, params: list[str],
                  args: tuple) -> list[tuple[Path, Any]]:
    """Gates on objects reached from the arguments (a KV cache passed at each decode step,
    its layers in a list): for each read of a check not covered, the shortest prefix that
    nothing fixes and whose object is a plain instance (its attributes in its ``__dict__``),
    with that object; its identity is then checked first at each call."""
    found: dict[Path, Any] = {}
    done = set(covered)
    for i, check_reads in enumerate(reads):
        if i in done or check_reads is None:
            continue
        for (root, steps), _ in check_reads:
            if root not in params:
                continue
            obj = args[params.index(root)]
            for j, step in enumerate(steps):
                obj = _walk(obj, *step)
                path = (root, steps[:j + 1])
                if obj is _NOTHING:
                    break
                if path not in reader.gates and reader.read(path) is None and _plain(obj):
                    found[path] = obj
                    break
    return list(found.items())



def _walk(obj: Any, kind: str, key: Any) -> Any:
    """One step from an argument, running no code of the user's (_NOTHING where it would):
    :func:`_step`'s, and an item of a list."""
    try:
        if type(obj) is list and kind == "item":
            return obj[key]
        return _step(obj, kind, key)[0]
    except Exception:  # noqa: BLE001 - NotCovered, a key or an index not there
        return _NOTHING


def _plain(obj: Any) -> bool:
    """An instance whose attributes are its ``__dict__``'s (not a tensor, not a module:
    new tensors come at every call, and modules are held by the guards already)."""
    return (type(obj).__getattribute__ is object.__getattribute__ and not isinstance(
        obj, (torch.Tensor, torch.nn.Module, type)) and type(getattr(obj, "__dict__", None))
        is dict)


def _text(path: Path) -> str:
    """A path as the expression that reads it."""
    root, steps = path
    text = root
    for kind, key in steps:
        text += f".{key}" if kind == "attr" else f"[{key!r}]" if kind == "item" else \
            f".get({key!r})"
    return text
