"""Start-up time: the cold and warm first call of minicompile and torch.compile, each in a
fresh process, side by side, with where minicompile's cold call spends its time.

    python examples/bench_startup.py                      # the workloads, CUDA if present
    python examples/bench_startup.py --workloads chain,layer_norm --repeat 3
    python examples/bench_startup.py --zoo --compilers minicompile   # and the model zoo
    python examples/bench_startup.py --device cpu --workloads pointwise
    python examples/bench_startup.py --bytecode-cache /tmp/pyc   # Python without .pyc files
    OMP_NUM_THREADS=1 python examples/bench_startup.py --cpu-time  # a shared, busy machine
    python examples/bench_startup.py --check chain,zoo --backend cpp  # one process, all of
    #   them compiled, called twice with fresh inputs and compared with eager: stats as JSON

For each workload and compiler a child process imports torch, then the compiler, builds the
inputs, runs the workload eagerly once (the warm-up), and times the first compiled call
(synchronised on CUDA), checking it against eager.  *Cold* runs on empty caches (a fresh
MINICOMPILE_CACHE_DIR, TORCHINDUCTOR_CACHE_DIR and TRITON_CACHE_DIR); *warm* is the next
process on the same caches, and *call* that process's second call (the work itself,
nothing left to load): warm minus call is what starting warm costs.  Beside minicompile's
cold call, its phases (``MINICOMPILE_LOGS=perf``: import, capture, passes, lowering, fusion,
codegen, build, load).  Workloads (functions unless said):

- ``pointwise``: ``sin(x) + sin(y)``;  ``chain``: the 12-op pointwise chain of issue 31
- ``layer_norm``: ``F.layer_norm`` with weight and bias;  ``layer_norm_eps``: with eps given
- ``nanogpt``: the GPT forward of examples/gpt.py (a module, under no_grad)
- ``resnet``: timm ``resnet50``, random init (bf16 on CUDA; float32, 64x64 on CPU)
- the examples' compiled functions: ``trig``, ``sin_sin`` (examples/trig.py), ``softmax``
  (examples/layernorm.py), ``attention`` (examples/causal_self_attention.py),
  ``dynamic_mlp`` (examples/dynamic_batch.py's MLP, over two batch sizes: two entries)
- ``zoo:<name>``, or ``zoo`` for all: the models of examples/model_zoo.py (``--zoo``)

The table gives medians over ``--repeat`` pairs of processes, and at the end ``import
minicompile`` beyond ``import torch``.  Modules have warm entries when their fingerprint
allows (runtime/fingerprints.py); the notes say when one was traced again.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

EXAMPLES = Path(__file__).resolve().parent
ROOT = EXAMPLES.parent
WORKLOADS = ("pointwise", "chain", "layer_norm", "layer_norm_eps", "nanogpt", "resnet")
EXAMPLE_WORKLOADS = ("trig", "sin_sin", "softmax", "attention", "dynamic_mlp")
COMPILERS = ("minicompile", "torch.compile")
PHASES = ("import", "capture", "passes", "lowering", "fusion", "codegen", "build", "load")


# -- the workloads -------------------------------------------------------------------------


def pointwise(x, y):  # noqa: ANN001, ANN201
    import torch

    return torch.sin(x) + torch.sin(y)


def chain(x, y):  # noqa: ANN001, ANN201
    import torch

    a = torch.relu(x * 1.5 + y)
    b = torch.sigmoid(a) * torch.tanh(y) + torch.nn.functional.silu(y)
    return torch.exp(-b * b) + torch.abs(x) / (1.0 + y * y)


def layer_norm(x, w, b):  # noqa: ANN001, ANN201
    import torch.nn.functional as F

    return F.layer_norm(x, (x.shape[-1],), w, b)


def layer_norm_eps(x, w, b):  # noqa: ANN001, ANN201
    import torch.nn.functional as F

    return F.layer_norm(x, (x.shape[-1],), w, b, 1e-5)


@dataclasses.dataclass
class Workload:
    fn: Callable  # a function or a module
    inputs: Callable[[int], tuple[tuple, dict]]  # (args, kwargs) of call k: fresh values
    tol: float


def _randn(device: str, *shapes: tuple[int, ...]) -> Callable[[int], tuple[tuple, dict]]:
    import torch

    return lambda k: (tuple(torch.randn(s, device=device) for s in shapes), {})


def make_workload(name: str, device: str, small: bool = False) -> Workload:
    """The workload ``name`` on ``device`` (``small``: inputs and models for a test)."""
    import torch

    torch.manual_seed(0)
    cuda = device == "cuda"
    n, rows, cols = (1000, 8, 64) if small else (1 << 20, 64, 1024)
    if name in ("pointwise", "chain"):
        return Workload(globals()[name], _randn(device, (n,), (n,)), 1e-5)
    if name in ("layer_norm", "layer_norm_eps"):
        return Workload(globals()[name], _randn(device, (rows, cols), (cols,), (cols,)), 1e-4)
    if name == "nanogpt":
        from gpt import GPT, GPTConfig

        config = GPTConfig(n_layer=1, n_embd=32, block_size=16, vocab_size=64) if small else (
            GPTConfig(n_layer=4 if cuda else 2, n_embd=256 if cuda else 128))
        model = GPT(config).to(device).eval()
        batch = 2 if small else 8
        return Workload(model, lambda k: ((torch.randint(
            0, config.vocab_size, (batch, config.block_size), device=device),), {}), 1e-3)
    if name == "resnet":
        from model_report import import_torchvision

        import_torchvision()
        import timm

        dtype = torch.bfloat16 if cuda else torch.float32
        model = timm.create_model("resnet50", pretrained=False).to(device, dtype).eval()
        size, batch = (224, 8) if cuda else (64, 1)
        return Workload(model, lambda k: ((torch.randn(
            batch, 3, size, size, device=device, dtype=dtype),), {}), 5e-2 if cuda else 1e-3)
    if name.startswith("zoo:"):
        from model_zoo import MODELS

        case = next((c for c in MODELS if c.name == name[4:]), None)
        if case is not None:
            return Workload(case.build().to(device).eval(), lambda k: case.inputs(device), 1e-3)
    return _example_workload(name, device, small)


def _example_workload(name: str, device: str, small: bool) -> Workload:
    """The functions and modules the examples compile."""
    import torch

    if name in ("trig", "sin_sin"):
        import trig

        fn = trig.fn if name == "trig" else trig.sin_sin  # (decorated: the function itself)
        shapes = [(1000 if small else 10000,)] * (2 if name == "trig" else 1)
        return Workload(fn.original, _randn(device, *shapes), 1e-5)
    if name == "softmax":
        import layernorm

        return Workload(layernorm.softmax, _randn(device, (8, 64) if small else (64, 1024)), 1e-5)
    if name in ("attention", "dynamic_mlp"):
        from dynamic_batch import MLP
        from gpt import CausalSelfAttention, GPTConfig

        config = GPTConfig(n_embd=32 if small else 128, n_head=4)
        length = 16 if small else 64
        if name == "attention":
            model = CausalSelfAttention(config)
            return Workload(model.to(device).eval(), _randn(device, (2, length, config.n_embd)),
                            1e-4)
        model = MLP(config.n_embd).to(device).eval()
        return Workload(model, lambda k: ((torch.randn(
            (8, 16)[k % 2], length, config.n_embd, device=device),), {}), 1e-4)
    raise SystemExit(f"unknown workload {name!r}; known: {', '.join(all_workloads(True))}")


def all_workloads(zoo: bool) -> list[str]:
    names = [*WORKLOADS, *EXAMPLE_WORKLOADS]
    if zoo:
        from model_zoo import MODELS

        names += [f"zoo:{c.name}" for c in MODELS]
    return names


def expand(names: str) -> list[str]:
    """``--workloads``/``--check`` names, ``zoo`` standing for every zoo model."""
    out: list[str] = []
    for name in names.split(","):
        out += [n for n in all_workloads(True) if n.startswith("zoo:")] if name == "zoo" else [name]
    return out


def same(got: Any, want: Any, tol: float) -> bool:
    """Every tensor and other leaf of two results equal (tensors to ``tol``)."""
    import torch
    from model_zoo import tensors_of

    a, b = tensors_of(got), tensors_of(want)
    return len(a) == len(b) and all(
        torch.allclose(x.float(), y.float(), rtol=tol, atol=tol)
        if isinstance(y, torch.Tensor) and isinstance(x, torch.Tensor) else x == y
        for x, y in zip(a, b))


# -- the children --------------------------------------------------------------------------


LOCK_ENV = "BENCH_STARTUP_LOCK"  # a file: the timed calls hold it (examples/startup_table.py)
CPUS_ENV = "BENCH_STARTUP_CPUS"  # the cores a child runs on, "0,1,..."


@contextlib.contextmanager
def alone() -> Iterator[None]:
    """The timed part of a child, where ``LOCK_ENV`` names a lock file: while no other
    child holds it (children overlap only in what is not timed)."""
    path = os.environ.get(LOCK_ENV)
    if not path:
        yield
        return
    import fcntl

    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def child(workload: str, compiler: str, device: str) -> dict:
    """One first call in a fresh process: times, stats and minicompile's phases."""
    if os.environ.get(CPUS_ENV):  # (before torch starts its threads, and its compilers theirs)
        os.sched_setaffinity(0, {int(c) for c in os.environ[CPUS_ENV].split(",")})
    start = time.perf_counter()
    import torch

    import_torch = time.perf_counter() - start
    start = time.perf_counter()
    if compiler == "minicompile":
        import minicompile

        compile_fn = minicompile.compile
    else:
        compile_fn = torch.compile
    import_compiler = time.perf_counter() - start
    w = make_workload(workload, device)
    args, kwargs = w.inputs(0)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    with torch.no_grad(), alone():
        expected = w.fn(*args, **kwargs)  # the eager warm-up
        sync()
        start, cpu = time.perf_counter(), time.thread_time()
        compiled = compile_fn(w.fn)
        out = compiled(*args, **kwargs)
        sync()
        first, first_cpu = time.perf_counter() - start, time.thread_time() - cpu
        start, cpu = time.perf_counter(), time.thread_time()
        again = compiled(*args, **kwargs)
        sync()
        second, second_cpu = time.perf_counter() - start, time.thread_time() - cpu
    # Checked against eager; a mismatch is reported beside the times, not raised.
    result = {"import_torch": import_torch, "import_compiler": import_compiler,
              "first_call": first, "second_call": second, "first_call_cpu": first_cpu,
              "second_call_cpu": second_cpu,
              "matches": same(out, expected, w.tol) and same(again, expected, w.tol)}
    if compiler == "minicompile":
        from minicompile import perf

        result["stats"] = minicompile.stats()
        result["phases"] = perf.totals()
    return result


