"""timm resnet50 in bf16 (32 x 224^2, inference) with the layout pass on and off.

    python examples/bench_layout.py            # on a CUDA machine

Prints eager, torch.compile and minicompile with ``layout_opt`` "off" and "auto" (which
runs the convolutions channels-last on CUDA, passes/layout.py), each checked against
eager first; times are medians from ``triton.testing.do_bench``, in milliseconds, and
beside them the copies (``aten::copy_``) one call makes: a library call whose result
comes in other strides than minicompile's rules said is copied (``with_layout``), and
there should be none.
"""

from __future__ import annotations

import torch

import minicompile
from minicompile import config
from timing import median_seconds


def main() -> None:
    import timm

    torch.manual_seed(0)
    model = timm.create_model("resnet50").to("cuda", torch.bfloat16).eval()
    images = torch.randn(32, 3, 224, 224, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        want = model(images)
        rows = [("eager", model), ("torch.compile", torch.compile(model))]
        for mode in ("off", "auto"):
            kernels = minicompile.stats()["kernels"]
            with config.patch(layout_opt=mode):  # read when the wrapper is made
                compiled = minicompile.compile(model)
            got = compiled(images)
            kernels = minicompile.stats()["kernels"] - kernels
            err = ((got.float() - want.float()).norm() / want.float().norm()).item()
            assert err < 2e-2 and got.stride() == want.stride(), (mode, err, got.stride())
            rows.append((f"minicompile layout_opt={mode} ({kernels} kernels)", compiled))
        for name, fn in rows:
            ms = median_seconds(lambda fn=fn: fn(images), True) * 1e3
            with torch.profiler.profile() as prof:
                fn(images)
            copies = sum(e.name == "aten::copy_" for e in prof.events())
            print(f"{name:48} {ms:8.3f} ms {copies:4d} copies")


if __name__ == "__main__":
    main()
