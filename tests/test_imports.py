"""The architecture check of STYLE.md: imports point one way.

Imports are read with ``ast`` (every ``import`` statement, including those inside
functions), never by importing the modules, so the check is fast and sees lazy imports too.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Source folder -> the package it installs as (setup.cfg's package_dir).
PACKAGES = {
    ROOT / "minicompile": "minicompile",
    ROOT / "passes": "minicompile.passes",
    ROOT / "codegen": "minicompile.codegen",
}
# shapes.py: size symbols (wrapping PyTorch's ShapeEnv); errors.py: the exceptions they raise.
# compat.py: PyTorch's internals, read in one place (below).
IR_MODULES = ("graph.py", "ir.py", "sym.py", "ops.py", "eager_ops.py", "op_table.py",
              "library_layouts.py",
              "meta_rules.py", "meta_cache.py", "shapes.py", "errors.py", "compat.py")
IR_NAMES = {f"minicompile.{Path(f).stem}" for f in IR_MODULES}
STDLIB = set(sys.stdlib_module_names)


def _module_name(path: Path) -> str:
    for folder, package in PACKAGES.items():
        if path.is_relative_to(folder):
            rel = path.relative_to(folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            return ".".join([package, *parts])
    raise AssertionError(f"{path} is in no package")


def _sources(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*.py") if "__pycache__" not in p.parts)


def imports_of(path: Path) -> list[tuple[str, int]]:
    """Absolute names of every module ``path`` imports, with line numbers.  ``from a import
    b`` gives both ``a`` and ``a.b`` (b may be a submodule); relative imports are resolved."""
    tree = ast.parse(path.read_text(), filename=str(path))
    module = _module_name(path)
    is_package = path.name == "__init__.py"
    found: list[tuple[str, int]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            if name == "__future__":
                continue
            found.append((name, node.lineno))
            found += [(f"{name}.{alias.name}", node.lineno) for alias in node.names]
    return found


def _top(name: str) -> str:
    return name.split(".")[0]


def _is_under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


ALL_SOURCES = [p for folder in PACKAGES for p in _sources(folder)]


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def test_sources_found() -> None:
    names = {_rel(p) for p in ALL_SOURCES}
    for expected in ("minicompile/graph.py", "passes/fusion.py", "codegen/wrapper.py"):
        assert expected in names


@pytest.mark.parametrize("filename", IR_MODULES)
def test_ir_modules_import_only_stdlib_sympy_torch_and_each_other(filename: str) -> None:
    path = ROOT / "minicompile" / filename
    bad = []
    for name, line in imports_of(path):
        top = _top(name)
        if top in STDLIB or top in ("sympy", "torch"):
            continue
        if name == "minicompile" or any(_is_under(name, ir) for ir in IR_NAMES):
            continue
        bad.append(f"{_rel(path)}:{line} imports {name}")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("path", _sources(ROOT / "codegen"), ids=_rel)
def test_codegen_imports(path: Path) -> None:
    """codegen reads the IR; of passes/ it may use only fusion's FusedGroup; it never
    reaches up to capture or the API."""
    bad = []
    for name, line in imports_of(path):
        if _is_under(name, "minicompile.capture") or _is_under(name, "minicompile.api"):
            bad.append(f"{_rel(path)}:{line} imports {name}")
        elif _is_under(name, "minicompile.passes") and not (
            name in ("minicompile.passes", "minicompile.passes.fusion")
            or _is_under(name, "minicompile.passes.fusion")
        ):
            bad.append(f"{_rel(path)}:{line} imports {name} (only passes.fusion is allowed)")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("path", _sources(ROOT / "passes"), ids=_rel)
def test_passes_imports(path: Path) -> None:
    forbidden = ("minicompile.codegen", "minicompile.capture", "minicompile.api")
    bad = [
        f"{_rel(path)}:{line} imports {name}"
        for name, line in imports_of(path)
        if any(_is_under(name, f) for f in forbidden)
    ]
    assert not bad, "\n".join(bad)


def test_networkx_is_not_imported() -> None:
    """The scheduling passes keep their own small DAG (passes/dag.py): networkx is no
    dependency, and its import cost 0.13-0.19 s of every cold start."""
    bad = [
        f"{_rel(p)}:{line} imports {name}"
        for p in ALL_SOURCES
        for name, line in imports_of(p)
        if _top(name) == "networkx"
    ]
    assert not bad, "\n".join(bad)


def _is_private_torch(name: str) -> bool:
    """``torch._prims_common``, ``torch.utils._sympy``, ``torch._C._aoti``,
    ``torch.fx.experimental``: PyTorch's internals, which change between releases."""
    parts = name.split(".")
    return parts[0] == "torch" and (any(p.startswith("_") for p in parts[1:])
                                    or _is_under(name, "torch.fx.experimental"))


