"""``MINICOMPILE_LOGS=profile``: where the time of each compiled graph goes.

:func:`profiled` wraps a graph's ``call`` (with the part off, it returns ``call``).  After
the warm-up, calls take turns at three variants that compute the same values: ``host``
(wall clock), ``device`` (CUDA events) and ``steps`` (a timer around each kernel launch and
library call).  The report, against the roofline, is printed after :data:`REPORT_AT` calls.
"""

from __future__ import annotations

import ast
import atexit
import copy
import dataclasses
import linecache
import re
import statistics
import sys
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from minicompile import compat
from minicompile.config import Config
from minicompile.runtime import roofline

REPORT_AT = 10  # the call after which a graph's report is printed
GPU_CLOCK = 2e9  # cycles a second, at least the GPU's clock: sleeps last at least as asked
WHERE = re.compile(r"[^\s(),;]+:\d+")  # a source location ("model.py:12") in a comment


@dataclasses.dataclass
class Step:
    """A kernel launch or a library call of a generated ``call``, and its samples."""

    name: str  # the kernel, or the library function
    library: bool
    nodes: str  # the graph nodes it computes
    where: tuple[str, ...]  # the user's source lines ("model.py:12")
    times: list[float] = dataclasses.field(default_factory=list)  # seconds, one per sample
    bytes: int = 0  # read and written, at the last sample
    flops: tuple[int, torch.dtype] | None = None  # a library call's, at the last sample
    written: str = ""  # the function the wrapper calls (training's record runs another)

    def __post_init__(self) -> None:
        self.written = self.written or self.name

    @property
    def seconds(self) -> float:
        return statistics.median(self.times) if self.times else 0.0


@dataclasses.dataclass
class GraphProfile:
    """One compiled graph's profile: seconds per call (medians of its samples)."""

    function: str  # the compiled function's qualified name
    name: str  # the graph's ("f", "f_backward", "f #2" for its second graph)
    backend: str
    whole: str | None  # why only the whole graph is timed (CUDA graphs), or None
    calls: int = 0
    cuda: bool = False
    host: list[float] = dataclasses.field(default_factory=list)
    device: list[float] = dataclasses.field(default_factory=list)
    steps: list[Step] = dataclasses.field(default_factory=list)
    reported: bool = False

    @property
    def host_s(self) -> float:  # the wrapper's wall time per call
        return statistics.median(self.host) if self.host else 0.0

    @property
    def kernels_s(self) -> float:
        return sum(s.seconds for s in self.steps if not s.library)

    @property
    def library_s(self) -> float:
        return sum(s.seconds for s in self.steps if s.library)

    @property
    def device_s(self) -> float:
        """On CUDA the call's span on the device; on the CPU its kernels and library calls."""
        if self.device:
            return statistics.median(self.device)
        return self.kernels_s + self.library_s

    @property
    def total_s(self) -> float:  # the host's time or the device's, whichever is longer
        return max(self.host_s, self.device_s)

    @property
    def busy_s(self) -> float:  # kernels and library calls (or the span, if not stepped)
        return self.kernels_s + self.library_s if self.steps else self.device_s

    @property
    def python_s(self) -> float:  # the wrapper's Python, and on CUDA the device waiting
        return max(self.total_s - self.busy_s, 0.0)

    @property
    def bound(self) -> str:
        """"host" or "device": which one a call waits for."""
        host = self.host_s if self.cuda else self.host_s - self.busy_s
        return "host" if host > self.busy_s else "device"

    def __str__(self) -> str:
        return report_text(self)


_profiles: list[GraphProfile] = []
_registered = False


def profiled(call: Callable[[list], tuple], generated: types.FunctionType, function: str,
             cfg: Config, suffix: str = "") -> Callable[[list], tuple]:
    """``call`` (a generated ``call`` of ``function``, or what wraps it: a CUDA graph's
    replay) profiled under MINICOMPILE_LOGS=profile; else ``call`` itself.  ``suffix``
    names a graph of the function's beside its first (``_backward``)."""
    if "profile" not in cfg.logs:  # (named: MINICOMPILE_TRACE=1 does not turn timing on)
        return call
    global _registered
    if not _registered:
        _registered = True
        atexit.register(report_rest)
    header = generated.__code__.co_filename
    found = re.search(r"\((\w+) backend\)", linecache.getline(header, 1))
    whole = None if call is generated else (
        "CUDA graphs: a replay has no per-kernel times; the whole graph's are shown")
    name = function + suffix
    same = sum(p.name == name or p.name.startswith(f"{name} #") for p in _profiles)
    label = f"{name} #{same + 1}" if same else name
    profile = GraphProfile(function, label, found.group(1) if found else "?", whole)
    _profiles.append(profile)
    return Profiled(call, generated, profile, warmup=1 if whole is None else 2)


