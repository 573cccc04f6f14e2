"""Python constructs of ordinary model code: loops, comprehensions, closures, with, try,
super(), objects, builtins, f-strings."""

from __future__ import annotations

import dataclasses
import math
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from capture_helpers import capture, check_matches_eager

from minicompile.capture.bytecode import PY
from minicompile.errors import Unsupported


def x48() -> torch.Tensor:
    torch.manual_seed(0)
    return torch.randn(4, 8)


def test_for_loops_are_unrolled() -> None:
    def f(x, n=3):
        for i in range(n):
            x = x + i
        for a, b in zip([1, 2], (3, 4)):
            x = x * a + b
        for i, t in enumerate([x, x], start=1):
            x = x + t * i
        for t in reversed((x, x)):
            x = x - t
        for row in x[:2]:  # over a tensor's first dim
            x = x + row
        return x

    cap = check_matches_eager(f, x48())
    assert cap.ops > 10


def test_while_break_continue() -> None:
    def f(x):
        k = 0
        while k < 5:
            k += 1
            if k == 2:
                continue
            if k == 4:
                break
            x = x * 2
        return x, k

    check_matches_eager(f, x48())


def test_comprehensions_and_generated_containers() -> None:
    def f(x):
        ys = [x * j for j in range(3) if j != 1]
        d = {k: v for k, v in zip("ab", ys)}
        return sum(ys), d["b"], [t.shape for t in ys]

    check_matches_eager(f, x48())


def test_dict_methods_with_keys_and_defaults() -> None:
    def f(x, d):
        d = {**d}  # a dict of the trace: get, pop and setdefault with and without defaults
        a = d.get("a") * d.get("zz", 2) + (d.get("zz") is None)
        b = d.pop("b") + d.pop("zz", x)
        c = d.setdefault("c", x * 3) + d.setdefault("a", x)
        return a, b, c, d.setdefault("n"), list(d)

    for seed in (0, 1):
        torch.manual_seed(seed)
        check_matches_eager(f, x48(), {"a": torch.randn(4, 8), "b": torch.randn(4, 8)})
    with pytest.raises(Unsupported, match="key 'zz' not found"):
        capture(lambda d: {**d}.pop("zz"), {"a": x48()})


def test_args_kwargs_closures_lambdas() -> None:
    def f(x, *args, scale=2.0, **kw):
        def inner(t, k=kw.get("b", 1)):
            return t * k + len(args)

        g = lambda t: inner(t) * scale  # noqa: E731
        return g(x), f"{x.shape[0]}-{scale:.1f}", args

    check_matches_eager(f, x48(), 1, 2, scale=3.0, b=2)


def test_metadata_branches_builtins_math_assert() -> None:
    def f(x):
        assert x.ndim == 2, "needs 2d"
        if x.dtype == torch.float32 and not x.is_cuda and x.device.type == "cpu":
            x = x * 2
        if isinstance(x, torch.Tensor) and hasattr(x, "shape") and not hasattr(x, "nope"):
            x = x + getattr(x, "ndim") + getattr(x, "nope", 1)
        m = max(x.shape) + min(1, 2) + abs(-3) + math.floor(math.sqrt(16))
        return x + m

    check_matches_eager(f, x48())


def test_try_without_raise_follows_the_body() -> None:
    def f(x):
        try:
            y = x + 1
        except Exception:
            y = x
        finally:
            y = y * 2
        return y

    check_matches_eager(f, x48())


def test_grad_mode_contexts() -> None:
    w = torch.randn(8, requires_grad=True)

    def f(x, w):
        with torch.no_grad():
            y = x * w
            inner = torch.is_grad_enabled()
        with torch.set_grad_enabled(False):
            y = y + w
        with torch.enable_grad():
            z = y + 1
        return z, inner, torch.is_grad_enabled()

    cap = check_matches_eager(f, x48(), w)
    assert "is_grad_enabled() is True" in str(cap.guards)
    graph = capture(lambda x, w: (x * w, (x * w).detach(), x + 1), x48(), w)[0].graph
    assert [o.meta.requires_grad for o in graph.outputs] == [True, False, False]


