"""DistributedDataParallel with minicompile: 2 processes on the gloo backend, CPU tensors.

Each rank trains the same seeded model on its own data (ranks differ, so a missed
all-reduce shows up as parameters that drift apart) in every arrangement:

- eager DDP (the reference);
- ``DDP(minicompile.compile(model))``, also on a ``device_mesh`` mesh;
- ``minicompile.compile(DDP(model))`` (DDP's forward eager, the wrapped module compiled);
- ``torch.compile(DDP(model), backend="minicompile")`` (Dynamo's DDPOptimizer);
- a nanoGPT (examples/gpt.py) with AdamW, ``DDP(minicompile.compile(model))``;
- ``find_unused_parameters=True`` with a parameter that never gets a gradient, and
  ``static_graph=True``.

The parent compares each rank's losses and final parameters with eager DDP's, checks that
the ranks agree, that DDP's communication hook all-reduced every step, and that the model's
output came from minicompile's compiled backward (its grad_fn, whose hook fired).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

import minicompile

from gpt import GPT, GPTConfig

STEPS = 3


class MLP(nn.Module):
    """Big enough (4 MiB in fc2) for several 1 MiB gradient buckets."""

    def __init__(self, unused: bool = False) -> None:
        super().__init__()
        self.unused = nn.Linear(2, 2) if unused else None  # no gradient, ever
        self.fc1 = nn.Linear(8, 1024)
        self.fc2 = nn.Linear(1024, 1024)
        self.fc3 = nn.Linear(1024, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc3(F.gelu(self.fc2(torch.tanh(self.fc1(x)))))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wrap(kind: str, model: nn.Module, backend: str) -> tuple[nn.Module, list]:
    """The model in arrangement ``kind``, and the list its DDP comm hook appends to."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP

    # 1 MiB buckets (DDP's first bucket's size): several all-reduces per step, and
    # Dynamo's DDPOptimizer splits its graph at their boundaries (a minicompile graph each).
    buckets = {"bucket_cap_mb": 1}
    if kind in ("compiled_inside", "gpt"):
        ddp = DDP(minicompile.compile(model, backend=backend), **buckets)
    elif kind in ("static", "static_eager"):
        inner = model if kind == "static_eager" else minicompile.compile(model, backend=backend)
        ddp = DDP(inner, static_graph=True, **buckets)
    elif kind in ("unused", "unused_eager"):
        inner = model if kind == "unused_eager" else minicompile.compile(model, backend=backend)
        ddp = DDP(inner, find_unused_parameters=True, **buckets)
    elif kind == "mesh":
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh("cpu", (2,))
        ddp = DDP(minicompile.compile(model, backend=backend), device_mesh=mesh, **buckets)
    else:
        ddp = DDP(model, **buckets)
    calls: list = []

    # DDP checks a hook's annotations as objects: set them after the definition, since
    # `from __future__ import annotations` would make them strings.
    def hook(state, bucket):  # noqa: ANN001, ANN202
        calls.append(bucket.index())
        return default_hooks.allreduce_hook(state, bucket)

    hook.__annotations__ = {"bucket": dist.GradBucket,
                            "return": torch.futures.Future[torch.Tensor]}
    ddp.register_comm_hook(None, hook)
    if kind == "compiled_outside":
        return minicompile.compile(ddp, backend=backend), calls
    if kind == "dynamo":
        return torch.compile(ddp, backend="minicompile", options={"backend": backend}), calls
    return ddp, calls


def compiled_node(grad_fn: object) -> object:
    """The autograd node of minicompile's compiled graph behind a model's output (DDP may
    put its own _DDPSink in front); else the output's own node."""
    todo = [grad_fn]
    while todo:
        node = todo.pop(0)
        if type(node).__name__ == "CompiledGraphFunctionBackward":
            return node
        todo += [n for n, _ in getattr(node, "next_functions", ()) if n is not None]
    return grad_fn


def train(kind: str, rank: int, backend: str) -> dict:
    torch.manual_seed(0)
    gpt = kind in ("gpt", "gpt_eager")
    # bias=False: a key bias has a zero gradient in exact arithmetic (softmax ignores it),
    # and AdamW would turn the rounding noise of any two summation orders into full steps.
    config = GPTConfig(block_size=8, vocab_size=64, n_layer=1, n_head=2, n_embd=32, bias=False)
    model = GPT(config) if gpt else MLP(unused=kind.startswith("unused"))
    params = list(model.parameters())
    wrapped, calls = wrap(kind, model, backend)
    opt = (torch.optim.AdamW(params, lr=1e-2) if gpt else torch.optim.SGD(params, lr=0.1))
    g = torch.Generator().manual_seed(100 + rank)  # each rank its own data
    losses, backward_ran, grad_fns, first_grads = [], [], set(), []
    for _ in range(STEPS):
        if gpt:
            idx = torch.randint(0, config.vocab_size, (2, config.block_size + 1), generator=g)
            out = wrapped(idx[:, :-1])
            loss = F.cross_entropy(out.view(-1, out.size(-1)), idx[:, 1:].reshape(-1))
        else:
            out = wrapped(torch.randn(6, 8, generator=g))
            loss = out.square().mean()
        node = compiled_node(out.grad_fn)
        grad_fns.add(type(node).__name__)
        node.register_hook(lambda *_: backward_ran.append(True))
        loss.backward()
        if not first_grads:  # after DDP's all-reduce
            first_grads = [None if p.grad is None else p.grad.clone() for p in params]
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return {"losses": losses, "params": [p.detach().clone() for p in params],
            "grads": first_grads, "lr": opt.param_groups[0]["lr"],
            "hook_calls": len(calls), "backward_ran": len(backward_ran),
            "grad_fns": grad_fns, "stats": minicompile.stats()}


