"""Serving latency: ms per call of resnet18, a small GPT and a tiny BERT (serving_models.py)
at batch 1 and batch 32, on the GPU (when there is one) and on the CPU: eager,
``minicompile.compile``, the exported library called from Python (``minicompile.load``)
and the C++ runner (``minicompile_runner``, timing its own runs without Python).

    python examples/bench_serving.py                      # every model, GPU and CPU
    python examples/bench_serving.py --devices cuda --models gpt,bert --repeat 50

Each call is timed to its end (on the GPU, until the GPU is done: a served request's
latency), the median of ``--repeat`` calls after warm-up.  Batch 1 is exported with static
sizes (a dynamic dim takes sizes >= 2), batch 32 with a dynamic batch (from an example of
32: a trace may rely on relations of its sizes, such as resnet18's ``s0 < 16`` from an
example of 4, which the library then checks).
Every library is checked against eager before it is timed.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import tempfile
import time
from pathlib import Path

import torch

import minicompile
from minicompile.aot_export import Exported
from serving_models import SERVED
from timing import median_seconds


def runner_ms(exported: Exported, inputs: tuple, repeat: int) -> tuple:
    """The runner's outputs and the median ms of ``repeat`` runs, as it timed them."""
    with tempfile.TemporaryDirectory() as folder:
        torch.save([t.cpu() for t in inputs], Path(folder) / "inputs.pt")
        proc = subprocess.run([str(exported.runner), str(exported.library),
                               str(Path(folder) / "inputs.pt"), str(Path(folder) / "out.pt"),
                               str(repeat)], capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"minicompile_runner failed: {proc.stderr.strip()}")
        outputs = torch.load(Path(folder) / "out.pt")
    found = re.search(r"([0-9.e+-]+) ms a run", proc.stderr)
    if found is None:
        raise RuntimeError(f"minicompile_runner printed no time: {proc.stderr.strip()}")
    return outputs, float(found.group(1))


def ms(fn: object, cuda: bool, repeat: int) -> float:
    def call() -> None:
        fn()
        if cuda:
            torch.cuda.synchronize()

    return median_seconds(call, False, repeat) * 1e3


def bench(name: str, device: torch.device, repeat: int, out: Path) -> list[tuple]:
    """Rows (model, device, batch, eager, compiled, library, runner) for one model."""
    torch.manual_seed(0)
    model, fn, inputs = SERVED[name]()
    model.to(device)
    cuda = device.type == "cuda"
    tol = {"rtol": 2e-3, "atol": 2e-3}
    rows = []
    with torch.no_grad():
        compiled = minicompile.compile(fn)
        for batch in (1, 32):
            example = tuple(t.to(device) for t in inputs(batch))
            dynamic = None if batch == 1 else [0] * len(example)
            start = time.perf_counter()
            exported = minicompile.export(fn, example, out / f"{name}_{device.type}_{batch}.so",
                                          dynamic=dynamic)
            took = time.perf_counter() - start
            lib = minicompile.load(exported)
            args = tuple(t.to(device) for t in inputs(batch))
            expected = fn(*args)
            torch.testing.assert_close(lib(*args), expected, **tol)
            torch.testing.assert_close(compiled(*args), expected, **tol)
            (from_cpp,), runner = runner_ms(exported, args, repeat)
            torch.testing.assert_close(from_cpp, expected.cpu(), **tol)
            rows.append((name, device.type, batch, ms(lambda: fn(*args), cuda, repeat),
                         ms(lambda: compiled(*args), cuda, repeat),
                         ms(lambda: lib(*args), cuda, repeat), runner))
            print(f"  {name} {device.type} batch {batch}: exported in {took:.1f} s, "
                  f"matches eager from Python and the runner", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(SERVED))
    parser.add_argument("--devices", default="cuda,cpu" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--repeat", type=int, default=30, help="timed calls of each")
    parser.add_argument("--out", default=None, help="where the libraries go (a temporary folder)")
    opts = parser.parse_args()
    folder = Path(opts.out or tempfile.mkdtemp(prefix="bench-serving-"))
    rows = []
    for device in opts.devices.split(","):
        for name in opts.models.split(","):
            rows += bench(name, torch.device(device), opts.repeat, folder)
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
    print(f"\nms per call (median of {opts.repeat}); PyTorch {torch.__version__}, {gpu}, "
          f"CPU: {torch.get_num_threads()} intra-op threads\n")
    print("| model | device | batch | eager | minicompile.compile | library (Python) "
          "| C++ runner |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for name, device, batch, *times in rows:
        print(f"| {name} | {device} | {batch} | " + " | ".join(f"{t:.3f}" for t in times) + " |")


if __name__ == "__main__":
    main()
