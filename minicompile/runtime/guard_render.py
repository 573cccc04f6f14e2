"""The source of a guard function: its checks in order, shared access paths read once.

A path several checks read is read once into a local (``p0 = ...``) before the first check
that reads it unconditionally; a conditional read (after ``and`` / ``or``, in a branch, a
lambda or comprehension) is never hoisted: a check must not read what eager's short-circuit
would not.  One regular expression cuts checks into paths and templates, parsed once each.
"""

from __future__ import annotations

import ast
import itertools
import keyword
import re
from collections import Counter
from collections.abc import Iterable
from typing import Any, NamedTuple

_STR = r"""(?:'(?:[^'\\\n]|\\.)*'|"(?:[^"\\\n]|\\.)*")"""
_LONG_STR = r"""(?:'''(?:[^\\]|\\.)*?'''|\"\"\"(?:[^\\]|\\.)*?\"\"\")"""
_NAME = r"[A-Za-z_]\w*"
_INT = r"(?:0|[1-9][0-9]*)"
_STEP = rf"(?:\.{_NAME}|\[(?:{_STR}|{_INT})\])"
# String literals (kept whole: text inside them is never taken for a path), or paths.
_TOKENS = re.compile(rf"([rRbBuU]?(?:{_LONG_STR}|{_STR}))|(?<![\w.])({_NAME}{_STEP}+)", re.A)
# What the scanner leaves to ``ast``: comments, line continuations, f-strings (their text
# holds code), the slots' own name.
_ODD = re.compile(r"""[#\\]|__mcp|(?<!\w)[rRbB]?[fF][rRbB]?['"]""")
_MAYBE_ODD = re.compile(r"""[fF][rRbB]?['"]""")  # (a quick first look: _ODD is slower)
_STEPS = re.compile(rf"\.({_NAME})|\[({_STR}|{_INT})\]", re.A)
_ROOT = re.compile(_NAME, re.A)
_SLOT_NAME = "__mcp__"
_SLOT = "\0"  # marks a slot in a template's text: ast.unparse never writes it otherwise


class _Path(NamedTuple):
    root: str
    keys: tuple[str, ...]  # the path's prefixes, shortest first ("a.b", "a.b['c']")
    steps: tuple[str, ...]  # each step as ast.unparse writes it (".b", "['c']")


class _Slot(NamedTuple):
    path: int  # which of the check's paths (in order of text)
    conditional: bool
    called: bool  # the function of a call: its last step stays at the call
    bound: frozenset  # names bound by the enclosing lambdas and comprehensions


class _Template(NamedTuple):
    pieces: tuple[str | int, ...]  # ast.unparse's text of the check, path numbers in it
    slots: tuple[_Slot, ...]  # in the order Python evaluates them (an if's test first)


def render(params: list[str], checks: list[Any], name: str = "check") -> str:
    """``def <name>(*params)``; ``checks``: GuardChecks (their ``expr``, ``source`` and
    ``kind``)."""
    lines = [f"def {name}({', '.join(params)}):"]
    for c, (expr, assignments) in zip(checks, hoist([c.expr for c in checks])):
        for local, value in assignments:
            lines.append(f"    {local} = {value}")
        lines.append(f"    if not ({expr}):  # {c.source} {c.kind}\n        return False")
    lines.append("    return True\n")
    return "\n".join(lines)


def inputs_source(params: list[str], exprs: list[str]) -> str:
    """``get_inputs(*params)``: the list of ``exprs``, each path several read (a model's
    parameters: ``L_self._modules['encoder']...``) read once into a local."""
    lines = [f"def get_inputs({', '.join(params)}):"]
    items = []
    for expr, assignments in hoist(exprs):
        lines += [f"    {local} = {value}" for local, value in assignments]
        items.append(expr)
    return "\n".join([*lines, f"    return [{', '.join(items)}]\n"])


def hoist(exprs: list[str]) -> list[tuple[str, list[tuple[str, str]]]]:
    """Each of ``exprs``, evaluated in order, reading the locals (``p0``, ``p1``, ...) of
    the paths several of them read, and the assignments of the locals it reads first."""
    cut = _Parser().cut_all(exprs)
    keys: list[str] = []  # each expression's, once each
    for paths, template in cut:
        slots = template.slots
        if len(slots) == 1:  # most checks: one path, whose keys differ
            if paths[0].root not in slots[0].bound:
                keys += paths[0].keys
        elif slots:
            keys += {k for s in slots if paths[s.path].root not in s.bound
                     for k in paths[s.path].keys}
    shared = {k for k, n in Counter(keys).items() if n > 1}
    if not shared:
        return [(e, []) for e in exprs]
    hoister = _Hoister(shared)
    return [hoister.rewrite(e, paths, template) for e, (paths, template) in zip(exprs, cut)]