def _on_cuda(values: list | tuple) -> bool:
    return any(isinstance(v, torch.Tensor) and v.is_cuda for v in values)


class Profiled:
    """A generated call that times its calls in turn (see the module's doc)."""

    def __init__(self, call: Callable[[list], tuple], generated: types.FunctionType,
                 profile: GraphProfile, warmup: int) -> None:
        self.call, self.generated, self.profile, self.warmup = call, generated, profile, warmup
        self.recorder: Recorder | None = None
        self.stepped: Callable[[list], tuple] | None = None
        self.variants: tuple[str, ...] = ()

    def __call__(self, args: list) -> tuple:
        p = self.profile
        p.calls += 1
        if p.calls <= self.warmup or p.reported:
            if p.calls > 1:
                return self.call(args)
            cuda = _on_cuda(args)  # (before the call: a backward's empties its list)
            out = self.call(args)
            p.cuda = cuda or _on_cuda(out)
            return out
        if not self.variants:
            self.variants = self._variants()
        variant = self.variants[(p.calls - self.warmup - 1) % len(self.variants)]
        out = getattr(self, variant)(args)
        if p.calls >= REPORT_AT:
            _print(p)
        return out

    def _variants(self) -> tuple[str, ...]:
        p = self.profile
        if p.whole is None:
            made = instrument(self.generated)
            if made is not None:
                fn, steps, namespace = made
                p.steps = steps
                self.recorder = namespace["_mc_profile"] = Recorder(steps, p.cuda)
                self.stepped = fn
                roofline.moved_bytes()  # (its imports now, not inside a timed call)
        return ("host", "device")[:1 + p.cuda] + (("steps",) if self.stepped else ())

    def host(self, args: list) -> tuple:
        if self.profile.cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        out = self.call(args)
        self.profile.host.append(time.perf_counter() - start)
        return out

    def device(self, args: list) -> tuple:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        self._sleep()
        start.record()
        out = self.call(args)
        end.record()
        torch.cuda.synchronize()
        self.profile.device.append(start.elapsed_time(end) / 1e3)
        return out

    def steps(self, args: list) -> tuple:
        assert self.stepped is not None and self.recorder is not None
        if self.profile.cuda:
            self._sleep()
        out = self.stepped(args)
        for step, seconds in zip(self.profile.steps, self.recorder.collect()):
            step.times.append(seconds)
        return out

    def _sleep(self) -> None:
        """Keep the GPU busy while the host queues the call: events then time the work alone."""
        torch.cuda.synchronize()
        host = self.profile.host_s or 1e-3
        if compat.GPU_SLEEP is not None:
            compat.GPU_SLEEP(int(min(max(4 * host, 5e-5), 0.5) * GPU_CLOCK))


class Recorder:
    """What the rewritten ``call`` reports to around its k-th step."""

    def __init__(self, steps: list[Step], cuda: bool) -> None:
        self.steps, self.cuda = steps, cuda
        self.times = [0.0] * len(steps)
        self.started = 0.0
        self.events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                       for _ in steps] if cuda else []

    def start(self, k: int) -> None:
        if self.cuda:
            self.events[k][0].record()
        else:
            self.started = time.perf_counter()

    def stop(self, k: int, result: Any, args: tuple, kwargs: dict) -> None:
        """After step ``k``: its time, and what it moved and computed."""
        if self.cuda:
            self.events[k][1].record()
        else:
            self.times[k] = time.perf_counter() - self.started
        step = self.steps[k]
        step.bytes = roofline.moved_bytes(result, args, kwargs)
        if step.library:
            op, args = roofline.library_op(step.written, args)
            step.name = op
            step.flops = roofline.flops(op, result, args, kwargs)

    def collect(self) -> list[float]:  # the steps' seconds in the call just made
        if not self.cuda:
            return list(self.times)
        torch.cuda.synchronize()
        return [start.elapsed_time(end) / 1e3 for start, end in self.events]


# -- the rewritten call ----------------------------------------------------------------------


