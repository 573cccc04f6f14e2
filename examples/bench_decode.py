"""Decode tokens per second of transformers' ``generate`` (greedy): eager, torch.compile and
minicompile, at batch 1 and 8, on GPT-2 small and a Llama-shaped model of about 100M
parameters (random init, bf16) on the GPU; on the CPU, the model zoo's tiny configs in float32.

    python examples/bench_decode.py                          # the GPU table
    python examples/bench_decode.py --threads 1 --cpu-time   # CPU: one thread's CPU time
    python examples/bench_decode.py --no-inductor            # leave torch.compile out
    python examples/bench_decode.py --real-sizes --threads 1 --cpu-time --new-tokens 8
                                      # the GPU's models (GPT-2 small, Llama 100M) on the CPU
    python examples/bench_decode.py --parts      # minicompile's host time per part of a call

Rows (each a fresh copy of the model, the compiled code warmed by two ``generate`` calls; all
of a model and batch prepared first, then timed in turns, one ``generate`` call of each
setup per turn, ``--reps`` turns):

- ``eager``: the default dynamic cache;
- ``torch.compile``: transformers' recommended setup, ``cache_implementation="static"``, with
  which ``generate`` compiles the decode step itself (``torch.compile(mode="reduce-overhead")``
  after an eager prefill, from its ``CompileConfig``; replacing ``model.forward`` with a
  compiled one instead fails on transformers 5, whose static cache is allocated inside the
  first forward and so becomes a CUDA-graph output that the next replay overwrites); on the
  CPU, where ``generate`` does not compile, ``torch.compile(model.forward, fullgraph=True)``;
- ``minicompile``: the same static cache, ``model.forward = minicompile.compile(model.forward,
  mode="reduce-overhead")`` (each decode step a CUDA graph replay);
- ``minicompile dynamic``: the default dynamic cache, ``minicompile.compile(model.forward)``
  (the cache length a symbol: two compiles).

Decode tokens/s: the batch over the median time of one decode step (a streamer notes when
each step's tokens reach the host), over every step of every repetition; prefill is left
out.  ``same``: the share of generated tokens equal to eager's (1.00 in float32; bf16
rounding differs between implementations, so a greedy path may part after some steps).
``compiles``: graphs the compiler built (minicompile.stats, or Dynamo's frame count).
``guards per call``: minicompile's guard checks, time per call (every entry's check it ran,
with the clock's own cost) and what the decode entry's check runs (a gate's fast path:
minicompile/runtime/dict_guards.py).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from model_report import import_torchvision  # noqa: E402
from model_zoo import _gpt2, _llama  # noqa: E402

import minicompile  # noqa: E402
from minicompile.runtime.dict_guards import per_call, right_after_check  # noqa: E402

STATIC = {"cache_implementation": "static", "disable_compile": True}  # the compile is ours


def gpt2_small() -> torch.nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(GPT2Config())  # 124M parameters: 12 layers, 768 wide


def llama_100m() -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(LlamaConfig(
        vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=8,
        num_attention_heads=12, num_key_value_heads=4, max_position_embeddings=2048))


GPU_MODELS = {"gpt2": gpt2_small, "llama": llama_100m}
CPU_MODELS = {"gpt2": _gpt2, "llama": _llama}


class StepClock:
    """A streamer (transformers' BaseStreamer protocol) that notes the time of each put:
    the prompt, then each step's tokens (copied to the host, so the device has finished)."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock, self.times = clock, []

    def put(self, value: torch.Tensor) -> None:
        self.times.append(self.clock())

    def end(self) -> None:
        pass

    def decode_steps(self) -> list[float]:
        return [b - a for a, b in zip(self.times[1:], self.times[2:])]  # after the prefill


def setups(no_inductor: bool) -> dict[str, tuple[Callable[[torch.nn.Module], None], dict]]:
    """name -> (what it does to a fresh model, generate's options)."""

    def ours(m: torch.nn.Module) -> None:
        m.forward = minicompile.compile(m.forward, mode="reduce-overhead")

    def ours_dynamic(m: torch.nn.Module) -> None:
        m.forward = minicompile.compile(m.forward)

    def inductor(m: torch.nn.Module) -> None:
        m.forward = torch.compile(m.forward, fullgraph=True)

    cuda = torch.cuda.is_available()
    rows = {"eager": (lambda m: None, {})}
    if not no_inductor:
        rows["torch.compile"] = ((lambda m: None, {"cache_implementation": "static"}) if cuda
                                 else (inductor, STATIC))  # generate compiles on GPUs only
    rows["minicompile"] = (ours, STATIC)
    rows["minicompile dynamic"] = (ours_dynamic, {})
    return rows


def compiles(name: str, model: torch.nn.Module) -> int | None:
    if name.startswith("minicompile"):
        return len(model.forward.entries)  # this copy's graphs, compiled or loaded warm
    if name == "torch.compile":
        from torch._dynamo.utils import counters

        return counters["stats"]["unique_graphs"]
    return None


class GuardClock:
    """Times the guard checks of a compiled function's entries: per call that ran compiled
    code (one check passed; the median, and the mean with the first calls' recordings and
    the failing checks of other entries), and what the passing entry's check runs
    (dict_guards.per_call)."""

    def __init__(self, fn: minicompile.api.CompiledFunction, clock: Callable[[], float]) -> None:
        self.seconds, self.passes, self.calls = 0.0, Counter(), []
        self.words = {id(e.capture.guards): per_call(e.capture.guards) for e in fn.entries}
        for entry in fn.entries:
            entry.capture.guards.check = self.timed(entry.capture.guards, clock)

    def timed(self, guards: Any, clock: Callable[[], float]) -> Callable[..., bool]:
        check = guards.check

        def timed_check(*args: Any) -> bool:
            start = clock()
            ok = check(*args)
            self.seconds += clock() - start
            self.calls.append(clock() - start)
            self.passes[id(guards)] += ok
            return ok
        return timed_check

    def __str__(self) -> str:
        ((top, _),) = self.passes.most_common(1)
        mean = self.seconds / sum(self.passes.values()) * 1e6
        median = statistics.median(self.calls) * 1e6
        return f"{median:.1f} us median, {mean:.1f} mean; {self.words[top]}"


class PartClock:
    """``--parts``: the host time of each part of minicompile's compiled calls, the median
    per call that ran an entry: the guard checks (every entry's checks the call ran),
    ``get_inputs``, the generated ``call`` (on the GPU under reduce-overhead, the CUDA
    graph's replay: its key, input copies, launch and outputs; on the CPU the kernels too),
    ``rebuild`` (the output, write-backs), and the whole call."""

    def __init__(self, fn: minicompile.api.CompiledFunction, clock: Callable[[], float]) -> None:
        self.clock, self.times = clock, {k: [] for k in ("guards", "get_inputs", "call",
                                                         "rebuild", "whole call")}
        self.guards = 0.0
        for entry in fn.entries:
            entry.capture.guards.check = self.timed_check(entry.capture.guards.check)
            entry.run = self.timed_run(entry)
        whole = type(fn).__call__

        def timed_whole(this: Any, *args: Any, **kwargs: Any) -> Any:
            self.guards, start = 0.0, clock()
            out = whole(this, *args, **kwargs)
            self.times["whole call"].append(clock() - start)
            return out
        fn.__class__ = type("Timed", (type(fn),), {"__call__": timed_whole})

    def timed_check(self, check: Callable[..., bool]) -> Callable[..., bool]:
        def timed(*args: Any) -> bool:
            start = self.clock()
            ok = check(*args)
            self.guards += self.clock() - start
            return ok
        return timed

    def timed_run(self, entry: Any) -> Callable[[tuple], Any]:
        run, capture, call, clock = entry.run, entry.capture, entry.call, self.clock
        get_inputs = right_after_check(capture.get_inputs)  # (as the entry's run reads them)

        def timed(frame: tuple) -> Any:
            if torch.is_grad_enabled() or call is None:
                return run(frame)
            t0 = clock()
            inputs = get_inputs(*frame)
            t1 = clock()
            outs = call(inputs)
            t2 = clock()
            out = capture.rebuild(outs, *frame)
            t3 = clock()
            for k, t in zip(("guards", "get_inputs", "call", "rebuild"),
                            (self.guards, t1 - t0, t2 - t1, t3 - t2)):
                self.times[k].append(t)
            return out
        return timed

    def __str__(self) -> str:
        return ", ".join(f"{k} {statistics.median(v) * 1e6:.0f}" for k, v in self.times.items()
                         if v) + " us"


def run(model: torch.nn.Module, ids: torch.Tensor, tokens: int, options: dict,
        clock: Callable[[], float]) -> tuple[torch.Tensor, list[float]]:
    streamer = StepClock(clock)
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=tokens,
                         min_new_tokens=tokens, do_sample=False, pad_token_id=0,
                         streamer=streamer, **options)
    return out[:, ids.shape[1]:], streamer.decode_steps()


