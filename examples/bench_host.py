"""Host time per call of whole zoo models (examples/model_zoo.py), split into its parts.

    python examples/bench_host.py                          # hf_bert, resnet18, vit_tiny
    python examples/bench_host.py hf_bert hf_gpt2          # some models
    python examples/bench_host.py --profile hf_bert        # and cProfile's top entries
    python examples/bench_host.py --train                  # train steps (see below)
    python examples/bench_host.py --train nanogpt timm_vit_tiny
    python examples/bench_host.py --train --backend triton nanogpt   # launches only

For each model, compiled whole (eval, no_grad), the time per call of: binding the call's
arguments to the frame (minicompile/binder.py); the guard check as calls run it (the checks
that dicts fix skipped while the dicts keep their versions, minicompile/runtime/
dict_guards.py; tensor metadata in one C++ call, runtime/tensor_checks.py) and with every
check (as when a dict has moved; the header counts both); ``get_inputs`` (reading
parameters off the modules); the generated ``call()`` (allocations, library calls, kernel
launches; on the CPU also the kernels' work); the whole compiled call; eager.  Each is the
median over rounds of the mean of a loop of calls, the rounds interleaved so that a busy
machine slows every row alike.  On the CPU the time is this thread's CPU time (PyTorch on
one thread, ``--threads``), steady on a machine that other work shares; on CUDA it is wall
time, each loop ending with a synchronisation (``examples/bench_models.py`` says whether
the host or the GPU bounds each model).

``--train``: the train step of ``examples/bench_models.py`` (forward, a loss over the
outputs, ``torch.autograd.grad`` of the parameters), of the zoo's models and of ``nanogpt``
(examples/gpt.py, 2 layers, 64 wide, 2 x 32 tokens, the cross-entropy loss in the compiled
graph).  Its parts: the forward's guards and ``get_inputs``; the generated forward and
backward ``call()``s (their kernels' work included on the CPU); the loss's eager forward and
backward; the rest of the whole step (the autograd.Function's forward and backward
wrappers, PyTorch's autograd engine) and the whole step; and the launches of each
generated call (kernels, library calls).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import time
from collections.abc import Callable

import torch
from model_zoo import MODELS

import minicompile
from minicompile.runtime.dict_guards import per_call

DEFAULT = ("hf_bert", "torchvision_resnet18", "timm_vit_tiny")
TRAIN_DEFAULT = ("torchvision_resnet18", "timm_resnext26ts", "timm_vit_tiny",
                 "timm_efficientnet_b0", "nanogpt")


def time_rows(rows: dict[str, Callable], calls: int, rounds: int, cuda: bool) -> dict:
    """Median over ``rounds`` of the mean time per call in microseconds, rounds interleaved:
    wall time on CUDA, else the CPU time of this thread (steady on a busy machine, and
    what the host spends: the kernels run in this thread too, ``--threads 1``)."""
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    clock = time.perf_counter if cuda else time.thread_time
    samples: dict[str, list[float]] = {name: [] for name in rows}
    for f in rows.values():
        f()
    for _ in range(rounds):
        for name, f in rows.items():
            sync()
            start = clock()
            for _ in range(calls):
                f()
            sync()
            samples[name].append((clock() - start) / calls * 1e6)
    return {name: statistics.median(s) for name, s in samples.items()}


def bench(name: str, device: torch.device, calls: int, rounds: int, profile: bool) -> None:
    case = {m.name: m for m in MODELS}[name]
    torch.manual_seed(0)
    model = case.build().eval().to(device)
    args, kwargs = case.inputs(device)
    minicompile.reset()
    compiled = minicompile.compile(model)
    with torch.no_grad():
        compiled(*args, **kwargs)
        compiled(*args, **kwargs)
        function = compiled.__dict__["_compiled"]
        (entry,) = function.entries
        frame = function.bind(model, *args, **kwargs)
        capture, guards = entry.capture, entry.capture.guards
        inputs = capture.get_inputs(*frame)
        gate = getattr(guards.check, "__self__", None)
        every = gate.full if gate is not None else guards.check
        assert guards.check(*frame) and every(*frame)
        rows = {
            "bind (arguments -> frame)": lambda: function.bind(model, *args, **kwargs),
            "guards (dict versions)": lambda: guards.check(*frame),
            "guards (every check)": lambda: every(*frame),
            "get_inputs": lambda: capture.get_inputs(*frame),
            "generated call()": lambda: entry.call(list(inputs)),
            "whole call": lambda: compiled(*args, **kwargs),
            "eager": lambda: model(*args, **kwargs),
        }
        us = time_rows(rows, calls, rounds, device.type == "cuda")
        if profile:
            prof = cProfile.Profile()
            prof.runcall(lambda: [compiled(*args, **kwargs) for _ in range(calls)])
    where = torch.cuda.get_device_name() if device.type == "cuda" else "CPU, thread time"
    print(f"\n{name} ({where}; {len(inputs)} graph inputs; {per_call(guards)})")
    for label, t in us.items():
        print(f"  {label:<26}{t:>10.1f} us")
    if profile:
        pstats.Stats(prof).sort_stats("tottime").print_stats(15)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("models", nargs="*")
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads of PyTorch")
    parser.add_argument("--train", action="store_true", help="train steps (bench_host_train)")
    parser.add_argument("--backend", default="auto",
                        help="with --train and not auto: only count the launches")
    a = parser.parse_args()
    torch.set_num_threads(a.threads)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if a.train:
        from bench_host_train import bench_train, count_launches

        for name in a.models or TRAIN_DEFAULT:
            if a.backend != "auto":
                count_launches(name, device, a.backend)
            else:
                bench_train(name, device, a.calls, a.rounds, a.profile)
        return
    for name in a.models or DEFAULT:
        bench(name, device, a.calls, a.rounds, a.profile)


if __name__ == "__main__":
    main()