class _Hoister:
    """Hands out the locals of shared paths, in the order checks first read them."""

    def __init__(self, shared: set[str]) -> None:
        self.shared = shared
        self.locals: dict[str, str] = {}

    def rewrite(self, expr: str, paths: list[_Path],
                template: _Template) -> tuple[str, list[tuple[str, str]]]:
        """The check reading locals, and the assignments of the locals it reads first."""
        out: list[tuple[str, str]] = []
        texts: dict[int, str] = {}
        changed = False
        for slot in template.slots:
            path = paths[slot.path]
            steps, keys = path.steps, path.keys
            if path.root in slot.bound:  # a lambda's own variable
                texts[slot.path] = path.root + "".join(steps)
                continue
            end = len(steps) - 1 if slot.called else len(steps)
            start, text = 0, path.root
            for j in range(end, 0, -1):  # the longest prefix read already
                name = self.locals.get(keys[j - 1])
                if name is not None:
                    start, text, changed = j, name, True
                    break
            for j in range(start, end):
                text += steps[j]
                if not slot.conditional and keys[j] in self.shared:
                    name = self.locals[keys[j]] = f"p{len(self.locals)}"
                    out.append((name, text))
                    text, changed = name, True
            texts[slot.path] = text + "".join(steps[end:])
        if not changed:
            return expr, out
        return "".join(p if type(p) is str else texts[p] for p in template.pieces), out