class Row:
    """One setup on a fresh copy of the model: compiled and warmed by two ``generate`` calls
    (:meth:`prepare`), then timed a repetition at a time (:meth:`rep`)."""

    def __init__(self, name: str, setup: tuple[Callable, dict]) -> None:
        self.name, (self.prepare_model, self.options) = name, setup
        self.steps: list[float] = []
        self.model: Any = None
        self.got: torch.Tensor | None = None
        self.clock: Any = ""
        self.compiles: int | None = None

    def prepare(self, base: torch.nn.Module, ids: torch.Tensor, a: argparse.Namespace,
                clock: Callable) -> None:
        if self.name == "torch.compile":
            torch._dynamo.reset()  # before any setup of this model and batch is timed
        self.model = copy.deepcopy(base)
        self.prepare_model(self.model)
        with torch.no_grad():
            for _ in range(2):  # compiles, records CUDA graphs
                self.got, _ = run(self.model, ids, a.new_tokens, self.options, clock)
        self.compiles = compiles(self.name, self.model)
        if self.name.startswith("minicompile"):
            self.clock = (PartClock if a.parts else GuardClock)(self.model.forward, clock)

    def rep(self, ids: torch.Tensor, a: argparse.Namespace, clock: Callable) -> None:
        with torch.no_grad():
            self.got, times = run(self.model, ids, a.new_tokens, self.options, clock)
        self.steps += times

    def rate(self) -> float:
        return self.got.shape[0] / statistics.median(self.steps)  # type: ignore[union-attr]


