"""Host time of compiled train steps, split into its parts: ``bench_host.py --train``.

A step is ``bench_models.step``'s (forward, a loss over the float outputs, the parameters'
gradients by ``torch.autograd.grad``); ``nanogpt`` is examples/gpt.py's GPT (2 layers, 64
wide, 2 x 32 tokens) with its cross-entropy loss compiled in the graph, as
examples/train_nanogpt.py runs it.  Each part is timed alone on the values of a real step:
the guards and ``get_inputs`` of the compiled forward, the generated forward and backward
``call()`` (on the CPU with their kernels' work), the eager loss and its backward, and the
whole step; "the rest" is the whole step less those parts: the autograd.Function's
``forward``/``backward`` wrappers and PyTorch's autograd engine around them.
"""

from __future__ import annotations

import cProfile
import inspect
import pstats
import re
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from bench_host import time_rows
from bench_models import step, without_dropout
from gpt import GPT, GPTConfig
from model_zoo import MODELS, tensors_of

import minicompile
from minicompile.runtime import autograd as runtime_autograd
from minicompile.runtime.profile import instrument


def forward_loss(model: torch.nn.Module, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    logits = model(idx)
    return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def build(name: str, device: torch.device,
          backend: str = "auto") -> tuple[Callable, Callable, Callable, Callable]:
    """(compiled step, eager step, its compiled function, the loss's eager forward and
    backward on the compiled forward's outputs) of model ``name``."""
    torch.manual_seed(0)
    if name == "nanogpt":
        config = GPTConfig(n_layer=2, n_embd=64, n_head=4, block_size=32, vocab_size=128)
        model = GPT(config).to(device).train()
        idx, targets = (torch.randint(0, 128, (2, 32), device=device) for _ in range(2))
        params = list(model.parameters())
        compiled = minicompile.compile(forward_loss, backend=backend)

        def train(fn: Callable) -> Callable:
            return lambda: torch.autograd.grad(fn(model, idx, targets), params)

        return train(compiled), train(forward_loss), compiled, lambda: None
    case = {m.name: m for m in MODELS}[name]
    model = without_dropout(case.build().to(device).train())
    args, kwargs = case.inputs(device)
    compiled = minicompile.compile(model, backend=backend)
    outs = [t.detach().requires_grad_() for t in tensors_of(compiled(*args, **kwargs))
            if isinstance(t, torch.Tensor) and t.is_floating_point()]

    def loss() -> None:
        torch.autograd.grad(sum(t.float().square().mean() for t in outs), outs)

    return (step(compiled, args, kwargs, True), step(model, args, kwargs, True),
            compiled.__dict__["_compiled"], loss)


class Steps:
    """What an instrumented generated call (runtime/profile.instrument) reports to: the CPU
    time of its kernels and library calls, summed."""

    def __init__(self) -> None:
        self.busy = self.started = 0.0

    def start(self, k: int) -> None:
        self.started = time.thread_time()

    def stop(self, k: int, *_: object) -> None:
        self.busy += time.thread_time() - self.started


def python_of(generated: Callable, values: list, calls: int) -> tuple[float, str]:
    """(microseconds per call of ``generated``'s own Python: allocations, argument lists,
    everything but its kernels and library calls; 'kernels + library calls' it makes)."""
    made = instrument(generated)
    if made is None:
        return float("nan"), "?"
    call, _, namespace = made
    namespace["_mc_profile"] = recorder = Steps()
    runtime_autograd._recorded.calls = []  # (what a forward's record() calls append to)
    call(list(values))
    recorder.busy = 0.0
    start = time.thread_time()
    for _ in range(calls):
        call(list(values))
    total = time.thread_time() - start
    return (total - recorder.busy) / calls * 1e6, launches(generated)


def parts(function: minicompile.api.CompiledFunction, whole: Callable) -> dict[str, Callable]:
    """The timed parts of one step, on the values of a real one (``whole``)."""
    (entry,) = function.entries
    train = inspect.getclosurevars(entry.run).nonlocals["step"]  # make_runner's TrainingStep
    guards, forward, backward = entry.capture.guards, train.forward, train.backward
    check = guards.check
    seen: dict[str, list] = {"frame": [], "forward": [], "backward": [], "grads": [], "outs": []}

    def keep_frame(*frame: object) -> bool:
        seen["frame"].append(frame)
        return check(*frame)

    def keep_forward(given: list) -> tuple:
        seen["forward"].append(list(given))
        seen["outs"].append(forward(given))
        return seen["outs"][-1]

    def keep_backward(given: list) -> tuple:
        seen["backward"].append(list(given))
        seen["grads"].append(backward(given))
        return seen["grads"][-1]

    guards.check, train.forward, train.backward = keep_frame, keep_forward, keep_backward
    try:
        whole()
    finally:
        guards.check, train.forward, train.backward = check, forward, backward
    frame, capture = seen["frame"][0], entry.capture

    def forward_call() -> None:
        runtime_autograd._recorded.calls = []
        with torch.no_grad():
            forward(list(seen["forward"][0]))

    def stubbed() -> None:  # the whole step, its generated calls returning what they did
        train.forward, train.backward = (lambda _: seen["outs"][0]), (lambda _: seen["grads"][0])
        try:
            whole()
        finally:
            train.forward, train.backward = forward, backward

    def backward_call() -> None:  # (autograd runs a once_differentiable backward so)
        with torch.no_grad():
            backward(list(seen["backward"][0]))

    calls = {"forward": (forward, seen["forward"][0]), "backward": (backward, seen["backward"][0])}
    return {"guards": lambda: check(*frame),
            "get_inputs": lambda: capture.get_inputs(*frame),
            "forward call()": forward_call,
            "backward call()": backward_call,
            "step, calls stubbed": stubbed}, calls


def count_launches(name: str, device: torch.device, backend: str) -> None:
    """Only the launches of each generated call, compiled for ``backend`` (``--backend
    triton`` on a CPU: one step under Triton's interpreter, nothing timed)."""
    minicompile.reset()
    compiled, _, function, _ = build(name, device, backend)
    compiled()
    (entry,) = function.entries
    train = inspect.getclosurevars(entry.run).nonlocals["step"]
    print(f"{name} train step ({backend}): launches (kernels + library calls): forward "
          f"{launches(train.forward)}, backward {launches(train.backward)}")


def launches(generated: Callable) -> str:
    """'kernels + library calls' of a generated call, each statement once (a library
    result's unpacking, ``buf3[0]``, is a step of the profile but no launch)."""
    made = instrument(generated)
    if made is None:
        return "?"
    steps = [s for s in made[1] if not re.fullmatch(r"\w+\[\d+\]", s.name)]
    library = sum(s.library for s in steps)
    return f"{len(steps) - library} + {library}"


def bench_train(name: str, device: torch.device, calls: int, rounds: int,
                profile: bool) -> None:
    """Print the parts of model ``name``'s train step (the module's doc)."""
    minicompile.reset()
    compiled, eager, function, loss = build(name, device)
    compiled()
    compiled()
    rows, generated = parts(function, compiled)
    rows["loss (eager, fwd + bwd)"] = loss
    rows["whole step"] = compiled
    rows["eager step"] = eager
    us = time_rows(rows, calls, rounds, device.type == "cuda")
    with torch.no_grad():
        python = {k: python_of(fn, values, calls) for k, (fn, values) in generated.items()}
    host = us["step, calls stubbed"] - us["guards"] - us["get_inputs"] - us[
        "loss (eager, fwd + bwd)"]
    where = torch.cuda.get_device_name() if device.type == "cuda" else "CPU, thread time"
    (entry,) = function.entries
    print(f"\n{name} train step ({where}; {len(entry.capture.guards)} guard checks; "
          f"launches (kernels + library calls): forward {python['forward'][1]}, backward "
          f"{python['backward'][1]})")
    for label, t in us.items():
        print(f"  {label:<36}{t:>10.1f} us")
    print(f"  {'Function + autograd (stubbed - rest)':<36}{host:>10.1f} us")
    for k, (t, _) in python.items():
        print(f"  {k + ' call(): its Python':<36}{t:>10.1f} us")
    print(f"  {'host total (stubbed + calls Python)':<36}"
          f"{us['step, calls stubbed'] + sum(t for t, _ in python.values()):>10.1f} us")
    if profile:
        prof = cProfile.Profile()
        prof.runcall(lambda: [compiled() for _ in range(calls)])
        pstats.Stats(prof).sort_stats("tottime").print_stats(20)
