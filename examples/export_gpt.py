"""Ahead-of-time export: a small GPT forward pass as a shared library that runs without
Python, checked against eager and timed from Python and from C++.

    python examples/export_gpt.py            # writes exported/gpt.so, gpt.weights, the runner

The batch dimension stays dynamic: the library runs any batch of at least 2 sequences.
"""

import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

import minicompile
from gpt import GPT, GPTConfig
from timing import median_seconds


def main() -> None:
    torch.manual_seed(0)
    config = GPTConfig(n_layer=2, n_embd=128)
    model = GPT(config).eval()
    idx = torch.randint(0, config.vocab_size, (8, config.block_size))
    out_dir = Path(sys.argv[1] if len(sys.argv) > 1 else "exported")
    start = time.perf_counter()
    exported = minicompile.export(model, (idx,), out_dir / "gpt.so", dynamic=[0])
    print(f"exported {exported.library} in {time.perf_counter() - start:.1f} s "
          f"(weights {exported.weights.stat().st_size / 2**20:.1f} MiB)")
    lib = minicompile.load(exported.library)
    compiled = minicompile.compile(model)
    with torch.no_grad():
        for batch in (8, 3):
            idx = torch.randint(0, config.vocab_size, (batch, config.block_size))
            torch.testing.assert_close(lib(idx), model(idx), rtol=1e-4, atol=1e-4)
        idx = torch.randint(0, config.vocab_size, (8, config.block_size))
        eager_s = median_seconds(lambda: model(idx), False)
        compiled(idx)
        mc_s = median_seconds(lambda: compiled(idx), False)
        lib_s = median_seconds(lambda: lib(idx), False)
        expected = model(idx)
    with tempfile.TemporaryDirectory() as folder:
        torch.save([idx], Path(folder) / "inputs.pt")
        proc = subprocess.run([str(exported.runner), str(exported.library),
                               str(Path(folder) / "inputs.pt"), str(Path(folder) / "out.pt"),
                               "20"], capture_output=True, text=True, check=True)
        (from_cpp,) = torch.load(Path(folder) / "out.pt")
    torch.testing.assert_close(from_cpp, expected, rtol=1e-4, atol=1e-4)
    print("the library matches eager from Python (batches 8 and 3) and from the C++ runner")
    print(f"batch 8: eager {eager_s * 1e3:.2f} ms   minicompile.compile {mc_s * 1e3:.2f} ms   "
          f"library from Python {lib_s * 1e3:.2f} ms")
    print(proc.stderr.strip())


if __name__ == "__main__":
    main()
