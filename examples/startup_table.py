"""Issue 31's done-when table in one short run: each workload's and zoo model's cold first
call with minicompile and with torch.compile (empty caches), and minicompile's warm first
call in a second process, each in a fresh process, once.

    python examples/startup_table.py --bytecode-cache /tmp/pyc      # CUDA if present
    python examples/startup_table.py --device cpu --workloads pointwise,zoo:timm_resnext26ts
    OMP_NUM_THREADS=1 python examples/startup_table.py --device cpu --cpu-time

The children are examples/bench_startup.py's (the same workloads, timings and checks); what
this adds is the schedule.  ``bench_startup.py --zoo --repeat 3`` runs 7 processes per
compiler and workload one after another (an hour on an H200); here each cell is three
processes (minicompile cold, then warm on its cache; torch.compile cold), and:

- Python's bytecode is written by one untimed process before any cell (it imports every
  workload's libraries, compiles a small function with each compiler, and byte-compiles
  the compilers' packages), not one per cell and compiler.
- Children overlap only in what is not timed: each takes its lane's lock from its eager
  warm-up to the end of its second call, so no two timed calls of a lane ever overlap.
  Imports, building the model and the checks against eager run beside another child's
  timed call (``--jobs`` children a lane: the others take a core or so each, of 16 on the
  GPU machine).
- Lanes: with several GPUs (``--lanes``, default one per visible GPU), each lane has one
  GPU and an equal share of the cores (16 each on 4 or 8 H200s, as on the one-GPU
  machine), so the lanes do not slow each other's timed calls.

Cells are handed out longest first (torch.compile's cold calls of the models); the table
comes at the end, with the run's wall time, and each row goes to stderr as soon as both
its cells are done (a run cut short keeps those).
"""

from __future__ import annotations

import argparse
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import bench_startup as bench

WARM_ENV = "BENCH_STARTUP_WARM_BYTECODE"  # the untimed child: which workloads to import


def warm_bytecode(names: list[str], device: str) -> None:
    """The untimed child: import what the cells import and compile one small function with
    each compiler, so that Python writes their bytecode; then byte-compile the compilers'
    packages (modules a compile imports only for some graphs)."""
    import compileall

    import torch
    import torch._dynamo
    import torch._inductor

    import minicompile

    for name in names:
        bench.make_workload(name, device, small=True)
    x = torch.randn(64, device=device)
    for compile_fn in (minicompile.compile, torch.compile):
        compile_fn(bench.pointwise)(x, x)
    for package in (minicompile, torch._inductor, torch._dynamo):
        compileall.compile_dir(Path(package.__file__).parent, quiet=2, workers=0)


def lane_envs(lanes: int, device: str, locks: Path) -> list[dict[str, str]]:
    """Each lane's environment: its lock; with several lanes its GPU and cores."""
    envs = [{bench.LOCK_ENV: str(locks / f"lane{k}")} for k in range(lanes)]
    if lanes > 1:
        cpus = sorted(os.sched_getaffinity(0))
        share = len(cpus) // lanes
        gpus = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")
        for k, env in enumerate(envs):
            env[bench.CPUS_ENV] = ",".join(map(str, cpus[k * share:(k + 1) * share]))
            if device == "cuda":
                env["CUDA_VISIBLE_DEVICES"] = gpus[k] if len(gpus) == lanes else str(k)
    return envs


def cell(name: str, compiler: str, device: str, env: dict[str, str], timeout: float) -> dict:
    """The cold call (and for minicompile the warm one, on the same caches)."""
    with tempfile.TemporaryDirectory(prefix="startup-table-") as tmp:
        cold = bench.run_child(name, compiler, device, Path(tmp), timeout, env)
        if "error" in cold or compiler != "minicompile":
            return {"cold": cold}
        return {"cold": cold, "warm": bench.run_child(name, compiler, device, Path(tmp),
                                                     timeout, env)}


