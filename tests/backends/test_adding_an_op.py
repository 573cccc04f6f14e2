"""Adding a unary pointwise op by CONTRIBUTING.md's path, done by the test itself: a copy of
the compiler whose minicompile/op_table.py has one more row (``asinh``: its eager function,
one Triton and one C++ template, its spellings, its derivative, the interpreter's stand-in)
and no other change.  A fresh process imports that copy and checks capture (the op is a
pointwise op of the graph, not a library call or a break), both backends and the gradient
against eager, on fresh inputs, twice."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

from minicompile.op_table import BY_NAME

ROOT = Path(__file__).resolve().parents[2]

ROW = '''\
    Row("asinh", "unary", torch.asinh, "libdevice.asinh({0})", "std::asinh({0})",
        _t("asinh", "torch.arcsinh", "Tensor.arcsinh"), True,
        lambda d, x, y, g: d("truediv", g, d("sqrt", d("add", d("mul", x(), x()), 1.0))),
        interp="arcsinh"),
'''

CHILD = textwrap.dedent('''
    import torch
    import minicompile

    def fn(x):
        return torch.asinh(x) * x.arcsinh().cos()

    explained = minicompile.explain(fn)(torch.randn(3))
    assert explained.ops_per_graph == [["asinh", "asinh", "cos", "mul"]], explained
    for backend in ("cpp", "triton"):
        minicompile.reset()
        device = "cuda" if backend == "triton" and torch.cuda.is_available() else "cpu"
        compiled = minicompile.compile(fn, backend=backend)
        for _ in range(2):
            x = torch.randn(4, 8, device=device, requires_grad=True)
            out, expected = compiled(x), fn(x)
            torch.testing.assert_close(out, expected)
            w = torch.randn_like(out)
            grad, = torch.autograd.grad((out * w).sum(), x)
            torch.testing.assert_close(grad, torch.autograd.grad((expected * w).sum(), x)[0])
        stats = minicompile.stats()
        assert stats["graphs"] == 1 and stats["eager_fallbacks"] == 0, (backend, stats)
        assert stats["kernels"] == 2, (backend, stats)  # the forward's and the backward's
    print(minicompile.__file__)
''')


def test_one_row_adds_a_unary_op(tmp_path: Path) -> None:
    assert "asinh" not in BY_NAME  # else this test adds nothing: pick another op
    for folder in ("minicompile", "passes", "codegen"):
        shutil.copytree(ROOT / folder, tmp_path / folder,
                        ignore=shutil.ignore_patterns("__pycache__"))
    table = tmp_path / "minicompile" / "op_table.py"
    text = table.read_text()
    anchor = '    Row("atan", "unary"'
    assert text.count(anchor) == 1
    table.write_text(text.replace(anchor, ROW + anchor))
    env = {**os.environ, "PYTHONPATH": str(tmp_path),
           "MINICOMPILE_CACHE_DIR": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, "-c", CHILD], check=False, env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert Path(done.stdout.strip()).is_relative_to(tmp_path), done.stdout  # the copy ran