def worker(rank: int, port: int, run: Callable, backend: str, kinds: tuple[str, ...],
           out: str) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        results = {}
        for kind in kinds:
            minicompile.reset()
            results[kind] = run(kind, rank, backend)
        torch.save(results, Path(out) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def run_ranks(backend: str, kinds: tuple[str, ...], tmp_path: Path,
              run: Callable = train) -> list[dict]:
    """``run(kind, rank, backend)`` for each kind on 2 ranks (gloo): each rank's results."""
    mp.spawn(worker, args=(free_port(), run, backend, kinds, str(tmp_path)), nprocs=2)
    return [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in (0, 1)]


def check_against(results: list[dict], kind: str, reference: str, adam: bool = False) -> None:
    for rank, res in enumerate(results):
        got, want = res[kind], res[reference]
        torch.testing.assert_close(got["losses"], want["losses"], rtol=1e-5, atol=1e-6)
        for g, h in zip(got["grads"], want["grads"]):  # the averaged gradients of step 1
            assert (g is None) == (h is None)
            if g is not None:
                torch.testing.assert_close(g, h, rtol=1e-4, atol=1e-6)
        # Adam divides each gradient by its own magnitude: for entries whose gradient is
        # near zero it turns rounding differences into visible steps, so its parameters
        # are compared to 2% of one step (lr), SGD's to float32 rounding.  (The C++
        # reductions' float partials sum in another order than eager's: one of nanoGPT's
        # 4096 c_proj weights moved by 1.1% of a step after 3 steps.)
        atol = got["lr"] * 2e-2 if adam else 1e-6
        for p, q in zip(got["params"], want["params"]):
            torch.testing.assert_close(p, q, rtol=1e-5, atol=atol)
        # DDP's reducer all-reduced every step, through its comm hook
        assert got["hook_calls"] >= STEPS and got["hook_calls"] == want["hook_calls"], rank
        # minicompile's forward and backward ran (the backward's hook fired each step)
        assert got["grad_fns"] == {"CompiledGraphFunctionBackward"}, (kind, got["grad_fns"])
        assert got["backward_ran"] == STEPS
        assert got["stats"]["kernels"] > 0 and got["stats"]["eager_fallbacks"] == 0
    # ranks saw different data, yet hold the same parameters (averaged gradients)
    r0, r1 = results[0][kind], results[1][kind]
    assert r0["losses"] != r1["losses"]
    for p, q in zip(r0["params"], r1["params"]):
        torch.testing.assert_close(p, q, rtol=0, atol=0)


# CPU tensors on gloo: the Triton backend runs CPU graphs under Triton's interpreter, which a
# GPU machine's test run leaves off (tests/conftest.py), so there they run eagerly by design.
GLOO_BACKENDS = ["cpp", pytest.param("triton", marks=pytest.mark.skipif(
    torch.cuda.is_available(), reason="CPU graphs on a GPU machine run eagerly by design"))]


@pytest.mark.parametrize("backend", GLOO_BACKENDS)
def test_ddp_matches_eager_ddp(backend: str, tmp_path: Path) -> None:
    kinds = ("eager", "compiled_inside", "mesh", "compiled_outside", "dynamo")
    results = run_ranks(backend, kinds, tmp_path)
    for kind in kinds[1:]:
        check_against(results, kind, "eager")
    assert results[0]["eager"]["hook_calls"] > STEPS  # several buckets a step
    # Dynamo's DDPOptimizer split its graph at bucket boundaries: one graph each here
    assert results[0]["dynamo"]["stats"]["graphs"] > 1


def test_ddp_nanogpt_adamw_unused_parameters_static_graph(tmp_path: Path) -> None:
    kinds = ("gpt_eager", "gpt", "unused_eager", "unused", "static_eager", "static")
    results = run_ranks("cpp", kinds, tmp_path)
    check_against(results, "gpt", "gpt_eager", adam=True)
    check_against(results, "unused", "unused_eager")
    check_against(results, "static", "static_eager")