def run_all(names: list[str], device: str, lanes: int, jobs: int,
            timeout: float) -> dict[tuple[str, str], dict]:
    todo: queue.Queue = queue.Queue()
    for compiler in ("torch.compile", "minicompile"):  # (the longest first)
        for name in sorted(names, key=lambda n: not n.startswith(("zoo:", "resnet", "nano"))):
            todo.put((name, compiler))
    found: dict[tuple[str, str], dict] = {}

    def worker(env: dict[str, str]) -> None:
        while True:
            try:
                name, compiler = todo.get_nowait()
            except queue.Empty:
                return
            found[name, compiler] = cell(name, compiler, device, env, timeout)
            mc, tc = found.get((name, "minicompile")), found.get((name, "torch.compile"))
            # (a row as soon as it is whole: a run cut short by a time limit keeps them)
            print(row(name, mc, tc) if mc and tc else f"done: {name} {compiler}",
                  file=sys.stderr, flush=True)

    with tempfile.TemporaryDirectory(prefix="startup-locks-") as locks:
        threads = [threading.Thread(target=worker, args=(env,))
                   for env in lane_envs(lanes, device, Path(locks)) for _ in range(jobs)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    return found


def row(name: str, mc: dict, tc: dict) -> str:
    first, second = ("first_call_cpu", "second_call_cpu") if bench.CPU_TIME else (
        "first_call", "second_call")
    cells, notes = [], []
    cold, warm, tcold = mc.get("cold", {}), mc.get("warm", {}), tc.get("cold", {})
    for r in (cold, tcold):
        cells.append(r.get("error", "") if "error" in r else f"{r[first]:.2f} s")
    ratio = f"{tcold[first] / cold[first]:.1f}x" if first in cold and first in tcold else "-"
    cells.append(ratio)
    if first in warm:
        cells += [f"{warm[first]:.3f} s", f"{warm[second] * 1e3:.1f} ms",
                  f"{warm[first] - warm[second]:.3f} s", str(warm["stats"]["frames"])]
    else:
        cells += [warm.get("error", "-"), "", "", ""]
    notes += [f"{c} DIFFERS FROM EAGER" for c, r in (("minicompile", cold), ("warm", warm),
                                                    ("torch.compile", tcold))
              if r.get("matches") is False]
    return f"| {name} | {' | '.join(cells)} | {'; '.join(notes)} |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", default="all", help="names, or all (with the zoo)")
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda if present)")
    parser.add_argument("--lanes", type=int, default=None, help="default: one a visible GPU")
    parser.add_argument("--jobs", type=int, default=2, help="children at once in a lane")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per process")
    parser.add_argument("--bytecode-cache", metavar="DIR", default=None,
                        help="Python's .pyc files kept in DIR (as bench_startup.py's)")
    parser.add_argument("--cpu-time", action="store_true", help="as bench_startup.py's")
    args = parser.parse_args()
    if os.environ.get(WARM_ENV):
        warm_bytecode(os.environ[WARM_ENV].split(","), args.device)
        return
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    lanes = args.lanes or (max(1, torch.cuda.device_count()) if device == "cuda" else 1)
    bench.BYTECODE = Path(args.bytecode_cache).resolve() if args.bytecode_cache else None
    bench.CPU_TIME = args.cpu_time
    names = bench.expand("zoo") if args.workloads == "all" else []
    names = [*(bench.all_workloads(False) if args.workloads == "all" else
               bench.expand(args.workloads)), *names]
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="startup-bytecode-") as tmp:
        env = {**bench.child_env(Path(tmp)), WARM_ENV: ",".join(names)}
        subprocess.run([sys.executable, __file__, "--device", device], env=env,
                       timeout=args.timeout, check=False)
    warmed = time.perf_counter() - start
    found = run_all(names, device, lanes, args.jobs, args.timeout)
    where = torch.cuda.get_device_name() if device == "cuda" else f"CPU ({os.cpu_count()} cores)"
    print(f"start-up on {where}: PyTorch {torch.__version__}, one run of each; {lanes} "
          f"lane(s) of {args.jobs} children, timed calls one at a time a lane"
          + ("; first calls in CPU time" if bench.CPU_TIME else ""))
    print("| workload | minicompile cold | torch.compile cold | torch.compile / minicompile "
          "| minicompile warm (second process) | its call itself | warm beyond the call "
          "| warm compiles | notes |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name in names:
        print(row(name, found.get((name, "minicompile"), {}),
                  found.get((name, "torch.compile"), {})))
    print(f"wall time {time.perf_counter() - start:.0f} s (bytecode {warmed:.0f} s)")


if __name__ == "__main__":
    main()