class _Parser:
    """Cuts checks into paths and a template; each template is parsed once."""

    def __init__(self) -> None:
        self.paths: dict[str, _Path | None] = {}
        self.steps: dict[str, str] = {}  # a step as written -> as ast.unparse writes it
        self.templates: dict[str, _Template | None] = {}

    def cut_all(self, exprs: list[str]) -> list[tuple[list[_Path], _Template]]:
        """Each check's paths (in order of text) and template, all scanned as one text."""
        out: list[Any] = [None] * len(exprs)
        plain = [i for i, e in enumerate(exprs) if "\n" not in e]
        text = "\n".join(exprs[i] for i in plain)
        if (_MAYBE_ODD.search(text) or "#" in text or "\\" in text or "__mcp" in text
                or not text.isascii()):  # (ast normalizes some non-ASCII names: NFKC)
            plain = [i for i in plain if not _ODD.search(exprs[i]) and exprs[i].isascii()]
            text = "\n".join(exprs[i] for i in plain)
        # split: [text, string or None, path or None, text, ...]; paths become slots.
        parts = _TOKENS.split(text) if plain else [""]
        found = [p for p in parts[2::3] if p is not None]
        parts[1::3] = [s if s is not None else _SLOT_NAME for s in parts[1::3]]
        parts[2::3] = [""] * (len(parts) // 3)
        lines = "".join(parts).split("\n") if plain else []
        if len(lines) == len(plain):  # (a string over two lines would have merged them)
            at = 0
            for i, line in zip(plain, lines):
                n = line.count(_SLOT_NAME)
                template = self.templates.get(line, False)
                if template is False:
                    template = self.templates[line] = _scan_template(line)
                if template is not None and len(template.slots) == n:
                    paths = [self._path(t) for t in found[at:at + n]]
                    if None not in paths:
                        out[i] = (paths, template)
                at += n
        return [c if c is not None else _parse_whole(e) for c, e in zip(out, exprs)]

    def _path(self, text: str) -> _Path | None:
        """The path written ``text``, built on its parent; None for a keyword's."""
        path = self.paths.get(text, False)
        if path is not False:
            return path
        cut = text.rfind("[") if text[-1] == "]" else text.rfind(".")
        step = self.steps.get(text[cut:])
        if step is None and (m := _STEPS.fullmatch(text, cut)):  # (a '[' in a string: no)
            step = self.steps[text[cut:]] = _step(m)
        if step is None:
            path = self._path_from_scratch(text)
        elif _ROOT.fullmatch(text, 0, cut):
            root = text[:cut]
            path = None if keyword.iskeyword(root) else _Path(root, (root + step,), (step,))
        else:
            parent = self._path(text[:cut])
            path = parent and _Path(parent.root, (*parent.keys, parent.keys[-1] + step),
                                    (*parent.steps, step))
        self.paths[text] = path
        return path

    def _path_from_scratch(self, text: str) -> _Path | None:
        root = _ROOT.match(text)[0]  # type: ignore[index]
        if keyword.iskeyword(root):
            return None
        steps = tuple(_step(m) for m in _STEPS.finditer(text, len(root)))
        return _Path(root, _prefixes(root, steps), steps)


def _step(m: re.Match) -> str:
    """A step as ast.unparse writes it: by value (``["a"]`` is ``['a']``)."""
    if m[1]:
        return f".{m[1]}"
    # (an int is written as literal_eval's repr writes it already: _INT has no leading 0)
    return f"[{m[2]}]" if m[2][0].isdigit() else f"[{ast.literal_eval(m[2])!r}]"


def _prefixes(root: str, steps: Iterable[str]) -> tuple[str, ...]:
    """The keys of a path: ``root`` with each of its first steps (one or more)."""
    return tuple(itertools.accumulate(steps, initial=root))[1:]


def _scan_template(text: str) -> _Template | None:
    """The template of ``text`` (paths written ``__mcp__``); None if the scanner misread."""
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        return None
    walk = _Walk(scanned=True)
    try:
        tree.body = walk.visit(tree.body, False, frozenset())
    except _Misread:
        return None
    return walk.template(tree)


def _parse_whole(expr: str) -> tuple[list[_Path], _Template]:
    tree = ast.parse(expr, mode="eval")
    walk = _Walk()
    tree.body = walk.visit(tree.body, False, frozenset())
    template = walk.template(tree)
    return walk.paths, template


class _Misread(Exception):
    pass


class _Walk:
    """Visits a check's tree in evaluation order, each path made a slot (conditional or not)."""

    def __init__(self, scanned: bool = False) -> None:
        self.scanned = scanned
        self.found: dict[tuple[int, int], _Path | None] = {}  # where each path starts
        self.marks: list[tuple[int, int]] = []
        self.slots: list[_Slot] = []
        self.paths: list[_Path] = []

    def template(self, tree: ast.Expression) -> _Template:
        """The template, slots numbered in order of text as the scanner numbers them."""
        order = {at: n for n, at in enumerate(sorted(self.found))}
        self.paths = [self.found[at] for at in sorted(self.found) if self.found[at]]
        slots = tuple(s._replace(path=order[s.path]) for s in self.slots)
        parts = ast.unparse(tree).split(_SLOT)
        pieces = tuple(order[self.marks[int(p)]] if i % 2 else p for i, p in enumerate(parts))
        return _Template(pieces, slots)

    def visit(self, node: ast.AST, conditional: bool, bound: frozenset,
              called: bool = False) -> ast.AST:
        at = self._slot(node)
        if at is not None:
            self.slots.append(_Slot(at, conditional, called, bound))  # type: ignore[arg-type]
            self.marks.append(at)
            return ast.Name(f"{_SLOT}{len(self.marks) - 1}{_SLOT}", ast.Load())
        if isinstance(node, (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp,
                             ast.GeneratorExp)):
            bound = bound | _binds(node)
        for field, value in ast.iter_fields(node):
            if isinstance(value, list):
                for i, child in enumerate(value):
                    if isinstance(child, ast.AST):
                        value[i] = self.visit(child, conditional or _sometimes(node, field, i),
                                              bound)
            elif isinstance(value, ast.AST):
                later = conditional or _sometimes(node, field, 0)
                call = isinstance(node, ast.Call) and field == "func"
                setattr(node, field, self.visit(value, later, bound, call))
        return node

    def _slot(self, node: ast.AST) -> tuple[int, int] | None:
        """Where the path ``node`` starts, or None if it is none."""
        steps = _path_steps(node)
        if self.scanned:  # slots are names; no other path may be left
            if steps is not None:
                raise _Misread
            if isinstance(node, ast.Name) and node.id == _SLOT_NAME:
                self.found[node.lineno, node.col_offset] = None
                return node.lineno, node.col_offset
            return None
        if steps is None:
            return None
        root, parts = steps
        at = (node.lineno, node.col_offset)
        self.found[at] = _Path(root, _prefixes(root, [k for k, _ in parts]),
                               tuple(s for _, s in parts))
        return at


def _path_steps(node: ast.AST) -> tuple[str, list[tuple[str, str]]] | None:
    """A path's root and steps (key text, source text); None for anything else."""
    parts = []
    while True:
        if isinstance(node, ast.Attribute):
            parts.append((f".{node.attr}", f".{node.attr}"))
        elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            parts.append((f"[{node.slice.value!r}]", f"[{ast.unparse(node.slice)}]"))
        else:
            break
        node = node.value
    if not parts or not isinstance(node, ast.Name):
        return None
    return node.id, parts[::-1]


def _binds(node: ast.AST) -> frozenset:
    if isinstance(node, ast.Lambda):
        a = node.args
        args = [*a.posonlyargs, *a.args, *a.kwonlyargs, *filter(None, (a.vararg, a.kwarg))]
        return frozenset(x.arg for x in args)
    return frozenset(n.id for g in node.generators  # type: ignore[attr-defined]
                     for n in ast.walk(g.target) if isinstance(n, ast.Name))


def _sometimes(node: ast.AST, field: str, index: int) -> bool:
    """Whether a child of ``node`` is evaluated only sometimes: operands after the first of
    ``and``/``or`` and of a chained comparison, an ``if`` expression's branches, lambda and
    comprehension bodies."""
    if isinstance(node, ast.BoolOp):
        return index > 0
    if isinstance(node, ast.Compare):
        return field == "comparators" and index > 0
    if isinstance(node, ast.IfExp):
        return field != "test"
    return isinstance(node, (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp,
                             ast.GeneratorExp))
