"""What each check of a guard function reads, as paths: parsed once, kept with a warm entry.

The dict-version gate (runtime/dict_guards.py) asks of every check which paths it reads
(``L_self._modules['fc'].weight``: a root name and steps) and how much of each value counts,
and which checks compare a path from a parameter with a name by identity.  That depends on
the check's text, the parameters and the names of the guards' namespace (not on their
values), so a compile works it out once (:meth:`Analysis.of`, ``ast.parse`` of each check:
resnet50's 2,700 checks took 0.1-0.2 s) and its warm entry stores it (:meth:`to_json`);
a later process reads it back instead of parsing again.
"""

from __future__ import annotations

import ast
import builtins
import dataclasses
import keyword
import re
from typing import Any

IDENTITY, KEYS, VALUE = 0, 1, 2  # what of a value a check reads

Path = tuple[str, tuple[tuple[str, Any], ...]]  # root name, steps ("attr" | "item" | "get", key)
# A path written plainly: a name, then ``.attr``, ``['key']`` (printable ASCII, no quote or
# backslash) or ``[int]`` steps, each ASCII and without spaces (what plain_path reads).
_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_PLAIN = re.compile(rf"{_NAME}(?:\.{_NAME}|\['[ -&(-\[\]-~]*'\]|\[(?:0|[1-9][0-9]*)\])*")
_STEP = re.compile(rf"\.({_NAME})|\['([ -&(-\[\]-~]*)'\]|\[([0-9]+)\]")
Reads = list[tuple[Path, int]]


class NotCovered(Exception):
    pass


@dataclasses.dataclass
class Analysis:
    """Per check: the paths it reads with their modes (None where it does anything else),
    and, for ``<path from a parameter> is <name>``, that path and name."""

    reads: list[Reads | None]
    identities: dict[int, tuple[Path, str]]

    @classmethod
    def of(cls, exprs: list[str], params: list[str], namespace: dict) -> Analysis:
        reads, identities = [], {}
        names = set(params)
        for i, expr in enumerate(exprs):
            try:
                node = ast.parse(expr, mode="eval").body
            except SyntaxError:
                reads.append(None)
                continue
            reads.append(analyse(node, names, namespace))
            found = identity(node, names, namespace)
            if found is not None:
                identities[i] = found
        return cls(reads, identities)

    def to_json(self) -> dict | None:
        """The analysis as JSON: each path once, as a row ``[parent row, kind, key]`` (a
        root: ``[-1, "root", name]``); None where a key is not a str or an int."""
        rows: list[list] = []
        index: dict[Path, int] = {}

        def row(path: Path) -> int:
            if path not in index:
                root, steps = path
                if steps:
                    (kind, key), parent = steps[-1], row((root, steps[:-1]))
                    if type(key) not in (str, int):
                        raise TypeError(key)
                    rows.append([parent, kind, key])
                else:
                    rows.append([-1, "root", root])
                index[path] = len(rows) - 1
            return index[path]

        try:
            reads = [None if r is None else [x for path, mode in r for x in (row(path), mode)]
                     for r in self.reads]
            identities = [[i, row(path), name] for i, (path, name) in self.identities.items()]
        except TypeError:
            return None
        return {"paths": rows, "reads": reads, "identities": identities}

    @classmethod
    def from_json(cls, data: dict | None, checks: int) -> Analysis | None:
        """What :meth:`to_json` wrote, for ``checks`` checks (None where it is not that)."""
        if data is None or len(data["reads"]) != checks:
            return None
        paths: list[Path] = []
        for parent, kind, key in data["paths"]:
            if parent < 0:
                paths.append((key, ()))
            else:
                root, steps = paths[parent]
                paths.append((root, (*steps, (kind, key))))
        reads = [None if r is None else [(paths[r[k]], r[k + 1]) for k in range(0, len(r), 2)]
                 for r in data["reads"]]
        return cls(reads, {i: (paths[p], name) for i, p, name in data["identities"]})


def identity(node: ast.AST, params: set, namespace: dict) -> tuple[Path, str] | None:
    """The path from a parameter and the name of a check ``<path> is <name>``, or None."""
    if not (isinstance(node, ast.Compare) and len(node.ops) == 1
            and isinstance(node.ops[0], ast.Is) and isinstance(node.comparators[0], ast.Name)
            and node.comparators[0].id in namespace):
        return None
    path = path_of(node.left, params, namespace)
    if path is None or path[0] not in params:
        return None
    return path, node.comparators[0].id


def analyse(node: ast.AST, params: set, namespace: dict) -> Reads | None:
    """The paths an expression reads, each with what of it counts (IDENTITY: only what it
    is or its type; KEYS: its length, keys or truth; VALUE: all of it); None where it does
    anything else (calls, lambdas, arithmetic)."""
    out: Reads = []
    try:
        _visit(node, VALUE, out, params, namespace)
    except (NotCovered, RecursionError):
        return None
    return out


def _visit(node: ast.AST, mode: int, out: list, params: set, namespace: dict) -> None:
    path = path_of(node, params, namespace)
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
        base = path_of(node.func.value, params, namespace)
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


def plain_path(expr: str, params: set, namespace: dict) -> Path | None:
    """``path_of(ast.parse(expr, mode="eval").body)`` for an ``expr`` that is a path written
    plainly (a parameter's ``L_self._modules['fc']._parameters['weight']``: most of what a
    model's entry reads), without parsing it (a tenth of the time); None for any other
    ``expr``, which the caller parses."""
    if not _PLAIN.fullmatch(expr):
        return None
    root = re.match(_NAME, expr).group()  # type: ignore[union-attr]
    if keyword.iskeyword(root) or (root not in params and root not in namespace):
        return None
    steps = []
    for m in _STEP.finditer(expr, len(root)):
        attr, key, index = m.groups()
        if attr is not None and keyword.iskeyword(attr):
            return None
        steps.append(("attr", attr) if attr is not None else ("item", key) if key is not None
                     else ("item", int(index)))
    return root, tuple(steps)


def path_of(node: ast.AST, params: set, namespace: dict) -> Path | None:
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
    parent = path_of(base, params, namespace)
    return None if parent is None else (parent[0], (*parent[1], step))
