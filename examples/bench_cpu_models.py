"""The model zoo (examples/model_zoo.py) on the CPU: per model, eval (no_grad) and a train
step (forward, loss, backward: bench_models.step), the median call of eager, minicompile and
torch.compile, on 2 threads and on all cores (``torch.set_num_threads``), side by side with
the ratios, and where minicompile's call spends its time (kernels, library calls, the
generated code's Python: its ``MINICOMPILE_LOGS=profile`` report, from a second compiled
copy; and the rest of the step, outside its compiled graphs: guards, autograd, the loss,
code that runs eagerly after a graph break).

    python examples/bench_cpu_models.py                      # every model, eval and train
    python examples/bench_cpu_models.py --no-inductor hf_bert timm_resnext26ts
    python examples/bench_cpu_models.py --modes eval --threads 1,2,16
    python examples/bench_cpu_models.py --threads 1 --cpu-time   # a shared, busy machine

torch.compile's first compile takes about a minute a model and mode on a small CPU:
``--no-inductor`` leaves it out.  Each model and mode is compiled once; the thread counts
then share the compiled code (minicompile's kernels run on ``torch.get_num_threads()``
threads at call time, as eager does).  Every result is checked against eager's first (a
difference is printed, the row still timed).
Ratios below 1 mean faster than eager (``mc/eager``) or than torch.compile (``mc/tc``).
Eager, minicompile and torch.compile are timed in turns (``timing.interleaved_ms``: 7
rounds of about 50 ms of calls each, the median of round medians), so that a shared
machine's drift falls on all alike.
``--cpu-time`` times the calling thread's CPU time (``time.thread_time``) instead of the wall
clock: on one thread, where all the work runs on it, a machine shared with other jobs then
gives steady numbers (their time slices are not counted).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import tempfile
import time

os.environ.setdefault("MINICOMPILE_CACHE_DIR", tempfile.mkdtemp(prefix="bench-cpu-models-"))

import torch  # noqa: E402

import minicompile  # noqa: E402
from bench_models import check, step, without_dropout  # noqa: E402
from minicompile import config  # noqa: E402
from model_zoo import MODELS  # noqa: E402
from timing import interleaved_ms  # noqa: E402

SPLIT = ("kernels_s", "library_s", "python_s")


def versions(case, train: bool, inductor: bool) -> tuple[dict, object]:  # noqa: ANN001
    """The steps of eager, minicompile and (``inductor``) torch.compile for one model and
    mode, each run and checked once; and a profiled minicompile step (for the split)."""
    torch.manual_seed(0)
    model = case.build()
    model = without_dropout(model.train()) if train else model.eval()
    args, kwargs = case.inputs(torch.device("cpu"))
    expected = step(model, args, kwargs, train)()
    minicompile.reset()
    steps = {"eager": step(model, args, kwargs, train),
             "mc": step(minicompile.compile(model), args, kwargs, train)}
    with config.patch(logs=frozenset({"profile"})):  # (compiled at the first call)
        profiled = step(minicompile.compile(model), args, kwargs, train)
        profiled()
    if inductor:
        torch._dynamo.reset()
        steps["tc"] = step(torch.compile(model), args, kwargs, train)
    for name in [n for n in ("mc", "tc") if n in steps]:
        try:
            out = steps[name]()
        except Exception as e:  # noqa: BLE001 (no toolchain for Inductor here, say)
            print(f"  {case.name}: {name} failed ({type(e).__name__}: {e})"[:160])
            del steps[name]
            continue
        try:
            check(out, expected, torch.float32, train)
        except AssertionError as e:  # timed all the same, and said
            print(f"  {case.name} {'train' if train else 'eval'}: {name} differs from eager "
                  f"beyond bench_models' tolerance: {str(e).splitlines()[-1].strip()}"[:160])
    return steps, profiled


def time_split(profiled, step_ms: float) -> str:  # noqa: ANN001
    """Shares of minicompile's step (``step_ms``) in its kernels, library calls and the
    generated code's Python (every graph of the step: forward and backward, the segments
    after a graph break and the frames a break compiled on their own), and the rest (the
    step outside its graphs), from minicompile.profile_report: all its graphs, the profiled
    copy being the only one compiled with the profile on since versions' reset."""
    with contextlib.redirect_stderr(io.StringIO()):  # (the report the log prints)
        for _ in range(12):  # the report's warm-up and samples of each variant
            profiled()
    graphs = minicompile.profile_report()
    seconds = [sum(getattr(g, part) for g in graphs) for part in SPLIT]
    total = max(step_ms / 1e3, sum(seconds))  # (the graphs' wall time, the step's maybe CPU)
    return " ".join(f"{s / total:5.0%}" for s in [*seconds, total - sum(seconds)])


