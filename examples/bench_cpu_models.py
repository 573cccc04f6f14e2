"""The model zoo (examples/model_zoo.py) on the CPU: per model, eval (no_grad) and a train
step (forward, loss, backward), the median call of eager, minicompile and torch.compile, on
2 threads and on all cores (``torch.set_num_threads``), side by side with the ratios.

    python examples/bench_cpu_models.py                      # every model, eval and train
    python examples/bench_cpu_models.py --no-inductor hf_bert timm_resnext26ts
    python examples/bench_cpu_models.py --modes eval --threads 1,2,16
    python examples/bench_cpu_models.py --threads 1 --cpu-time   # a shared, busy machine

torch.compile's first compile takes about a minute a model and mode on a small CPU:
``--no-inductor`` leaves it out.  Each model and mode is compiled once; the thread counts
then share the compiled code (minicompile's kernels run on ``torch.get_num_threads()``
threads at call time, as eager does).  Eval results are checked against eager first.
Ratios below 1 mean faster than eager (``mc/eager``) or than torch.compile (``mc/tc``).
``--cpu-time`` times the calling thread's CPU time (``time.thread_time``) instead of the wall
clock: on one thread, where all the work runs on it, a machine shared with other jobs then
gives steady numbers (their time slices are not counted).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

os.environ.setdefault("MINICOMPILE_CACHE_DIR", tempfile.mkdtemp(prefix="bench-cpu-models-"))

import torch  # noqa: E402

import minicompile  # noqa: E402
from bench_models import check  # noqa: E402
from model_zoo import MODELS, tensors_of  # noqa: E402
from timing import median_seconds  # noqa: E402


def loss_of(out) -> torch.Tensor:  # noqa: ANN001
    """A scalar from every floating-point tensor the model returned (logits, hidden
    states), so that backward reaches every parameter that produced them."""
    return sum(t.float().mean() for t in tensors_of(out)
               if isinstance(t, torch.Tensor) and t.is_floating_point())


def step_of(model: torch.nn.Module, inputs: tuple, mode: str):  # noqa: ANN201
    """One call of ``model`` on ``inputs`` (args, kwargs) in ``mode``: eval under no_grad,
    or a train step."""
    args, kwargs = inputs
    if mode == "eval":
        def step():  # noqa: ANN202
            with torch.no_grad():
                return model(*args, **kwargs)
        return step

    def train_step():  # noqa: ANN202
        model.zero_grad(set_to_none=True)
        loss = loss_of(model(*args, **kwargs))
        loss.backward()
        return loss
    return train_step


def time_split(step) -> str:  # noqa: ANN001
    """Where a minicompile call's time goes: generated kernels, library calls and Python,
    as shares of the call.  Filled from minicompile's profile report
    (``MINICOMPILE_LOGS=profile``) where this minicompile has one; blank until then."""
    split = getattr(minicompile, "profile_split", None)
    if split is None:
        return f"{'-':>5s} {'-':>5s} {'-':>5s}"
    shares = split(step)  # {"kernels": share, "library": share, "python": share}
    return " ".join(f"{shares[k]:5.0%}" for k in ("kernels", "library", "python"))


def compiled_versions(case, mode: str, inductor: bool) -> dict:  # noqa: ANN001
    """Eager, minicompile and (``inductor``) torch.compile steps of one model and mode,
    each run once (compiled; eval results checked against eager)."""
    torch.manual_seed(0)
    model = case.build()
    model.train(mode == "train")
    inputs = case.inputs(torch.device("cpu"))
    eager = step_of(model, inputs, mode)
    minicompile.reset()
    steps = {"eager": eager, "mc": step_of(minicompile.compile(model), inputs, mode)}
    if inductor:
        torch._dynamo.reset()
        steps["tc"] = step_of(torch.compile(model), inputs, mode)
    for name, step in list(steps.items()):
        try:
            out = step()
        except Exception as e:  # no toolchain for Inductor here, say
            print(f"  {case.name} {mode}: {name} failed ({type(e).__name__}: {e})"[:160])
            del steps[name]
            continue
        if mode == "eval" and name != "eager":
            check(out, eager(), torch.float32)
    return steps


def row(case, mode: str, steps: dict, threads: list[int], clock) -> str:  # noqa: ANN001
    cells = []
    for n in threads:
        torch.set_num_threads(n)
        ms = {k: median_seconds(s, False, clock=clock) * 1e3 for k, s in steps.items()}
        tc, mc = ms.get("tc"), ms.get("mc")
        num = lambda v: f"{v:8.2f}" if v else f"{'-':>8s}"  # noqa: E731
        ratio = lambda a, b: f"{a / b:6.2f}" if a and b else f"{'-':>6s}"  # noqa: E731
        split = time_split(steps["mc"]) if mc else ""
        cells.append(f"{num(ms['eager'])} {num(mc)} {num(tc)} {ratio(mc, ms['eager'])} "
                     f"{ratio(mc, tc)} {split}")
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
    if a.cpu_time and threads != [1]:
        parser.error("--cpu-time counts one thread's time: use it with --threads 1")
    clock = time.thread_time if a.cpu_time else time.perf_counter
    print(f"CPU, {os.cpu_count()} cores, torch {torch.__version__}; ms are medians of one call"
          f"{' of CPU time' if a.cpu_time else ''}; mc/eager and mc/tc below 1: minicompile faster; split: minicompile's call in "
          "kernels, library calls, Python")
    head = (f"{'eager':>8s} {'mc':>8s} {'tc':>8s} {'mc/eag':>6s} {'mc/tc':>6s} "
            f"{'kern':>5s} {'lib':>5s} {'py':>5s}")
    print(f"{'threads':28s} " + " | ".join(f"{n:<{len(head)}d}" for n in threads))
    print(f"{'model':22s} {'mode':5s} " + " | ".join(head for _ in threads))
    for case in MODELS:
        if a.models and case.name not in a.models:
            continue
        for mode in a.modes.split(","):
            steps = compiled_versions(case, mode, not a.no_inductor)
            print(row(case, mode, steps, threads, clock), flush=True)


if __name__ == "__main__":
    main()