def check(names: list[str], backend: str, device: str) -> dict[str, dict]:
    """Each workload compiled anew (after ``minicompile.reset()``), called twice with fresh
    inputs under no_grad and compared with eager: its stats, and whether both matched."""
    import torch

    import minicompile

    found = {}
    for name in names:
        w = make_workload(name, device, small=True)
        minicompile.reset()
        compiled = minicompile.compile(w.fn, backend=backend)
        matches = True
        with torch.no_grad():
            for k in range(2):
                args, kwargs = w.inputs(k)
                matches = matches and same(compiled(*args, **kwargs), w.fn(*args, **kwargs),
                                           w.tol)
        found[name] = {**minicompile.stats(), "matches": matches}
    return found


# -- the parent: fresh processes, cold then warm ------------------------------------------


BYTECODE: Path | None = None  # --bytecode-cache: Python's own .pyc files, kept there
CPU_TIME = False  # --cpu-time: the calling thread's CPU time, not the wall clock's


def child_env(cache: Path) -> dict[str, str]:
    """The environment of a child: ours without MINICOMPILE_*, TORCHINDUCTOR_* and
    TRITON_INTERPRET, on the caches under ``cache``, with the examples importable."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MINICOMPILE_", "TORCHINDUCTOR_"))}
    env.pop("TRITON_INTERPRET", None)
    if BYTECODE is not None:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(BYTECODE)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(EXAMPLES), env.get("PYTHONPATH", "")])
    env["MINICOMPILE_CACHE_DIR"] = str(cache / "minicompile")
    env["TORCHINDUCTOR_CACHE_DIR"] = str(cache / "inductor")
    env["TRITON_CACHE_DIR"] = str(cache / "triton")
    return env


def run_child(workload: str, compiler: str, device: str, cache: Path, timeout: float,
              extra: dict[str, str] | None = None) -> dict:
    """A child's results (``extra``: more of its environment), or {"error": why}."""
    env = {**child_env(cache), **(extra or {})}
    env["MINICOMPILE_LOGS"] = "perf"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", workload, compiler, device]
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timeout ({timeout:.0f} s)"}
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["?"])[-1]
        return {"error": f"exit {proc.returncode}: {tail[:120]}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def measure(workload: str, compiler: str, device: str, repeat: int, timeout: float) -> dict:
    """Medians of ``repeat`` (cold, warm) pairs, each pair on caches of its own."""
    runs: list[tuple[dict, dict]] = []
    if BYTECODE is not None:  # one untimed run writes the .pyc files of what the cell imports
        with tempfile.TemporaryDirectory(prefix="bench-startup-") as tmp:
            run_child(workload, compiler, device, Path(tmp), timeout)
    for _ in range(repeat):
        with tempfile.TemporaryDirectory(prefix="bench-startup-") as tmp:
            first = run_child(workload, compiler, device, Path(tmp), timeout)
            if "error" in first:
                return first
            second = run_child(workload, compiler, device, Path(tmp), timeout)
            if "error" in second:
                return second
        runs.append((first, second))

    def median(pick: Callable[[dict, dict], float]) -> float:
        return statistics.median(pick(a, b) for a, b in runs)

    first, second = ("first_call_cpu", "second_call_cpu") if CPU_TIME else (
        "first_call", "second_call")
    out = {"cold": median(lambda a, b: a[first]), "warm": median(lambda a, b: b[first]),
           "call": median(lambda a, b: b[second]),
           "import": statistics.median(r["import_compiler"] for pair in runs for r in pair),
           "matches": all(a["matches"] and b["matches"] for a, b in runs)}
    if "stats" in runs[0][0]:
        out["kernels"] = runs[0][0]["stats"]["kernels"]
        out["warm_entry"] = all(b["stats"]["frames"] == 0 for _, b in runs)
        out["phases"] = {p: median(lambda a, b, p=p: a["phases"].get(p, 0.0)) for p in PHASES}
    return out


def cell(r: dict, key: str) -> str:
    if not r:
        return "-"
    if "error" in r:
        return r["error"] if key == "cold" else ""
    return f"{r[key]:.2f} s" if key != "call" else f"{r[key] * 1e3:.1f} ms"


def phases(r: dict) -> str:
    """The cold call's phases, in ms (those over 1 ms)."""
    spent = r.get("phases", {})
    return " ".join(f"{p[:4]} {spent[p] * 1e3:.0f}" for p in PHASES if spent.get(p, 0) >= 1e-3)


def print_row(workload: str, found: dict[str, dict]) -> None:
    mc, tc = found.get("minicompile", {}), found.get("torch.compile", {})
    ratio = f"{tc['cold'] / mc['cold']:.1f}x" if "cold" in mc and "cold" in tc else "-"
    beyond = f"{(mc['warm'] - mc['call']):.3f} s" if "warm" in mc else "-"
    notes = "".join(f"{c} DIFFERS FROM EAGER; " for c, r in found.items()
                    if not r.get("matches", True))
    if "kernels" in mc:
        notes += f"{mc['kernels']} kernels" + ("" if mc["warm_entry"] else
                                              "; NO WARM ENTRY: traced again")
    cells = [cell(mc, "cold"), phases(mc), cell(mc, "warm"), cell(mc, "call"), beyond,
             cell(tc, "cold"), cell(tc, "warm"), ratio, notes]
    print(f"| {workload} | {' | '.join(cells)} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", default=",".join([*WORKLOADS, *EXAMPLE_WORKLOADS]))
    parser.add_argument("--zoo", action="store_true", help="the model zoo's models too")
    parser.add_argument("--compilers", default=",".join(COMPILERS))
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda if present)")
    parser.add_argument("--repeat", type=int, default=1, help="pairs of processes per cell")
    parser.add_argument("--timeout", type=float, default=1200, help="seconds per process")
    parser.add_argument("--bytecode-cache", metavar="DIR", default=None, help=(
        "keep Python's .pyc files in DIR (PYTHONPYCACHEPREFIX), written by an untimed run "
        "of each cell first: for machines whose Python writes none (PYTHONDONTWRITEBYTECODE)"
        " and so compiles every imported module's source in every process"))
    parser.add_argument("--cpu-time", action="store_true", help=(
        "time the first calls by the calling thread's CPU time (a shared, busy machine; "
        "with OMP_NUM_THREADS=1, as work on other threads is not counted)"))
    parser.add_argument("--check", metavar="NAMES", help="compile and compare NAMES in this "
                        "process, print their stats as JSON (tests/backends/test_warm_start.py)")
    parser.add_argument("--backend", default="auto", help="minicompile's backend for --check")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:  # (before anything imports torch: the child times that)
        print(json.dumps(child(*args.child)))
        return
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if args.check:
        print(json.dumps(check(expand(args.check), args.backend, device)))
        return
    global BYTECODE, CPU_TIME
    BYTECODE = Path(args.bytecode_cache).resolve() if args.bytecode_cache else None
    CPU_TIME = args.cpu_time
    where = torch.cuda.get_device_name() if device == "cuda" else f"CPU ({os.cpu_count()} cores)"
    load = f"; load average {os.getloadavg()[0]:.1f}" if hasattr(os, "getloadavg") else ""
    print(f"start-up on {where}: PyTorch {torch.__version__}, Python "
          f"{sys.version.split()[0]}; medians of {args.repeat} pair(s) of fresh processes"
          + (f"; Python bytecode cached in {BYTECODE}" if BYTECODE else "")
          + ("; first calls in CPU time" if CPU_TIME else "") + load)
    print("| workload | minicompile cold | its phases (ms) | warm first call | warm call "
          "itself | warm beyond the call | torch.compile cold | torch.compile warm | "
          "cold: torch.compile / minicompile | notes |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    names = expand(args.workloads) + (expand("zoo") if args.zoo else [])
    imports = []
    for workload in names:
        found = {c: measure(workload, c, device, args.repeat, args.timeout)
                 for c in args.compilers.split(",")}
        print_row(workload, found)
        if "import" in found.get("minicompile", {}):
            imports.append(found["minicompile"]["import"])
    if imports:
        print(f"import minicompile beyond import torch: {statistics.median(imports) * 1e3:.0f} ms")


if __name__ == "__main__":
    main()