def test_pytorch_internals_are_imported_only_in_compat() -> None:
    """Private PyTorch modules are read through minicompile/compat.py alone, which says
    which versions differ and how (CI runs tests/test_compat.py on each)."""
    compat = ROOT / "minicompile" / "compat.py"
    assert any(_is_private_torch(n) for n, _ in imports_of(compat))
    bad = [
        f"{_rel(p)}:{line} imports {name}"
        for p in ALL_SOURCES
        if p != compat
        for name, line in imports_of(p)
        if _is_private_torch(name)
    ]
    assert not bad, "\n".join(bad)


def test_private_torch_names_are_recognised() -> None:
    assert _is_private_torch("torch._prims_common")
    assert _is_private_torch("torch.utils._python_dispatch.TorchDispatchMode")
    assert _is_private_torch("torch.fx.experimental.symbolic_shapes")
    assert not _is_private_torch("torch.nn.functional")
    assert not _is_private_torch("torch.utils.cpp_extension")


def _environment_reads(path: Path) -> list[int]:
    """Lines that read the process environment: ``os.environ``, ``os.getenv``,
    ``from os import environ/getenv``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    lines = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and node.attr in ("environ", "getenv", "environb")
            and isinstance(node.value, ast.Name)
            and node.value.id == "os"
        ):
            lines.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and node.module == "os":
            if any(a.name in ("environ", "getenv", "environb") for a in node.names):
                lines.append(node.lineno)
    return lines


def test_os_environ_only_in_config() -> None:
    config = ROOT / "minicompile" / "config.py"
    assert _environment_reads(config), "config.py should be where the environment is read"
    bad = [
        f"{_rel(p)}:{line}"
        for p in ALL_SOURCES
        if p != config
        for line in _environment_reads(p)
    ]
    assert not bad, "the environment is read outside minicompile/config.py:\n" + "\n".join(bad)


def test_import_parser_resolves_relative_imports(tmp_path: Path) -> None:
    # The checker itself: relative imports must resolve, or the rules above see nothing.
    fake = ROOT / "codegen" / "x.py"
    src = "from .common import CodeWriter\nfrom ..ir import Load\nimport networkx as nx\n"
    tree_names = []
    module = _module_name(fake)
    assert module == "minicompile.codegen.x"
    path = tmp_path / "x.py"
    path.write_text(src)
    # Reuse imports_of's logic through a file placed (virtually) in codegen/.
    original = PACKAGES.copy()
    PACKAGES.clear()
    PACKAGES[tmp_path] = "minicompile.codegen"
    try:
        tree_names = [n for n, _ in imports_of(path)]
    finally:
        PACKAGES.clear()
        PACKAGES.update(original)
    assert "minicompile.codegen.common" in tree_names
    assert "minicompile.ir.Load" in tree_names
    assert "networkx" in tree_names


def _capture_imports(path: Path) -> set[str]:
    """The capture modules ``path`` imports when it runs: every import, in functions too,
    except those under ``if TYPE_CHECKING:`` (annotations only)."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            node.body = []
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and _is_under(node.module or "", "minicompile.capture"):
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            found |= {n.rpartition(".")[2] for n in names if n.count(".") == 2}
    return found


def test_capture_modules_import_one_way() -> None:
    """No capture module imports one that imports it back (at run time): each kind
    registers its rules in capture/kinds.py and the package imports the providers, so
    nothing registers by importing at the bottom."""
    folder = ROOT / "minicompile" / "capture"
    graph = {p.stem: _capture_imports(p) for p in _sources(folder) if p.stem != "__init__"}

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        return any(n == goal or (n not in seen and not seen.add(n) and reaches(n, goal, seen))
                   for n in graph.get(start, ()))

    assert {"kinds", "interpreter", "torch_ops"} <= graph.keys()
    circles = sorted(m for m in graph if reaches(m, m, set()))
    assert not circles, f"capture modules in an import circle: {circles}"