def row(case, mode: str, steps: dict, split, threads: list[int], clock) -> str:  # noqa: ANN001
    cells = []
    num = lambda v: f"{v:8.2f}" if v else f"{'-':>8s}"  # noqa: E731
    ratio = lambda a, b: f"{a / b:6.2f}" if a and b else f"{'-':>6s}"  # noqa: E731
    for n in threads:
        torch.set_num_threads(n)
        with torch.set_grad_enabled(mode == "train"):
            ms = interleaved_ms(steps, False, clock=clock)
            shares = time_split(split, ms["mc"]) if "mc" in ms else ""
        eager, mc, tc = ms["eager"], ms.get("mc"), ms.get("tc")
        cells.append(f"{num(eager)} {num(mc)} {num(tc)} {ratio(mc, eager)} {ratio(mc, tc)} "
                     f"{shares}")
    return f"{case.name:22s} {mode:5s} " + " | ".join(cells)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="*", help="model names (default: every model)")
    parser.add_argument("--no-inductor", action="store_true", help="leave torch.compile out")
    parser.add_argument("--modes", default="eval,train")
    parser.add_argument("--threads", default=f"2,{os.cpu_count()}",
                        help="thread counts, comma-separated (default: 2 and all cores)")
    parser.add_argument("--cpu-time", action="store_true",
                        help="time this thread's CPU time (with --threads 1 only)")
    a = parser.parse_args()
    threads = sorted({int(n) for n in a.threads.split(",")})
    unknown = set(a.models) - {case.name for case in MODELS}
    if unknown:
        parser.error(f"no such model: {', '.join(sorted(unknown))} (see examples/model_zoo.py)")
    if a.cpu_time and threads != [1]:
        parser.error("--cpu-time counts one thread's time: use it with --threads 1")
    clock = time.thread_time if a.cpu_time else time.perf_counter
    print(f"CPU, {os.cpu_count()} cores, torch {torch.__version__}; ms are medians of one call"
          f"{' of CPU time' if a.cpu_time else ''}; mc/eag, mc/tc below 1: minicompile "
          "faster; kern, lib, py, rest: minicompile's step in kernels, library calls, the "
          "generated code's Python, outside its graphs")
    head = (f"{'eager':>8s} {'mc':>8s} {'tc':>8s} {'mc/eag':>6s} {'mc/tc':>6s} "
            f"{'kern':>5s} {'lib':>5s} {'py':>5s} {'rest':>5s}")
    print(f"{'threads':28s} " + " | ".join(f"{n:<{len(head)}d}" for n in threads))
    print(f"{'model':22s} {'mode':5s} " + " | ".join(head for _ in threads))
    for case in MODELS:
        if a.models and case.name not in a.models:
            continue
        for mode in a.modes.split(","):
            with torch.set_grad_enabled(mode == "train"):
                steps, split = versions(case, mode == "train", not a.no_inductor)
            print(row(case, mode, steps, split, threads, clock), flush=True)


if __name__ == "__main__":
    main()
