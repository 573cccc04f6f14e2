"""The layering of minicompile/capture/ (issue #30): the only import circle is the mixins of
InstructionTranslator, counting imports under ``if TYPE_CHECKING:`` too, and capture tests
its own value trackers with ``isinstance`` at most 150 times (behaviour belongs to the kind
of value: capture/kinds.py's rules)."""

from __future__ import annotations

import ast
from pathlib import Path

CAPTURE = Path(__file__).resolve().parents[2] / "minicompile" / "capture"
MIXINS = {"interpreter", "calls", "control", "operators", "python_calls"}
ISINSTANCE_BUDGET = 150


def _trees() -> dict[str, ast.Module]:
    return {p.stem: ast.parse(p.read_text()) for p in sorted(CAPTURE.glob("*.py"))}


def _imports(tree: ast.Module, modules: set[str]) -> set[str]:
    """The capture modules a module names in any import (type-checking ones included)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                "minicompile.capture"):
            parts = (node.module or "").split(".")
            if len(parts) == 3:
                found.add(parts[2])
            else:
                found |= {a.name for a in node.names if a.name in modules}
    return found


def test_only_the_interpreter_mixins_import_each_other() -> None:
    trees = _trees()
    modules = set(trees) - {"__init__"}
    graph = {m: _imports(trees[m], modules) & modules for m in modules}

    def reach(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for n in graph[todo.pop()]:
                if n not in seen:
                    seen.add(n)
                    todo.append(n)
        return seen

    in_circles = {m for m in modules if m in reach(m)}
    assert in_circles <= MIXINS, f"import circles outside the mixins: {in_circles - MIXINS}"


def test_isinstance_of_capture_trackers_stays_within_budget() -> None:
    trees = _trees()
    bases = {n.name: {ast.unparse(b).rpartition(".")[2] for b in n.bases}
             for t in trees.values() for n in ast.walk(t) if isinstance(n, ast.ClassDef)}
    trackers, grown = set(), {"Var"}
    while grown:
        trackers |= grown
        grown = {c for c, b in bases.items() if c not in trackers and b & trackers}
    count = 0
    for tree in trees.values():
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id == "isinstance" and len(node.args) == 2):
                names = {n.id if isinstance(n, ast.Name) else n.attr for n in ast.walk(node.args[1])
                         if isinstance(n, (ast.Name, ast.Attribute))}
                count += bool(names & trackers)
    assert count <= ISINSTANCE_BUDGET, f"{count} isinstance tests on capture's trackers"
