"""Guard functions at run time: the compiled check of one entry, and the words for why it
failed.  Built by capture (minicompile/capture/guards.py: GuardBuilder) or read back from a
warm entry on disk (minicompile/runtime/entries.py); this module imports neither, so a warm
process checks guards without loading capture.
"""

from __future__ import annotations

import ast
import dataclasses
import types
from collections.abc import Callable
from typing import Any

import torch

# nn.Module's global forward hooks (registered with register_module_forward_hook).
GLOBAL_MODULE_HOOKS = (
    torch.nn.modules.module._global_forward_hooks,
    torch.nn.modules.module._global_forward_pre_hooks,
)


GUARDS_FILENAME = "<minicompile guards>"


@dataclasses.dataclass(frozen=True)
class GuardCheck:
    source: str  # readable source ("L['x']")
    kind: str  # what is checked ("dtype")
    expr: str  # Python expression that is True when the check passes
    actual: str  # Python expression for the current value, for failure messages
    expected: Any  # the traced value, for failure messages


def format_value(value: Any) -> str:
    """Values as a PyTorch user writes them: ``torch.float32``, ``(4, 8)``, ``cpu``."""
    if isinstance(value, torch.Size):
        return str(tuple(value))
    if isinstance(value, (torch.dtype, torch.device)):
        return str(value)
    if isinstance(value, type):
        module = value.__module__
        return value.__qualname__ if module == "builtins" else f"{module}.{value.__qualname__}"
    return repr(value)


class Guards:
    """The compiled guards of one capture.

    ``check(*args)`` takes the frame's parameter values in layout order and returns True when
    every check passes.  It does not raise on inputs of a different shape of Python object
    (checks are ordered so that type checks come first).
    """

    def __init__(self, params: list[str], checks: list[GuardCheck], namespace: dict,
                 code: types.CodeType | None = None) -> None:
        self.params = params
        self.checks = checks
        self.namespace = namespace
        # ``code``: the source compiled already (a warm entry keeps it: compiling the
        # guards of a large model takes a tenth of a second); the source is then rendered
        # only when asked for.
        self._source = None if code is not None else _render(params, checks)
        self.code = code or compile(self.source, GUARDS_FILENAME, "exec")
        exec(self.code, namespace)
        self.check: Callable[..., bool] = namespace["check"]
        self._slow: list[tuple[Callable, Callable]] | None = None

    def explain_failure(self, *args: Any) -> str | None:
        """The first failing check, as text with the traced and the current value, or None
        if all pass.  Slow; call it only on a cache miss."""
        if self._slow is None:
            lam = f"lambda {', '.join(self.params)}: "
            self._slow = [
                (eval(lam + c.expr, self.namespace), eval(lam + c.actual, self.namespace))
                for c in self.checks
            ]
        for check, (ok, actual) in zip(self.checks, self._slow):
            try:
                passed = bool(ok(*args))
            except Exception as e:  # a check on something that is gone (a deleted global)
                return f"{check.source} {check.kind}: check raised {type(e).__name__}: {e}"
            if not passed:
                try:
                    value = actual(*args)
                except Exception as e:
                    return f"{check.source} {check.kind}: expected {check.expected!r}, got <{e}>"
                return describe_mismatch(check, value)
        return None

    def changed_ints(self, *args: Any) -> dict[str, tuple[int, int]]:
        """Python ints the checks compare by value whose value differs in ``args``:
        source -> (traced, now).  For automatic dynamic shapes."""
        out = {}
        lam = f"lambda {', '.join(self.params)}: "
        for c in self.checks:
            if c.kind != "value" or type(c.expected) is not int:
                continue
            try:
                now = eval(lam + c.actual, self.namespace)(*args)
            except Exception:
                continue
            if type(now) is int and now != c.expected:
                out[c.source] = (c.expected, now)
        return out

    @property
    def source(self) -> str:
        """The guard function, as Python source."""
        if self._source is None:
            self._source = _render(self.params, self.checks)
        return self._source

    def __len__(self) -> int:
        return len(self.checks)

    def __str__(self) -> str:
        return self.source


def describe_mismatch(check: GuardCheck, value: Any) -> str:
    """``L['x'] size mismatch at index 0: expected 4, got 6`` (Dynamo's wording, in ours)."""
    expected = check.expected
    if check.kind in ("sizes", "strides") and isinstance(expected, tuple):
        got = tuple(value)
        what = "size" if check.kind == "sizes" else "stride"
        if len(got) == len(expected):
            for i, (e, a) in enumerate(zip(expected, got)):
                if e != a:
                    return f"{check.source} {what} mismatch at index {i}: expected {e}, got {a}"
    return f"{check.source} {check.kind}: expected {format_value(expected)}, got " + (
        format_value(value)
    )


