"""Dynamic shapes on the model zoo: how many times each model compiles over several batch
sizes and lengths (image sizes for CNNs), with ``dynamic=True`` and with automatic dynamic
shapes, each call checked against eager; and why a capture fell back to static sizes.

    python examples/zoo_dynamic.py                       # every model, C++ backend (CPU)
    python examples/zoo_dynamic.py hf_gpt2 hf_t5 --backend triton   # on the GPU if there is one
"""

from __future__ import annotations

import argparse
import contextlib
import io

import torch

import minicompile
from minicompile import config
from model_zoo import MODELS, ModelCase, tensors_of


def _close(got: torch.Tensor, want: torch.Tensor) -> bool:
    """As the tests compare (tests/models/test_dynamic_models.py)."""
    if not want.is_floating_point() or not want.numel():
        return torch.equal(got, want)
    return torch.allclose(got, want, 1e-3, 1e-4 + 1e-5 * want.abs().max().item())


def compiles(case: ModelCase, dynamic: bool | None, backend: str) -> tuple[dict, list[str]]:
    """The stats of calling ``case`` compiled over its sizes, and the static fallbacks and
    values that differ from eager's (more than rtol 1e-3, atol 1e-4 + 1e-5 * max |value|)."""
    device = torch.device("cuda" if torch.cuda.is_available() and backend != "cpp" else "cpu")
    torch.manual_seed(0)
    model = case.build().eval().to(device)
    compiled = minicompile.compile(model, backend=backend, dynamic=dynamic)
    minicompile.reset()
    log, differ = io.StringIO(), []
    with torch.no_grad(), config.patch(logs=frozenset({"dynamic"})), \
            contextlib.redirect_stderr(log):
        for batch, length in case.sizes:
            extra = {} if length is None else {"length": length}
            args, kwargs = case.inputs(device, batch=batch, **extra)
            for got, want in zip(tensors_of(compiled(*args, **kwargs)),
                                 tensors_of(model(*args, **kwargs)), strict=True):
                if isinstance(want, torch.Tensor) and not _close(got, want):
                    diff = (got - want).abs().max().item()
                    differ.append(f"DIFFERS from eager at {(batch, length)} by {diff:.2g}")
    static = sorted({line.split("compiled with static sizes: ", 1)[1][:160]
                     for line in log.getvalue().splitlines() if "with static sizes" in line})
    return minicompile.stats(), static + differ


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("models", nargs="*", help="names in model_zoo.MODELS (default: all)")
    parser.add_argument("--backend", default="cpp")
    args = parser.parse_args()
    cases = [c for c in MODELS if not args.models or c.name in args.models]
    print(f"{'model':<28}{'sizes':>6}{'dynamic=True':>14}{'automatic':>11}  "
          "static fallbacks; values that differ")
    for case in cases:
        counts, reasons = [], []
        for dynamic in (True, None):
            stats, static = compiles(case, dynamic, args.backend)
            counts.append(stats["frames"])
            reasons += static
        print(f"{case.name:<28}{len(case.sizes):>6}{counts[0]:>14}{counts[1]:>11}  "
              f"{'; '.join(sorted(set(reasons))) or '-'}", flush=True)


if __name__ == "__main__":
    main()