def instrument(generated: types.FunctionType) -> tuple[Callable, list[Step], dict] | None:
    """``generated`` recompiled with ``_mc_profile`` calls around each step (None: no source)."""
    path = generated.__code__.co_filename
    try:
        text = Path(path).read_text()
    except OSError:
        return None
    lines = text.splitlines()
    tree = ast.parse(text, filename=path)
    found = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "call"]
    if not found:
        return None
    steps: list[Step] = []
    body: list[ast.stmt] = []
    for stmt in found[0].body:
        made = step_of(stmt, lines)
        if made is None:
            body.append(stmt)
            continue
        step, result, args, kwargs = made
        k = len(steps)
        steps.append(step)
        body += [_report(stmt, "start", [ast.Constant(k)]), stmt,
                 _report(stmt, "stop", [ast.Constant(k), result, args, kwargs])]
    found[0].body = body
    module = ast.fix_missing_locations(ast.Module(body=[found[0]], type_ignores=[]))
    namespace = dict(generated.__globals__)
    exec(compile(module, path, "exec"), namespace)  # noqa: S102 (our own generated code)
    return namespace["call"], steps, namespace


def _report(at: ast.stmt, method: str, args: list[ast.expr]) -> ast.stmt:
    call = ast.Call(ast.Attribute(ast.Name("_mc_profile", ast.Load()), method, ast.Load()),
                    args, [])
    return ast.copy_location(ast.Expr(call), at)


def step_of(stmt: ast.stmt, lines: list[str]) -> tuple[Step, ast.expr, ast.expr, ast.expr] | None:
    """The step ``stmt`` is, and the expressions of its result, arguments and keyword
    arguments; None for any other statement.  A kernel launch is a call statement; a
    library call an assignment right under a comment (codegen/wrapper.py's emit_extern)."""
    none = ast.Constant(None)
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) \
            and isinstance(stmt.value.func, ast.Attribute) \
            and any(k.arg == "out" for k in stmt.value.keywords) \
            and lines[stmt.lineno - 2].lstrip().startswith("#"):  # (codegen/gemm_calls.py)
        call = stmt.value
        out = next(k.value for k in call.keywords if k.arg == "out")
        args = ast.Tuple([copy.deepcopy(a) for a in call.args], ast.Load())
        step = Step(ast.unparse(call.func), True, *_comment(lines, stmt.lineno, 1))
        return step, copy.deepcopy(out), args, ast.Dict([], [])
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
        func = stmt.value.func
        func = func.value if isinstance(func, ast.Subscript) else func
        if not isinstance(func, ast.Name):
            return None  # (library_plans.wait(), args.clear())
        name = func.id.removesuffix("_launch").removesuffix("_tuned")
        tensors = [a.func.value if isinstance(a, ast.Call) and isinstance(a.func, ast.Attribute)
                   and a.func.attr == "data_ptr" else a for a in stmt.value.args]
        args = ast.Tuple([copy.deepcopy(a) for a in tensors if isinstance(a, ast.Name)],
                         ast.Load())
        return Step(name, False, *_comment(lines, stmt.lineno, 3)), none, args, ast.Dict([], [])
    if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
            and isinstance(stmt.targets[0], ast.Name) and stmt.targets[0].id != "err"
            and lines[stmt.lineno - 2].lstrip().startswith("#")):
        return None
    value = stmt.value
    if _called(value) == "with_layout":
        value = value.args[0]  # type: ignore[attr-defined]
    if _called(value) in ("empty_strided", "empty_strided_cpu"):
        return None  # (an allocation under the comment of an empty tensor's kernel)
    if not isinstance(value, (ast.Call, ast.Subscript)):
        return None  # (a buffer's memory reused under an empty tensor's comment)
    result = ast.Name(stmt.targets[0].id, ast.Load())
    if isinstance(value, ast.Subscript):  # (operator.getitem)
        step = Step(ast.unparse(value), True, *_comment(lines, stmt.lineno, 1))
        return step, result, ast.Tuple([], ast.Load()), ast.Dict([], [])
    args = ast.Tuple([copy.deepcopy(a) for a in value.args], ast.Load())
    keywords = [k for k in value.keywords if k.arg is not None]
    kwargs = ast.Dict([ast.Constant(k.arg) for k in keywords],
                      [copy.deepcopy(k.value) for k in keywords])
    step = Step(ast.unparse(value.func), True, *_comment(lines, stmt.lineno, 1))
    return step, result, args, kwargs


def _called(value: ast.expr) -> str | None:
    """The name ``value`` calls (``name(...)``), or None."""
    is_call = isinstance(value, ast.Call) and isinstance(value.func, ast.Name)
    return value.func.id if is_call else None  # type: ignore[attr-defined]


