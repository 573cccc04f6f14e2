"""GPT-2 small's LM head and the layouts cuBLAS gets (issue #28), on a GPU.

    python examples/bench_gemm_layout.py                 # bf16, 16 x 512 tokens, 12 layers
    python examples/bench_gemm_layout.py --batch 8 --length 128

GPT-2's LM head (``nn.Linear(768, 50257)``, tied to the token embedding) writes rows of
50257 logits: in eager's contiguous result cuBLAS gets a leading dimension of 50257, not a
multiple of 16 bytes, and runs an ``align1`` kernel.  passes/gemm_padding.py writes those
rows padded (and copies the logits back to eager's strides).  Printed, from one process
(random init, no download; every compiled result checked against eager):

1. the LM-head product alone: eager's ``F.linear``, the same product into padded rows, and
   that plus the copy back, with the cuBLAS kernel each runs (from the profiler);
2. the operands of every matrix product whose result has 50257 columns, as ATen hands them
   to cuBLAS (shape:strides), in eager and in minicompile with ``gemm_padding`` off
   (main's behaviour) and "auto";
3. the whole forward: eager, torch.compile, minicompile with ``gemm_padding`` off and auto.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import minicompile
from minicompile import config
from minicompile.runtime import gemm
from model_report import import_torchvision
from timing import median_seconds

VOCAB = 50257
PRODUCTS = {"mm", "addmm", "bmm", "baddbmm"}


class WideProducts(TorchDispatchMode):
    """Records the operands (shape:strides) of the matrix products with a result of VOCAB
    columns or more (padded: more)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        if func.overloadpacket.__name__ in PRODUCTS and result.shape[-1] >= VOCAB:
            named = [(f"arg{i}", a) for i, a in enumerate(args)] + [*kwargs.items(),
                                                                    ("result", result)]
            self.calls.append(f"{func}(" + ", ".join(
                f"{k}={list(t.shape)}:{list(t.stride())}" for k, t in named
                if isinstance(t, torch.Tensor)) + ")")
        return result


def products_of(fn: Callable[[], object]) -> list[str]:
    with WideProducts() as mode:
        fn()
    torch.cuda.synchronize()
    return mode.calls


def kernels_of(fn: Callable[[], object]) -> str:
    """The GPU kernels one call of ``fn`` runs, with their time."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    events = [e for e in prof.key_averages() if e.device_type.name == "CUDA"]
    return "; ".join(f"{e.key[:90]} {e.device_time_total / 1e3:.3f} ms" for e in events)


def ms(fn: Callable[[], object]) -> float:
    return median_seconds(fn, True) * 1e3


def lm_head_alone(tokens: int) -> None:
    x = torch.randn(tokens, 768, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(VOCAB, 768, device="cuda", dtype=torch.bfloat16) * 0.02
    want = F.linear(x, w)
    wp = gemm.pad_rows(w)  # once: the weight is a parameter (passes/hoist_params.py)
    padded = gemm.linear(x, wp, None, VOCAB)
    torch.testing.assert_close(padded, want, rtol=2e-2, atol=2e-2)
    variants = {
        "eager F.linear (rows of 50257)": lambda: F.linear(x, w),
        "padded rows (50264)": lambda: gemm.linear(x, wp, None, VOCAB),
        "padded rows + copy to eager's strides": lambda: gemm.linear(x, wp, None,
                                                                     VOCAB).contiguous(),
        "weight padded every call (before)": lambda: gemm.linear(x, gemm.pad_rows(w), None,
                                                                 VOCAB),
    }
    print(f"LM head alone, [{tokens}, 768] x [768, {VOCAB}] bf16 "
          f"(padded result strides {list(padded.stride())}):")
    for name, fn in variants.items():
        print(f"  {name:40} {ms(fn):8.3f} ms   kernels: {kernels_of(fn)}")


def check(got: torch.Tensor, want: torch.Tensor, label: str, strides: bool = True) -> None:
    err = ((got.float() - want.float()).norm() / want.float().norm()).item()
    if err > 2e-2 or (strides and got.stride() != want.stride()):
        raise SystemExit(f"{label}: differs from eager (relative error {err:.2e}, strides "
                         f"{got.stride()} against {want.stride()})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--layers", type=int, default=12)
    opts = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    lm_head_alone(opts.batch * opts.length)

    import_torchvision()  # transformers imports it
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=opts.layers)).to("cuda", torch.bfloat16).eval()
    tokens = torch.randint(0, VOCAB, (opts.batch, opts.length), device="cuda")
    times: dict[str, float] = {}
    with torch.no_grad():
        want = model(tokens).logits
        print("\nLM-head products as cuBLAS gets them (shape:strides):")
        print(f"  eager: {products_of(lambda: model(tokens))}")
        times["eager"] = ms(lambda: model(tokens))
        torch._dynamo.reset()
        tc = torch.compile(model)
        check(tc(tokens).logits, want, "torch.compile", strides=False)
        times["torch.compile"] = ms(lambda: tc(tokens))
        for padding in ("off", "auto"):
            label = f"minicompile gemm_padding={padding}"
            minicompile.reset()
            with config.patch(gemm_padding=padding):
                mc = minicompile.compile(model)
                check(mc(tokens).logits, want, label)
                print(f"  {label}: {products_of(lambda: mc(tokens))}")
                times[label] = ms(lambda: mc(tokens))
    print(f"\nGPT-2 small bf16 forward, {opts.batch} x {opts.length} tokens, "
          f"{opts.layers} layers (ms):")
    for label, t in times.items():
        print(f"  {label:40} {t:8.3f}")


if __name__ == "__main__":
    main()