def table_rows(model_name: str, base: torch.nn.Module, ids: torch.Tensor,
               a: argparse.Namespace, clock: Callable) -> None:
    """Every setup prepared, then timed in turns (a repetition of each, ``--reps`` times), so
    that a slow spell of the machine falls on all of them alike."""
    rows, batch = [], ids.shape[0]
    for name, setup in setups(a.no_inductor).items():
        row = Row(name, setup)
        try:
            row.prepare(base, ids, a, clock)
            rows.append(row)
        except Exception as e:  # one setup failing must not hide the others' rows
            print(f"| {model_name} | {batch} | {name} | failed: "
                  f"{type(e).__name__}: {str(e).splitlines()[0][:120]} | | | | |")
    for _ in range(a.reps):
        for row in rows:
            row.rep(ids, a, clock)
    eager = rows[0] if rows and rows[0].name == "eager" else None
    for row in rows:
        same = 1.0 if eager is None else (row.got == eager.got).float().mean().item()
        vs = "" if eager is None else f"{row.rate() / eager.rate():.2f}"
        print(f"| {model_name} | {batch} | {row.name} | {row.rate():.0f} | {vs} | {same:.2f} | "
              f"{'' if row.compiles is None else row.compiles} | {row.clock} |", flush=True)
    torch._dynamo.reset()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="gpt2,llama")
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--prompt", type=int, default=16, help="prompt length")
    parser.add_argument("--new-tokens", type=int, default=None,
                        help="tokens generated per call (default: 128 on the GPU, 16 on the CPU)")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--no-inductor", action="store_true", help="leave torch.compile out")
    parser.add_argument("--parts", action="store_true",
                        help="minicompile's host time per part of a call (PartClock), in place "
                             "of the guard column")
    parser.add_argument("--real-sizes", action="store_true",
                        help="on the CPU too, the GPU's models (GPT-2 small, Llama 100M)")
    parser.add_argument("--threads", type=int, default=None, help="CPU threads")
    parser.add_argument("--cpu-time", action="store_true",
                        help="time this thread's CPU time (CPU, with --threads 1 only)")
    a = parser.parse_args()
    import_torchvision()  # transformers imports it
    cuda = torch.cuda.is_available()
    if a.threads is not None:
        torch.set_num_threads(a.threads)
    if a.cpu_time and (cuda or torch.get_num_threads() != 1):
        parser.error("--cpu-time counts one thread's time on the CPU: use it with --threads 1")
    a.new_tokens = a.new_tokens or (128 if cuda else 16)
    clock = time.thread_time if a.cpu_time else time.perf_counter
    device, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    builds = GPU_MODELS if cuda or a.real_sizes else CPU_MODELS
    print(f"decode tokens/s on {torch.cuda.get_device_name() if cuda else 'CPU'} ({dtype}), "
          f"torch {torch.__version__}; prompt {a.prompt}, {a.new_tokens} new tokens, "
          f"median decode step of {a.reps} calls{' (CPU time)' if a.cpu_time else ''}")
    print("| model | batch | setup | tokens/s | vs eager | same | compiles | guards per call |")
    print("|---|---|---|---|---|---|---|---|")
    for model_name in a.models.split(","):
        torch.manual_seed(0)
        base = builds[model_name]().eval().to(device=device, dtype=dtype)
        for batch in (int(b) for b in a.batches.split(",")):
            ids = torch.randint(1, base.config.vocab_size, (batch, a.prompt), device=device)
            minicompile.reset()
            table_rows(model_name, base, ids, a, clock)


if __name__ == "__main__":
    main()