def _comment(lines: list[str], lineno: int, reach: int) -> tuple[str, tuple[str, ...]]:
    """The nodes and source lines of the comment at most ``reach`` lines above ``lineno``."""
    for k in range(lineno - 2, max(lineno - 2 - reach, -1), -1):
        text = lines[k].strip()
        if text.startswith("#"):
            nodes, _, where = text.lstrip("# ").partition("  (")
            return nodes, tuple(dict.fromkeys(WHERE.findall(where)))
    return "", ()


# -- reports ---------------------------------------------------------------------------------


def report_text(p: GraphProfile) -> str:
    if not max(len(p.host), len(p.device), *(len(s.times) for s in p.steps)):
        return f"minicompile profile: {p.name}: {p.calls} call(s), too few to profile"
    where = "cuda" if p.cuda else "cpu, Triton's interpreter" if p.backend == "triton" else "cpu"
    device = "its span on the GPU" if p.device else "its kernels and library calls"
    lines = [(f"minicompile profile: {p.name} ({p.backend} backend, {where}): {p.calls} calls "
              f"(the first {'two' if p.whole else 'one'} warming up)"),
             (f"  host {_ms(p.host_s)} per call (the wrapper's wall time); device "
              f"{_ms(p.device_s)} ({device})")]
    if p.whole is not None:
        lines.append(f"  {p.whole}")
    dev = torch.device("cuda", torch.cuda.current_device()) if p.cuda else torch.device("cpu")
    bandwidth = roofline.copy_bandwidth(dev) if p.steps else 0.0
    peaks: dict[torch.dtype, float | None] = {}
    total = p.total_s or 1.0
    if p.steps:
        lines.append(f"  {'ms/call':>9} {'share':>6}  {'roofline':34} kernel or library call: "
                     f"graph nodes (source lines)")
    for s in p.steps:
        source = f" ({', '.join(s.where)})" if s.where else ""
        lines.append(f"  {s.seconds * 1e3:9.4f} {s.seconds / total:6.1%}  "
                     f"{_roofline(s, bandwidth, dev, peaks):34} {s.name}: {s.nodes}{source}")
    split = (f"generated kernels {p.kernels_s / total:.0%}, library calls "
             f"{p.library_s / total:.0%}, Python {p.python_s / total:.0%}" if p.steps
             else f"the device {p.device_s / total:.0%}, the host beyond it "
             f"{p.python_s / total:.0%}")
    lines.append(f"  summary: bound by the {p.bound}: {split} of {_ms(total)} per call")
    if p.steps:
        limits = [(f"copy bandwidth {bandwidth / 1e9:.1f} GB/s (a copy of "
                   f"{roofline.COPY_BYTES[dev.type] >> 20} MiB)")]
        limits += [f"{str(d).removeprefix('torch.')} matmul {f / 1e12:.3g} TFLOP/s (n = "
                   f"{roofline.matmul_size(dev, d)})" for d, f in peaks.items() if f]
        lines.append(f"  measured in this process: {'; '.join(limits)}")
    return "\n".join(lines)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f} ms"


def _roofline(s: Step, bandwidth: float, device: torch.device,
              peaks: dict[torch.dtype, float | None]) -> str:
    """A step's share of the device's copy bandwidth, or a library GEMM's of peak FLOP/s."""
    if not s.seconds:
        return "n/a"
    if s.flops is not None:
        work, dtype = s.flops
        if dtype not in peaks:
            peaks[dtype] = roofline.peak_flops(device, dtype)
        peak = peaks[dtype]
        if peak:
            rate = work / s.seconds
            return f"{rate / peak:6.1%} of peak ({rate / 1e9:.3g} GFLOP/s)"
    rate = s.bytes / s.seconds
    return f"{rate / bandwidth:6.1%} of copy bw ({rate / 1e9:.3g} GB/s)"


def _print(p: GraphProfile) -> None:
    p.reported = True
    print(report_text(p), file=sys.stderr)


def report_rest() -> None:
    """At exit: the graphs not reported yet."""
    for p in _profiles:
        if not p.reported and p.calls:
            _print(p)


def profile_report(fn: Any = None) -> list[GraphProfile]:
    """The profiles of the graphs compiled under MINICOMPILE_LOGS=profile: of ``fn`` (a
    compiled function or module, or what was compiled), or all.  Each prints as the log
    does and splits a call's time (``host_s``, ``device_s``, ``kernels_s``, ``library_s``,
    ``python_s``, ``bound``)."""
    if fn is None:
        return list(_profiles)
    fn = getattr(fn, "_orig_mod", fn)
    if isinstance(fn, torch.nn.Module):
        fn = type(fn).forward
    name = getattr(fn, "__qualname__", None)
    return [p for p in _profiles if p.function == name]


def forget() -> None:
    _profiles.clear()
