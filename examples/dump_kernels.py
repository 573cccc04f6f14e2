"""Write the generated code of the model zoo and of bench_gpu.py's kernel rows to a folder,
so that two versions of the compiler can be compared with ``diff -r``.

    python examples/dump_kernels.py OUT [--backend cpp|triton] [names...]
    diff -r OUT_before OUT_after

Each workload runs in its own process (fresh trace counter, fresh cache directory), with
``MINICOMPILE_TRACE=1``: the wrapper module and the kernels of every compiled graph land in
``OUT/<workload>/``.  Small shapes, eval mode; on the CPU the Triton backend needs
``TRITON_INTERPRET=1``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent

KERNELS = {
    "column_sum": (lambda t: t.sum(0), [(64, 96)]),
    "rms_norm": (lambda x, w: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w,
                 [(64, 128), (128,)]),
    "bias_gelu": (lambda x, b: F.gelu(x + b), [(64, 128), (128,)]),
    "sin_sin": (lambda t: torch.sin(torch.sin(t)), [(4096,)]),
    "layer_norm": (lambda t, a, c: F.layer_norm(t, (128,), a, c), [(64, 128), (128,), (128,)]),
    "softmax": (lambda t: torch.softmax(t, -1), [(64, 128)]),
}


def run_one(name: str, backend: str) -> None:
    """Compile and call one workload in this process (the trace goes where the env says)."""
    import minicompile

    torch.manual_seed(0)
    if name in KERNELS:
        fn, shapes = KERNELS[name]
        minicompile.compile(fn, backend=backend)(*[torch.randn(s) for s in shapes])
        return
    import model_zoo

    case = {c.name: c for c in model_zoo.MODELS}[name]
    model = case.build().eval()
    args, kwargs = case.inputs(torch.device("cpu"))
    with torch.no_grad():
        minicompile.compile(model, backend=backend)(*args, **kwargs)


def names() -> list[str]:
    sys.path.insert(0, str(HERE))
    import model_zoo

    return [*KERNELS, *(c.name for c in model_zoo.MODELS)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--backend", default="cpp", choices=("cpp", "triton"))
    parser.add_argument("--one", help=argparse.SUPPRESS)  # the child process's workload
    parser.add_argument("names", nargs="*")
    a = parser.parse_args()
    if a.one:
        sys.path.insert(0, str(HERE))
        run_one(a.one, a.backend)
        return
    for name in a.names or names():
        with tempfile.TemporaryDirectory() as cache:
            env = {**os.environ, "MINICOMPILE_TRACE": "1", "MINICOMPILE_CACHE_DIR": cache,
                   "MINICOMPILE_TRACE_DIR": str(a.out / name)}
            proc = subprocess.run([sys.executable, __file__, str(a.out), "--backend", a.backend,
                                   "--one", name], env=env, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, text=True)
        files = len(list((a.out / name).glob("*"))) if (a.out / name).exists() else 0
        status = "ok" if proc.returncode == 0 else f"failed: {proc.stderr.strip()[-300:]}"
        print(f"{name:28s} {files:4d} files  {status}", flush=True)


if __name__ == "__main__":
    main()
