"""Ahead-of-time export: a small GPT forward pass as a shared library that runs without
Python, checked against eager and timed from Python and from C++.

    python examples/export_gpt.py                 # writes exported/gpt.so, gpt.weights, the runner
    python examples/export_gpt.py out --batch 16 --repeat 50

The batch dimension stays dynamic: the library runs any batch of at least 2 sequences.
Prints one table, ms per call at the given batch: eager, ``minicompile.compile``, the
library loaded in Python (``minicompile.load``), each timed in this process, and the C++
runner (``minicompile_runner``) on the same inputs saved to a file, timing its own runs
(the median of ``--repeat``).  All of them run on the CPU.
"""

import argparse
import re
import subprocess
import tempfile
import time
from pathlib import Path

import torch

import minicompile
from minicompile.aot_export import Exported
from gpt import GPT, GPTConfig
from timing import median_seconds


def runner_ms(exported: Exported, idx: torch.Tensor, repeat: int) -> tuple:
    """The runner's outputs for ``idx`` and the median ms of ``repeat`` runs, as it
    timed them in its own process."""
    with tempfile.TemporaryDirectory() as folder:
        torch.save([idx], Path(folder) / "inputs.pt")
        proc = subprocess.run([str(exported.runner), str(exported.library),
                               str(Path(folder) / "inputs.pt"), str(Path(folder) / "out.pt"),
                               str(repeat)], capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"minicompile_runner failed: {proc.stderr.strip()}")
        (out,) = torch.load(Path(folder) / "out.pt")
    found = re.search(r"([0-9.e+-]+) ms a run", proc.stderr)
    if found is None:
        raise RuntimeError(f"minicompile_runner printed no time: {proc.stderr.strip()}")
    return out, float(found.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", nargs="?", default="exported")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=20, help="timed calls of each")
    opts = parser.parse_args()
    torch.manual_seed(0)
    config = GPTConfig(n_layer=2, n_embd=128)
    model = GPT(config).eval()
    idx = torch.randint(0, config.vocab_size, (8, config.block_size))
    start = time.perf_counter()
    exported = minicompile.export(model, (idx,), Path(opts.out_dir) / "gpt.so", dynamic=[0])
    print(f"exported {exported.library} in {time.perf_counter() - start:.1f} s "
          f"(weights {exported.weights.stat().st_size / 2**20:.1f} MiB)")
    lib = minicompile.load(exported.library)
    compiled = minicompile.compile(model)
    with torch.no_grad():
        for batch in (8, 3):
            idx = torch.randint(0, config.vocab_size, (batch, config.block_size))
            torch.testing.assert_close(lib(idx), model(idx), rtol=1e-4, atol=1e-4)
        idx = torch.randint(0, config.vocab_size, (opts.batch, config.block_size))
        expected = model(idx)
        torch.testing.assert_close(compiled(idx), expected, rtol=1e-4, atol=1e-4)
        rows = [("eager", median_seconds(lambda: model(idx), False, opts.repeat) * 1e3),
                ("minicompile.compile", median_seconds(lambda: compiled(idx), False,
                                                       opts.repeat) * 1e3),
                ("library in Python (minicompile.load)",
                 median_seconds(lambda: lib(idx), False, opts.repeat) * 1e3)]
    from_cpp, ms = runner_ms(exported, idx, opts.repeat)
    torch.testing.assert_close(from_cpp, expected, rtol=1e-4, atol=1e-4)
    rows.append(("C++ runner (minicompile_runner)", ms))
    print("the library matches eager from Python (batches 8 and 3) and from the C++ runner")
    print(f"\nGPT {config.n_layer} layers, n_embd {config.n_embd}, batch {opts.batch} x "
          f"{config.block_size} tokens, CPU ({torch.get_num_threads()} intra-op threads), PyTorch "
          f"{torch.__version__}: median of {opts.repeat} calls\n")
    print("| | ms per call |")
    print("|---|---:|")
    for name, value in rows:
        print(f"| {name} | {value:.2f} |")


if __name__ == "__main__":
    main()
