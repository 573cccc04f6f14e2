"""Data-parallel training of the nanoGPT example: eager DDP, minicompile DDP, torch.compile DDP.

    torchrun --standalone --nproc_per_node=2 examples/train_ddp.py       # 2 GPUs, NCCL
    torchrun --standalone --nproc_per_node=2 examples/train_ddp.py --steps 4   # CPU: gloo

Every rank trains the same GPT (examples/gpt.py, seeded) on its own batches with AdamW, in
three arrangements:

- eager: ``DDP(model)``;
- minicompile: ``DDP(minicompile.compile(model))``: forward and backward compiled, DDP's
  reducer all-reducing the gradients the compiled backward hands to autograd;
- torch.compile: ``torch.compile(DDP(model))`` (Inductor, Dynamo's DDPOptimizer).

Before that, rank 0 trains the same model alone (no DDP, the same per-GPU batch) while the
other ranks wait, for the one-GPU step time.  One table: step time on one GPU and with DDP
(the slowest rank's, over steps run back to back after warm-up), the weak scaling (tokens
per second with DDP over one GPU's; ideal: the number of GPUs), the first call's time
(compiling; the DDP run's may find kernels of the one-GPU run in the on-disk caches), and
the largest loss difference from eager DDP over the run.  The
optimizer step is eager AdamW in every row.
"""

from __future__ import annotations

import argparse
import datetime
import os
import time
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import minicompile
from gpt import GPT, GPTConfig


def make_model(config: GPTConfig, device: torch.device) -> torch.nn.Module:
    torch.manual_seed(0)
    return GPT(config).to(device).train()


def wrap(mode: str, model: torch.nn.Module, ddp: bool, device: torch.device) -> torch.nn.Module:
    ids = [device.index] if device.type == "cuda" else None
    if mode == "eager":
        return DDP(model, device_ids=ids) if ddp else model
    if mode == "minicompile":
        compiled = minicompile.compile(model)
        return DDP(compiled, device_ids=ids) if ddp else compiled
    return torch.compile(DDP(model, device_ids=ids) if ddp else model)


def device_and_config() -> tuple[torch.device, GPTConfig, int]:
    """This rank's device (its GPU, made current, else the CPU), the GPT and the sequences
    per device per step: 6 layers x 512 on a GPU, a small one on the CPU."""
    if torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
        return device, GPTConfig(n_layer=6, n_embd=512, n_head=8, block_size=256,
                                 vocab_size=8192), 16
    return torch.device("cpu"), GPTConfig(n_layer=2, n_embd=64, n_head=4, block_size=32,
                                          vocab_size=128), 4


def batches(config: GPTConfig, batch: int, device: torch.device, n: int, seed: int) -> list:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        data = torch.randint(0, config.vocab_size, (batch, config.block_size + 1), generator=g)
        out.append((data[:, :-1].contiguous().to(device), data[:, 1:].contiguous().to(device)))
    return out


def train(model: torch.nn.Module, data: list, sync: Callable[[], None],
          warmup: int) -> tuple[float, float, list[float]]:
    """(first call seconds, seconds per step after ``warmup`` steps, every step's loss)."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
    losses: list[torch.Tensor] = []

    def step(idx: torch.Tensor, targets: torch.Tensor) -> None:
        logits = model(idx)
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.detach())

    start = time.perf_counter()
    step(*data[0])
    sync()
    first = time.perf_counter() - start
    for idx, targets in data[1:warmup]:
        step(idx, targets)
    sync()
    start = time.perf_counter()
    for idx, targets in data[warmup:]:
        step(idx, targets)
    sync()
    per_step = (time.perf_counter() - start) / max(1, len(data) - warmup)
    return first, per_step, [float(x) for x in losses]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30, help="timed steps per arrangement")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--batch", type=int, default=None, help="sequences per GPU per step")
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    device, config, batch = device_and_config()
    batch = args.batch or batch
    # The other ranks wait while rank 0 compiles alone (Inductor: minutes on a cold cache).
    dist.init_process_group("nccl" if cuda else "gloo", timeout=datetime.timedelta(minutes=30))
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    n = args.warmup + args.steps
    modes = ("eager", "minicompile", "torch.compile")
    if not cuda:  # Inductor's C++ build of the whole GPT is minutes on a small CPU machine
        modes = modes[:2]
    single: dict[str, tuple[float, float]] = {}
    if rank == 0:  # one GPU: the same model and per-GPU batch, no DDP
        data = batches(config, batch, device, n, seed=1000)
        for mode in modes:
            torch._dynamo.reset()
            first, per_step, _ = train(wrap(mode, make_model(config, device), False, device),
                                       data, sync, args.warmup)
            single[mode] = (first, per_step)
    dist.barrier()
    data = batches(config, batch, device, n, seed=rank)
    rows = []
    reference: list[float] = []
    stats: dict[str, int] = {}
    for mode in modes:
        torch._dynamo.reset()
        minicompile.reset()
        first, per_step, losses = train(wrap(mode, make_model(config, device), True, device),
                                        data, sync, args.warmup)
        slowest = torch.tensor([per_step, first], dtype=torch.float64, device=device)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        if mode == "minicompile":
            stats = minicompile.stats()
        reference = reference or losses
        diff = max(abs(a - b) for a, b in zip(losses, reference))
        rows.append((mode, float(slowest[0]), float(slowest[1]), diff))
    if rank == 0:
        tokens = batch * config.block_size
        print(f"GPT {config.n_layer} layers x {config.n_embd}, {batch} x {config.block_size} "
              f"tokens per {device.type.upper()} per step, AdamW; {world} ranks "
              f"({dist.get_backend()}), {args.steps} steps timed after {args.warmup}")
        print(f"| | 1 {device.type.upper()} ms/step | DDP x{world} ms/step | DDP tokens/s | "
              f"scaling 1->{world} | first call s (1 / DDP) | max |loss - eager DDP| |")
        print("|---|---|---|---|---|---|---|")
        for mode, per_step, first, diff in rows:
            one_first, one = single[mode]
            scaling = world * one / per_step
            print(f"| {mode} | {one * 1e3:.2f} | {per_step * 1e3:.2f} | "
                  f"{world * tokens / per_step:,.0f} | {scaling:.2f} | "
                  f"{one_first:.1f} / {first:.1f} | {diff:.2e} |")
        print(f"minicompile (DDP run): graphs {stats['graphs']}, kernels {stats['kernels']}, "
              f"graph breaks {stats['graph_breaks']}, eager fallbacks {stats['eager_fallbacks']}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
