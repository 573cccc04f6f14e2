"""One step of zoo models (examples/model_zoo.py) under torch.profiler, for eager, minicompile
and torch.compile side by side: the ops with the most host time of their own, and the kernel
launches a step.  For finding where a host-bound step's time goes (the zoo's GPU rows are).

    python examples/profile_step.py hf_bert                 # train steps on CUDA
    python examples/profile_step.py --eval --steps 10 timm_vit_tiny
    python examples/profile_step.py --device cpu torchvision_squeezenet1_1
    python examples/profile_step.py --device cpu --compare hf_mixtral   # mc vs tc per op

``--compare`` prints one table instead: per library op (``aten::``, custom ops), its own
host time and calls a step under minicompile and under torch.compile, the largest
differences first, and the totals of the library ops and of the rest (the compiled code's
own time: its kernels and Python; the guards; autograd's engine).  A row where the two
spend their time in the same library calls shows it here.
"""

from __future__ import annotations

import argparse
import contextlib

import torch
from bench_models import step, without_dropout
from model_zoo import MODELS
from torch.profiler import ProfilerActivity, profile

import minicompile

LAUNCHES = ("cudaLaunchKernel", "cuLaunchKernel", "cuLaunchKernelEx", "cudaLaunchKernelExC")


def is_library(key: str) -> bool:
    """A library op's profiler event (``aten::mm``, ``transformers::grouped_mm_fallback``),
    not a frame of compiled code, autograd's engine or a guard check."""
    return "::" in key and not key.startswith(("autograd::", "torch::autograd::"))


def compare(tables: dict[str, dict[str, tuple[float, float]]], rows: int) -> None:
    """minicompile's and torch.compile's library ops side by side (us and calls a step)."""
    mc, tc = tables["minicompile"], tables["torch.compile"]
    ops = sorted({k for k in (*mc, *tc) if is_library(k)},
                 key=lambda k: -abs(mc.get(k, (0, 0))[0] - tc.get(k, (0, 0))[0]))
    print(f"{'library op':56s} {'mc us':>9s} {'calls':>6s} {'tc us':>9s} {'calls':>6s}")
    for k in ops[:rows]:
        (a, n), (b, m) = mc.get(k, (0, 0)), tc.get(k, (0, 0))
        print(f"{k[:56]:56s} {a:9.1f} {n:6.0f} {b:9.1f} {m:6.0f}")
    for label, table in (("minicompile", mc), ("torch.compile", tc)):
        lib = sum(us for k, (us, _) in table.items() if is_library(k))
        rest = sum(us for k, (us, _) in table.items() if not is_library(k))
        print(f"{label}: library ops {lib / 1e3:.3f} ms, the rest {rest / 1e3:.3f} ms a step "
              "(own host time under the profiler)")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("models", nargs="+", choices=[m.name for m in MODELS])
    parser.add_argument("--eval", action="store_true", help="forward under no_grad")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--rows", type=int, default=18)
    parser.add_argument("--compare", action="store_true",
                        help="minicompile's library ops beside torch.compile's, one table")
    a = parser.parse_args()
    device = torch.device(a.device)
    activities = [ProfilerActivity.CPU] + [ProfilerActivity.CUDA] * (device.type == "cuda")
    for name in a.models:
        case = {m.name: m for m in MODELS}[name]
        model = without_dropout(case.build().to(device).train(not a.eval))
        args, kwargs = case.inputs(device)
        compilers = {"eager": model, "minicompile": minicompile.compile(model),
                     "torch.compile": torch.compile(model)}
        tables: dict[str, dict[str, tuple[float, float]]] = {}
        for label, fn in compilers.items():
            run = step(fn, args, kwargs, not a.eval)
            with torch.no_grad() if a.eval else contextlib.nullcontext():
                for _ in range(3):  # compiles, warms up
                    run()
            with profile(activities=activities) as prof, (
                    torch.no_grad() if a.eval else contextlib.nullcontext()):
                for _ in range(a.steps):
                    run()
                if device.type == "cuda":
                    torch.cuda.synchronize()
            ops = prof.key_averages()
            tables[label] = {e.key: (e.self_cpu_time_total / a.steps, e.count / a.steps)
                             for e in ops}
            if a.compare:
                continue
            launches = sum(e.count for e in ops if e.key in LAUNCHES) / a.steps
            print(f"\n=== {name} {'eval' if a.eval else 'train'}, {label}: "
                  f"{launches:.0f} kernel launches a step")
            print(ops.table(sort_by="self_cpu_time_total", row_limit=a.rows,
                            max_name_column_width=60))
        if a.compare:
            print(f"\n=== {name} {'eval' if a.eval else 'train'}: minicompile and torch.compile")
            compare(tables, a.rows)


if __name__ == "__main__":
    main()
