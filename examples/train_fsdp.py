"""Sharded training of the nanoGPT example with FSDP2: eager, minicompile, torch.compile.

    torchrun --standalone --nproc_per_node=2 examples/train_fsdp.py       # 2 GPUs, NCCL
    torchrun --standalone --nproc_per_node=2 examples/train_fsdp.py --steps 4   # CPU: gloo

Every rank trains the same GPT (examples/gpt.py, seeded) on its own batches with AdamW, its
parameters sharded with ``torch.distributed.fsdp.fully_shard`` per transformer block, then
the root, as FSDP's docs recommend (:func:`shard`), in each arrangement:

- eager FSDP;
- minicompile: ``fully_shard(minicompile.compile(block))`` per block (torchtitan's order:
  FSDP's hooks all-gather and reshard around each compiled block, forward and backward);
- minicompile (model): ``minicompile.compile(model)`` of the sharded model: the root's hooks
  as in eager, each block's call a graph break whose forward is compiled on its own;
- torch.compile: ``fully_shard(torch.compile(block))`` per block (Inductor).

One table: step time (the slowest rank's, over steps run back to back after warm-up), peak
memory allocated on each GPU (above what was allocated before), the first call's time
(compiling) and the largest loss difference from eager FSDP.  The optimizer step is eager AdamW in every row.
"""

from __future__ import annotations

import argparse
import datetime
import gc

import torch
import torch.distributed as dist
from gpt import GPT, GPTConfig
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from train_ddp import batches, device_and_config, make_model, train

import minicompile


def shard(model: GPT, mode: str, backend: str = "auto") -> torch.nn.Module:
    """``model`` sharded per block, then the root, in arrangement ``mode``; what to call.
    Besides the table's: "compiled_outside" compiles blocks already sharded (their hooks run
    as in eager around the compiled forward), "patched" sets a compiled ``block.forward``."""
    # The mesh on the model's device: fully_shard's default takes the GPU where there is one
    # (a CPU model on gloo, as in the tests, would move there).
    device = next(model.parameters()).device.type
    mesh = init_device_mesh(device, (dist.get_world_size(),))
    blocks = model.transformer.h
    for i, block in enumerate(blocks):
        if mode == "minicompile":
            blocks[i] = block = minicompile.compile(block, backend=backend)
        elif mode == "patched":
            block.forward = minicompile.compile(block.forward, backend=backend)
        elif mode == "torch.compile":
            blocks[i] = block = torch.compile(block)
        fully_shard(block, mesh=mesh)
        if mode == "compiled_outside":
            blocks[i] = minicompile.compile(block, backend=backend)
    fully_shard(model, mesh=mesh)
    return minicompile.compile(model, backend=backend) if mode == "minicompile (model)" else model


def run(mode: str, config: GPTConfig, data: list, device: torch.device,
        warmup: int) -> tuple[float, float, list[float], list[float]]:
    """(first call s, s per step, losses, each rank's peak MiB) of one arrangement."""
    torch._dynamo.reset()
    minicompile.reset()
    cuda = device.type == "cuda"
    held = 0  # (earlier arrangements' models may live on in their compilers' caches)
    if cuda:
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        held = torch.cuda.memory_allocated(device)
    model = make_model(config, device)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    first, per_step, losses = train(shard(model, mode), data, sync, warmup)
    peak = (torch.cuda.max_memory_allocated(device) - held) / 2**20 if cuda else 0.0
    peaks = [torch.zeros((), dtype=torch.float64, device=device)
             for _ in range(dist.get_world_size())]
    dist.all_gather(peaks, torch.tensor(peak, dtype=torch.float64, device=device))
    slowest = torch.tensor([per_step, first], dtype=torch.float64, device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return float(slowest[1]), float(slowest[0]), losses, [float(p) for p in peaks]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30, help="timed steps per arrangement")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--batch", type=int, default=None, help="sequences per GPU per step")
    parser.add_argument("--layers", type=int, default=None)
    parser.add_argument("--embd", type=int, default=None)
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    device, config, batch = device_and_config()
    config.n_layer = args.layers or config.n_layer
    config.n_embd = args.embd or config.n_embd
    batch = args.batch or batch
    dist.init_process_group("nccl" if cuda else "gloo", timeout=datetime.timedelta(minutes=30))
    rank, world = dist.get_rank(), dist.get_world_size()
    data = batches(config, batch, device, args.warmup + args.steps, seed=rank)
    modes = ["eager", "minicompile", "minicompile (model)", "torch.compile"]
    if not cuda:  # Inductor's C++ build of the blocks is minutes on a small CPU machine
        modes = modes[:3]
    rows, reference = [], None
    for mode in modes:
        first, per_step, losses, peaks = run(mode, config, data, device, args.warmup)
        reference = reference or losses
        diff = max(abs(a - b) for a, b in zip(losses, reference))
        stats = minicompile.stats()
        rows.append((mode, per_step, peaks, first, diff, stats))
    if rank == 0:
        params = sum(p.numel() for p in GPT(config).parameters())
        print(f"GPT {config.n_layer} layers x {config.n_embd} ({params / 1e6:.1f}M parameters), "
              f"{batch} x {config.block_size} tokens per {device.type.upper()} per step, AdamW; "
              f"FSDP2 per block on {world} ranks ({dist.get_backend()}), {args.steps} steps "
              f"timed after {args.warmup}")
        print("| | ms/step | peak MiB per GPU | first call s | max |loss - eager FSDP| |")
        print("|---|---|---|---|---|")
        for mode, per_step, peaks, first, diff, _ in rows:
            memory = " / ".join(f"{p:,.0f}" for p in peaks) if cuda else "(CPU)"
            print(f"| {mode} | {per_step * 1e3:.2f} | {memory} | {first:.1f} | {diff:.2e} |")
        for mode, *_, stats in rows:
            if mode.startswith("minicompile"):
                print(f"{mode}: graphs {stats['graphs']}, kernels {stats['kernels']}, graph "
                      f"breaks {stats['graph_breaks']}, recompiles {stats['recompiles']}, "
                      f"eager fallbacks {stats['eager_fallbacks']}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
