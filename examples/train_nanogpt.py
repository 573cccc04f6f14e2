"""Train a small GPT (nanoGPT-style): eager, and minicompile's forward + backward + AdamW.

    python examples/train_nanogpt.py          # 20 steps: minicompile's losses match eager's
    python examples/train_nanogpt.py --bench  # step time (one step, do_bench's median; and a
                                              # loop of 30 steps back to back), kernel launches,
                                              # peak and saved memory (eager, minicompile,
                                              # torch.compile on a GPU)
    python examples/train_nanogpt.py --profile  # where a step's time goes: host time per step
                                                # beside wall time, and the costliest kernels

The user's code is the usual loop; minicompile compiles the forward and the loss as one
graph (whose backward it derives and compiles: ``loss.backward()`` runs those kernels) and
the optimizer step.  On a GPU the model is the 6-layer, 512-wide GPT; on a CPU a small one.
"""

from __future__ import annotations

import argparse
import copy

import torch
import torch.nn.functional as F

import minicompile
from gpt import GPT, GPTConfig
from timing import median_seconds


def forward_loss(model: torch.nn.Module, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    logits = model(idx)
    return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


class Trainer:
    """One way of running the training step: ``compile`` wraps the loss and the step."""

    def __init__(self, name: str, model: torch.nn.Module, compile_fn: object = None) -> None:
        self.name = name
        self.model = model
        self.opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
        self.loss_fn = compile_fn(forward_loss) if compile_fn else forward_loss
        self.step_fn = compile_fn(self.opt.step) if compile_fn else self.opt.step

    def step(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        loss = self.loss_fn(self.model, idx, targets)
        loss.backward()
        self.step_fn()
        self.opt.zero_grad(set_to_none=True)
        return loss.detach()


def batches(config: GPTConfig, batch: int, device: str, n: int, seed: int = 1) -> list:
    g = torch.Generator(device="cpu").manual_seed(seed)
    out = []
    for _ in range(n):
        data = torch.randint(0, config.vocab_size, (batch, config.block_size + 1), generator=g)
        out.append((data[:, :-1].contiguous().to(device), data[:, 1:].contiguous().to(device)))
    return out


def saved_bytes(trainer: Trainer, idx: torch.Tensor, targets: torch.Tensor) -> int:
    """Bytes the forward keeps for the backward (distinct storages, parameters excluded)."""
    params = {p.untyped_storage().data_ptr() for p in trainer.model.parameters()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        ptr = t.untyped_storage().data_ptr()
        if ptr not in params:
            seen[ptr] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = trainer.loss_fn(trainer.model, idx, targets)
    loss.backward()
    trainer.opt.zero_grad(set_to_none=True)
    return sum(seen.values())


def loop_seconds(step: object, cuda: bool, n: int = 30) -> float:
    """Time per step of ``n`` steps run back to back, as a training loop runs them (the
    host queues a step while the GPU runs the one before)."""
    import time

    sync = torch.cuda.synchronize if cuda else (lambda: None)
    sync()
    start = time.perf_counter()
    for _ in range(n):
        step()  # type: ignore[operator]
    sync()
    return (time.perf_counter() - start) / n


def launches(trainer: Trainer, idx: torch.Tensor, targets: torch.Tensor) -> int:
    """CUDA kernels launched by one training step."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        trainer.step(idx, targets)
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)


def profile_step(trainer: Trainer, idx: torch.Tensor, targets: torch.Tensor, cuda: bool) -> None:
    """Host time per step (work queued, not waited for) beside wall time: a step whose host
    time reaches its wall time is bound by launching, not by the GPU."""
    import time

    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        trainer.step(idx, targets)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    sync()
    start = time.perf_counter()
    for _ in range(10):
        trainer.step(idx, targets)
    host = (time.perf_counter() - start) / 10
    sync()
    wall = (time.perf_counter() - start) / 10
    print(f"{trainer.name}: host {host * 1e3:.2f} ms per step, wall {wall * 1e3:.2f} ms")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        trainer.step(idx, targets)
        sync()
    key = "cuda_time_total" if cuda else "cpu_time_total"
    print(prof.key_averages().table(sort_by=key, row_limit=15, max_name_column_width=60))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bench", action="store_true")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=None, help="sequences per step")
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    if cuda:
        config, batch = GPTConfig(n_layer=6, n_embd=512, n_head=8, block_size=256,
                                  vocab_size=8192), 16
    else:
        config, batch = GPTConfig(n_layer=2, n_embd=64, n_head=4, block_size=32,
                                  vocab_size=128), 4
    torch.manual_seed(0)
    base = GPT(config).to(device).train()
    trainers = [Trainer("eager", copy.deepcopy(base)),
                Trainer("minicompile", copy.deepcopy(base), minicompile.compile)]
    batch = args.batch or batch
    data = batches(config, batch, device, args.steps)
    for k, (idx, targets) in enumerate(data):
        losses = [t.step(idx, targets) for t in trainers]
        torch.testing.assert_close(losses[1], losses[0], rtol=2e-4, atol=2e-4,
                                   msg=lambda m: f"step {k}: {m}")
    s = minicompile.stats()
    print(f"GPT ({config.n_layer} layers, {config.n_embd} wide, batch {batch} x "
          f"{config.block_size}) on {device}: {args.steps} AdamW steps, losses match eager "
          f"(last {losses[0].item():.4f} eager, {losses[1].item():.4f} minicompile)")
    print(f"minicompile: graphs {s['graphs']} (forward + loss, with its backward; the AdamW "
          f"update), kernels {s['kernels']}, graph breaks {s['graph_breaks']}, eager fallbacks "
          f"{s['eager_fallbacks']}")
    if args.profile:
        for t in trainers:
            profile_step(t, *data[0], cuda)
    if not args.bench:
        return
    if cuda:
        trainers.append(Trainer("torch.compile", copy.deepcopy(base), torch.compile))
    idx, targets = data[0]
    times, loops = {}, {}
    for t in trainers:  # all timings first: a profiled step could slow the launches after it
        t.step(idx, targets)  # compile
        times[t.name] = median_seconds(lambda: t.step(idx, targets), cuda) * 1e3
        loops[t.name] = loop_seconds(lambda: t.step(idx, targets), cuda) * 1e3
    print(f"{'':14} {'step ms':>9} {'loop ms':>9} {'launches':>9} {'peak MiB':>9} "
          f"{'saved MiB':>10}")
    for t in trainers:
        saved = saved_bytes(t, idx, targets) / 2**20
        peak = count = float("nan")
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            t.step(idx, targets)
            peak = torch.cuda.max_memory_allocated() / 2**20
            count = launches(t, idx, targets)
        print(f"{t.name:14} {times[t.name]:9.3f} {loops[t.name]:9.3f} {count:9} {peak:9.1f} "
              f"{saved:10.1f}")


if __name__ == "__main__":
    main()