@dataclasses.dataclass
class Cfg:
    hidden: int = 8
    act: str = "gelu"

    @property
    def double(self) -> int:
        return self.hidden * 2

    def scale(self) -> float:
        return self.hidden**-0.5


def test_dataclass_attributes_are_guarded_constants() -> None:
    def f(x, cfg):
        if cfg.act == "gelu":
            x = F.gelu(x)
        return x * cfg.scale() + cfg.double

    cap, frame = capture(f, x48(), Cfg())
    guards = str(cap.guards)
    assert "L_cfg.act == 'gelu'" in guards and "type(L_cfg) is Cfg" in guards
    assert cap.guards.check(x48(), Cfg())  # another instance, same values: reused
    assert not cap.guards.check(x48(), Cfg(act="relu"))
    check_matches_eager(f, x48(), Cfg())


def test_super_in_user_classes() -> None:
    class A:
        def f(self, x):
            return x + 1

    class B(A):
        def f(self, x):
            return super().f(x) * 2

    check_matches_eager(lambda x, b: b.f(x), x48(), B())


def test_deleting_attributes_of_objects() -> None:
    """``del o.a`` and ``delattr`` on an object the trace made; on a frame object a break."""
    class Box:
        def __init__(self, x):
            self.a, self.b, self.c = x, x * 2, x * 3

    def f(x):
        o = Box(x)
        del o.a
        delattr(o, "b")
        return o.c, hasattr(o, "a"), hasattr(o, "b")

    for x in (x48(), x48() * 2):
        check_matches_eager(f, x)
    with pytest.raises(Unsupported, match="del of an attribute of"):
        capture(lambda x, o: delattr(o, "c") or x, x48(), Box(x48()))


def test_type_of_a_torch_return_types_tuple() -> None:
    def f(x):
        r = x.max(0)
        return type(r) is tuple, isinstance(r, tuple), type(r).__name__, r.values * 2

    for x in (x48(), x48() + 1):
        check_matches_eager(f, x)


def test_python_312_bytecode_shapes() -> None:
    """The 3.12 opcodes the interpreter relies on (no torch there: check with dis)."""
    py312 = os.path.expanduser("~/.pyenv/versions/3.12.1/bin/python3.12")
    if PY == (3, 12):
        py312 = sys.executable
    if not os.path.exists(py312):
        pytest.skip("no CPython 3.12 here")
    src = (
        "import dis\n"
        "class A:\n"
        "    def f(self, xs):\n"
        "        ys = [y * 2 for y in xs]\n"
        "        for y in xs: pass\n"
        "        with open('x') as fh: pass\n"
        "        return super().f(ys)\n"
        "print(' '.join(sorted({i.opname for i in dis.get_instructions(A.f)})))\n"
    )
    ops = set(subprocess.check_output([py312, "-c", src], text=True).split())
    for op in ("LOAD_FAST_AND_CLEAR", "SWAP", "END_FOR", "LOAD_SUPER_ATTR", "BEFORE_WITH"):
        assert op in ops
    from minicompile.capture.interpreter import InstructionTranslator

    missing = {o for o in ops if not hasattr(InstructionTranslator, o)}
    # handler-only opcodes are reached through the exception table, never traced
    assert missing <= {"PUSH_EXC_INFO", "WITH_EXCEPT_START", "POP_EXCEPT", "RERAISE",
                       "CHECK_EXC_MATCH", "CALL_INTRINSIC_1"} | {o for o in missing if "EXC" in o}


def test_break_leaves_inspectable_state() -> None:
    def f(x):
        y = x + 1
        n = y.sum().item()
        return n

    with pytest.raises(Unsupported) as info:
        capture(f, x48())
    tx = info.value.translator
    assert tx.inst.opname == "CALL" and tx.code is f.__code__
    assert "y" in tx.locals and tx.parent is None
