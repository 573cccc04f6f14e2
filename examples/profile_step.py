"""One step of zoo models (examples/model_zoo.py) under torch.profiler, for eager, minicompile
and torch.compile side by side: the ops with the most host time of their own, and the kernel
launches a step.  For finding where a host-bound step's time goes (the zoo's GPU rows are).

    python examples/profile_step.py hf_bert                 # train steps on CUDA
    python examples/profile_step.py --eval --steps 10 timm_vit_tiny
    python examples/profile_step.py --device cpu torchvision_squeezenet1_1
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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("models", nargs="+", choices=[m.name for m in MODELS])
    parser.add_argument("--eval", action="store_true", help="forward under no_grad")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--rows", type=int, default=18)
    a = parser.parse_args()
    device = torch.device(a.device)
    activities = [ProfilerActivity.CPU] + [ProfilerActivity.CUDA] * (device.type == "cuda")
    for name in a.models:
        case = {m.name: m for m in MODELS}[name]
        model = without_dropout(case.build().to(device).train(not a.eval))
        args, kwargs = case.inputs(device)
        compilers = {"eager": model, "minicompile": minicompile.compile(model),
                     "torch.compile": torch.compile(model)}
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
            launches = sum(e.count for e in ops if e.key in LAUNCHES) / a.steps
            print(f"\n=== {name} {'eval' if a.eval else 'train'}, {label}: "
                  f"{launches:.0f} kernel launches a step")
            print(ops.table(sort_by="self_cpu_time_total", row_limit=a.rows,
                            max_name_column_width=60))


if __name__ == "__main__":
    main()
