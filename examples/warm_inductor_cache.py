"""Warm torch.compile's (Inductor's) on-disk caches for bench_cpu_models.py: zoo models, eval
and train, each compiled in a process of its own, N at once (one step each), so that the one
timed run after it loads Inductor's code instead of compiling 38 graphs for 1-4 minutes each
(the 16-core host of the GPU machine: 33 of them in 566 s with N = 8).

    export TORCHINDUCTOR_CACHE_DIR=$PWD/inductor-cache   # the same for both commands
    python examples/warm_inductor_cache.py 8 [models]
    python examples/bench_cpu_models.py --threads 16

Each process uses torch's default thread count, as the benchmark compiles with it.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def one(job: tuple[str, str]) -> str:
    """Compile one model and mode with torch.compile (its caches filled); a line on it."""
    name, mode = job
    import torch
    from bench_models import step, without_dropout
    from model_zoo import MODELS
    case = next(c for c in MODELS if c.name == name)
    train = mode == "train"
    start = time.perf_counter()
    try:
        with torch.set_grad_enabled(train):
            torch.manual_seed(0)
            model = case.build()
            model = without_dropout(model.train()) if train else model.eval()
            args, kwargs = case.inputs(torch.device("cpu"))
            step(model, args, kwargs, train)()
            step(torch.compile(model), args, kwargs, train)()
        return f"{name} {mode}: {time.perf_counter() - start:.1f} s"
    except Exception as e:  # noqa: BLE001
        return f"{name} {mode}: failed {type(e).__name__}: {e}"[:200]


def main() -> None:
    from model_zoo import MODELS
    if len(sys.argv) < 2 or not sys.argv[1].isdigit():
        sys.exit(f"usage: {sys.argv[0]} PROCESSES [models]")
    names = sys.argv[2:] or [c.name for c in MODELS]
    jobs = [(n, m) for n in names for m in ("eval", "train")]
    with mp.get_context("spawn").Pool(int(sys.argv[1]), maxtasksperchild=1) as pool:
        for line in pool.imap_unordered(one, jobs):
            print(line, flush=True)


if __name__ == "__main__":
    main()
