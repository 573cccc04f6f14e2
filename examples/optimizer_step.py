"""A compiled optimizer step: ``minicompile.compile(opt.step)`` for SGD (momentum) and AdamW
with an LR scheduler, checked against eager ``opt.step()`` on a copy of the model, with the
kernel count and the time of one step beside eager's.

    python examples/optimizer_step.py            # CUDA when available, else CPU (C++)
"""

from __future__ import annotations

import copy
import time

import torch
import torch.nn.functional as F

import minicompile

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def make_model(width: int, depth: int) -> torch.nn.Module:
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(width, 10)).to(DEVICE)


def best_time(fn, repeat: int = 7, number: int = 10) -> float:
    """The best mean time of ``number`` calls, in microseconds."""
    best = float("inf")
    for _ in range(repeat):
        if DEVICE.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(number):
            fn()
        if DEVICE.type == "cuda":
            torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - start) / number * 1e6)
    return best


def check(name: str, make_opt, width: int = 256, depth: int = 6, steps: int = 20) -> None:
    minicompile.reset()
    model = make_model(width, depth)
    ref = copy.deepcopy(model)
    opt, ref_opt = make_opt(model.parameters()), make_opt(ref.parameters())
    step = minicompile.compile(opt.step)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=5, gamma=0.5)
    ref_sched = torch.optim.lr_scheduler.StepLR(ref_opt, step_size=5, gamma=0.5)
    for k in range(steps):
        x = torch.randn(32, width, device=DEVICE)
        y = torch.randint(0, 10, (32,), device=DEVICE)
        for m in (model, ref):
            F.cross_entropy(m(x), y).backward()
        step()
        ref_opt.step()
        opt.zero_grad()
        ref_opt.zero_grad()
        sched.step()
        ref_sched.step()
    worst = max(((p - q).abs().max() / q.abs().max().clamp_min(1e-12)).item()
                for p, q in zip(model.parameters(), ref.parameters()))
    stats = minicompile.stats()
    for m in (model, ref):  # gradients to step with, for the timings
        F.cross_entropy(m(torch.randn(32, width, device=DEVICE)),
                        torch.zeros(32, dtype=torch.long, device=DEVICE)).backward()
    compiled_us, eager_us = best_time(step), best_time(ref_opt.step)
    n = sum(p.numel() for p in model.parameters())
    print(f"{name:14s} {len(list(model.parameters()))} parameters ({n / 1e6:.2f}M values): "
          f"max relative difference {worst:.1e}; {stats['kernels']} kernels, "
          f"{stats['recompiles']} recompiles; one step {compiled_us:.0f} us "
          f"(eager {eager_us:.0f} us)")
    assert worst < 1e-4, "compiled and eager steps differ"
    assert stats["recompiles"] == 0


def main() -> None:
    print(f"device: {DEVICE}")
    check("SGD momentum", lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, nesterov=True))
    check("AdamW", lambda ps: torch.optim.AdamW(ps, lr=1e-3, weight_decay=0.01))
    check("Adam amsgrad", lambda ps: torch.optim.Adam(ps, lr=1e-3, amsgrad=True))


if __name__ == "__main__":
    main()
