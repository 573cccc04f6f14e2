"""Guard functions at run time: the compiled check of one entry, and the words for why it
failed.  Built by capture (capture/guard_builder.py) or read back from a warm entry
(runtime/entries.py); this module imports neither.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any, NamedTuple

import torch

from minicompile import compat
from minicompile.runtime import tensor_checks
from minicompile.runtime.dict_guards import DictGate
from minicompile.runtime.guard_paths import Analysis
from minicompile.runtime.guard_render import render

# nn.Module's global forward hooks (registered with register_module_forward_hook).
GLOBAL_MODULE_HOOKS = (torch.nn.modules.module._global_forward_hooks,
                       torch.nn.modules.module._global_forward_pre_hooks)


GUARDS_FILENAME = "<minicompile guards>"

# Where minicompile.mark_dynamic (and torch._dynamo.mark_dynamic) mark a tensor's dims
# dynamic ahead: capture reads the marks (capture/dynamic.py), and so does the choice of a
# warm entry on disk (AutoDynamic.decision), which must not load capture.
MARK_ATTR = "_minicompile_dynamic_dims"


def marked_dims(t: torch.Tensor) -> frozenset[int]:
    """The dims of ``t`` marked dynamic ahead."""
    return frozenset(getattr(t, MARK_ATTR, ())) | frozenset(
        getattr(t, "_dynamo_dynamic_indices", ()))


class GuardCheck(NamedTuple):
    """One fact a trace relied on.  (A tuple: a warm entry of densenet121 makes 9,479 of
    them, in 6 ms against 11 as a frozen dataclass.)"""

    source: str  # readable source ("L['x']")
    kind: str  # what is checked ("dtype")
    expr: str  # Python expression that is True when the check passes
    actual: str  # Python expression for the current value, for failure messages
    expected: Any  # the traced value, for failure messages
    # The tensor whose static metadata this check reads (``tensor_match``), or "": such
    # checks may run together in C++ (minicompile/runtime/tensor_checks.py).
    tensor: str = ""


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
    """The compiled guards of one capture: ``check(*args)`` (the frame's parameters in
    layout order) is True when every check passes, and never raises on inputs of another
    shape (type checks come first).  The metadata checks of parameters and buffers run
    last, in one C++ call where it can (runtime/tensor_checks.py)."""

    def __init__(self, params: list[str], checks: list[GuardCheck], namespace: dict,
                 code: types.CodeType | None = None, analysis: dict | None = None) -> None:
        self.params = params
        self.checks = checks
        self.namespace = namespace
        # ``code``: the source compiled already (a warm entry keeps it: compiling the
        # guards of a large model takes a tenth of a second); the source is then rendered
        # only when asked for.
        kept, self.tensors = tensor_checks.split(checks)
        self.run_checks = kept if self.tensors is None else [
            *kept, GuardCheck("tensors", "metadata", self.tensors.call, self.tensors.call, True)]
        self._source = None if code is not None else self._render()
        self.code = code or compile(self._source, GUARDS_FILENAME, "exec")
        exec(self.code, namespace)
        # What each check reads (runtime/guard_paths.py), for the dict-version gate and a
        # warm entry: read from the entry (``analysis``: its JSON), else worked out when asked.
        self._analysis = Analysis.from_json(analysis, len(self.run_checks))
        if self.tensors is not None:
            self.tensors.adopt(namespace)
        self.check: Callable[..., bool] = namespace["check"]
        if compat.DICT_VERSION is not None:  # the checks dicts fix, skipped while they are
            self.check = DictGate(self).check
        self._slow: list[tuple[Callable, Callable]] | None = None
        self.input_items: list[str] = []

    def reading(self, get_inputs: Callable[..., list], items: list[str]) -> Callable[..., list]:
        """``get_inputs`` (guard_render.inputs_source of ``items``), reading what the
        dict-version gate holds (the parameters) after a call its fast path passed
        (DictGate.inputs)."""
        self.input_items = items  # (a warm entry stores them)
        gate = getattr(self.check, "__self__", None)
        return gate.reading(get_inputs, items) if isinstance(gate, DictGate) else get_inputs

    def explain_failure(self, *args: Any) -> str | None:
        """The first failing check, with the traced and the current value (slow: on a miss)."""
        if self._slow is None:
            lam = f"lambda {', '.join(self.params)}: "
            self._slow = [(eval(lam + c.expr, self.namespace), eval(lam + c.actual, self.namespace))
                          for c in self.checks]
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
        """Python ints compared by value that differ in ``args``: source -> (traced, now)."""
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
    def analysis(self) -> Analysis:
        """What each of ``run_checks`` reads (runtime/guard_paths.py)."""
        if self._analysis is None:
            exprs = [c.expr for c in self.run_checks]
            self._analysis = Analysis.of(exprs, self.params, self.namespace)
        return self._analysis

    @property
    def source(self) -> str:
        """The guard function, as Python source."""
        if self._source is None:
            self._source = self._render()
        return self._source

    def _render(self) -> str:
        text = render(self.params, self.run_checks)
        return text if self.tensors is None else f"{text}\n{self.tensors.source}"

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
    return (f"{check.source} {check.kind}: expected {format_value(expected)}, got "
            f"{format_value(value)}")