def _render(params: list[str], checks: list[GuardCheck]) -> str:
    """The checks as one function: ``if not (<check>): return False`` in order.

    Access paths that several checks share (``L_self._modules['h']._modules['3']``, a
    parameter of a submodule) are read once into a local (``p0 = ...``), just before the
    first check that reads them; later checks read the local.  A path is hoisted only
    where that first check reads it unconditionally (not behind ``or`` / ``and`` / ``if``),
    so the function reads the same attributes in the same order as the checks, once each.
    A large model's guards walk their module tree once instead of once per check."""
    lines = [f"def check({', '.join(params)}):"]
    hoist = _PathHoister([c.expr for c in checks])
    for k, c in enumerate(checks):
        expr, assignments = hoist.rewrite(k, c.expr)
        lines += [f"    {name} = {value}" for name, value in assignments]
        lines.append(f"    if not ({expr}):  # {c.source} {c.kind}")
        lines.append("        return False")
    lines.append("    return True")
    return "\n".join(lines) + "\n"


def _path_key(node: ast.AST) -> str | None:
    """The source of an access path (a name followed by attributes and constant
    subscripts: ``L_self._modules['h']``), or None for anything else (a bare name too)."""
    parts = []
    while True:
        if isinstance(node, ast.Attribute):
            parts.append(f".{node.attr}")
        elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            parts.append(f"[{node.slice.value!r}]")
        else:
            break
        node = node.value
    if not parts or not isinstance(node, ast.Name):
        return None
    return node.id + "".join(reversed(parts))


class _PathHoister:
    """Rewrites check expressions so that shared access paths are read once (see _render).
    Each expression is parsed once; one that reads no shared path keeps its text."""

    def __init__(self, exprs: list[str]) -> None:
        self.trees = _parse_all(exprs)
        uses: dict[str, int] = {}
        for tree in self.trees:
            for key in {k for n in ast.walk(tree) if (k := _path_key(n)) is not None}:
                uses[key] = uses.get(key, 0) + 1
        self.shared = {k for k, n in uses.items() if n > 1}
        self.locals: dict[str, str] = {}
        self.changed = False

    def rewrite(self, index: int, expr: str) -> tuple[str, list[tuple[str, str]]]:
        """Check ``index`` (whose source is ``expr``) reading the shared paths' locals, and
        the assignments of the locals it reads first."""
        if not self.shared:
            return expr, []
        tree, assignments = self.trees[index], []
        self.changed = False
        tree.value = self._visit(tree.value, False, assignments)
        return (ast.unparse(tree.value) if self.changed else expr), assignments

    def _visit(self, node: ast.AST, conditional: bool, out: list) -> ast.AST:
        key = _path_key(node)
        if key is not None and key in self.shared:
            if key in self.locals:
                self.changed = True
                return ast.Name(self.locals[key], ast.Load())
            if not conditional:
                value = self._children(node, conditional, out)
                name = self.locals[key] = f"p{len(self.locals)}"
                out.append((name, ast.unparse(value)))
                self.changed = True
                return ast.Name(name, ast.Load())
        return self._children(node, conditional, out)

    def _children(self, node: ast.AST, conditional: bool, out: list) -> ast.AST:
        """Rewrite the children of ``node``; operands evaluated only sometimes (after the
        first of ``and``/``or`` and of a chained comparison, an ``if`` expression's
        branches, lambda and comprehension bodies) are visited as conditional."""
        for field, value in ast.iter_fields(node):
            if isinstance(value, list):
                for i, child in enumerate(value):
                    if isinstance(child, ast.AST):
                        later = conditional or _sometimes(node, field, i)
                        value[i] = self._visit(child, later, out)
            elif isinstance(node, ast.Call) and field == "func":
                # A method read (``G.get``) stays where it is called.
                self._children(value, conditional, out)
            elif isinstance(value, ast.AST):
                setattr(node, field, self._visit(value, conditional or _sometimes(node, field, 0),
                                                 out))
        return node


def _parse_all(exprs: list[str]) -> list[ast.Expr]:
    """Each expression as an ``ast.Expr`` statement, parsed in one call (a call per check
    was most of the time a large model's guards took to render)."""
    body = ast.parse("\n".join(exprs)).body if exprs else []
    if len(body) != len(exprs):  # an expression over several lines
        body = [ast.parse(e).body[0] for e in exprs]
    return body  # type: ignore[return-value]


def _sometimes(node: ast.AST, field: str, index: int) -> bool:
    if isinstance(node, ast.BoolOp):
        return index > 0
    if isinstance(node, ast.Compare):
        return field == "comparators" and index > 0
    if isinstance(node, ast.IfExp):
        return field != "test"
    return isinstance(node, (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp,
                             ast.GeneratorExp))
