"""What the library-model examples (hf_bert.py, timm_resnext.py) print for one model: its
graphs and graph breaks (minicompile.explain), kernels, the cold first call, and the
median call of eager PyTorch, minicompile and torch.compile (timed in turns)."""

from __future__ import annotations

import sys
import time
import types
from collections.abc import Callable
from typing import Any

import torch

import minicompile
from timing import interleaved_ms


def import_torchvision() -> None:
    """Import torchvision, which transformers and timm import.  A torchvision built for
    another PyTorch fails in its fake-kernel registrations ("operator torchvision::nms does
    not exist"); its Python layers (all these models use) then load without them."""
    try:
        import torchvision  # noqa: F401
    except RuntimeError as e:
        print(f"note: torchvision without its C++ operators ({e})")
        for name in [n for n in sys.modules if n.split(".")[0] == "torchvision"]:
            del sys.modules[name]
        sys.modules["torchvision._meta_registrations"] = types.ModuleType("stub")
        import torchvision  # noqa: F401, F811


def cold_seconds(fn: Callable[[], Any], cuda: bool) -> tuple[float, Any]:
    """The first call (capture, code generation, build: from the on-disk cache, where an
    earlier run left the kernels) and its result."""
    start = time.perf_counter()
    out = fn()
    if cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - start, out


def report(
    label: str,
    model: torch.nn.Module,
    kwargs: dict[str, Any],
    check: Callable[[Any, Any], None],
    cuda: bool,
) -> None:
    """Compile ``model`` with minicompile (and torch.compile, where it works), check each
    result against eager with ``check(actual, expected)``, and print the figures.  Call
    under ``torch.no_grad()``."""
    minicompile.reset()
    compiled = minicompile.compile(model)
    cold_s, out = cold_seconds(lambda: compiled(**kwargs), cuda)
    expected = model(**kwargs)
    check(out, expected)
    check(compiled(**kwargs), expected)  # the second call runs the cached code
    stats = minicompile.stats()
    explained = minicompile.explain(model)(**kwargs)  # leaves stats() as they were
    print(f"== {label}: matches eager")
    print(f"graphs {explained.graph_count}   graph breaks {explained.graph_break_count}   "
          f"kernels {stats['kernels']}   eager fallbacks {stats['eager_fallbacks']}")
    for k, reason in enumerate(explained.break_reasons, 1):
        print(f"  break {k}: {reason}")
    calls = {"eager": lambda: model(**kwargs), "minicompile": lambda: compiled(**kwargs)}
    line = f"cold first call {cold_s:.2f} s"
    try:
        torch._dynamo.reset()
        inductor = torch.compile(model)
        tc_cold_s, tc_out = cold_seconds(lambda: inductor(**kwargs), cuda)
        check(tc_out, expected)
        calls["torch.compile"] = lambda: inductor(**kwargs)
    except Exception as e:  # no C++ toolchain or Triton for Inductor here, say
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        tc_cold_s, skipped = None, f"({type(e).__name__}: {first[:80]})"
    # Timed in turns: on a shared machine, load that comes and goes falls on all three.
    for name, ms in interleaved_ms(calls, cuda).items():
        line += f"   {name} {ms:.3f} ms"
    line += (f" (cold {tc_cold_s:.1f} s)" if tc_cold_s is not None
             else f"   torch.compile skipped {skipped}")
    print(line)
