"""One table for the GPU: eager / torch.compile / minicompile, side by side, from one run.

    python examples/bench_gpu.py                    # every row
    python examples/bench_gpu.py kernels overhead   # some groups: kernels, modules,
                                                    # overhead, models, train

Rows: memory-bound kernels (with the % of copy bandwidth minicompile reaches, the copy
timed in the same run), nanoGPT modules in the default mode and with
``mode="reduce-overhead"`` (CUDA graphs, beside torch.compile's), the per-call overhead of
a 16-element function, whole models in bf16 (random init: timm resnet50 and ViT-B/16,
transformers BERT-base and GPT-2 small at 16 x 512 tokens), and the GPT train step of
examples/train_nanogpt.py (6 layers, 512 wide, fp32, with AdamW).  Every compiled result is
checked against eager before it is timed.  Medians from ``triton.testing.do_bench``.
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

import minicompile
from bench_overhead import per_call_us
from gpt import GPT, CausalSelfAttention, GPTConfig
from timing import median_seconds

Row = tuple[str, Callable, tuple, int | None, str | None]  # name, fn, args, bytes, mode


def rms_norm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w


def bias_gelu(x: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.gelu(x + b)


def nbytes(*tensors: torch.Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def kernel_rows() -> list[Row]:
    def randn(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.randn(shape, device="cuda", dtype=dtype)

    x = randn(32768, 8192)
    r, rw = randn(32768, 4096, dtype=torch.bfloat16), randn(4096, dtype=torch.bfloat16)
    g, gb = randn(16384, 8192, dtype=torch.bfloat16), randn(8192, dtype=torch.bfloat16)
    p = randn(1 << 28)
    n = randn(65536, 1024)
    w, b = randn(1024), randn(1024)
    return [
        ("column sum [32768, 8192] f32", lambda t: t.sum(0), (x,), nbytes(x), None),
        ("rms_norm [32768, 4096] bf16", rms_norm, (r, rw), 2 * nbytes(r), None),
        ("bias + gelu [16384, 8192] bf16", bias_gelu, (g, gb), 2 * nbytes(g), None),
        ("sin(sin(x)) 2^28 f32", lambda t: torch.sin(torch.sin(t)), (p,), 2 * nbytes(p), None),
        ("layer_norm [65536, 1024] f32", lambda t, a, c: F.layer_norm(t, (1024,), a, c),
         (n, w, b), 2 * nbytes(n), None),
        ("softmax [65536, 1024] f32", lambda t: torch.softmax(t, -1), (n,), 2 * nbytes(n), None),
    ]


def module_rows() -> list[Row]:
    torch.manual_seed(0)
    attn = CausalSelfAttention(GPTConfig(n_embd=768, n_head=12)).cuda().half().eval()
    xa = torch.randn(32, 1024, 768, device="cuda", dtype=torch.half)
    small = CausalSelfAttention(GPTConfig(n_embd=256, n_head=4)).cuda().half().eval()
    xs = torch.randn(8, 128, 256, device="cuda", dtype=torch.half)
    gpt = GPT(GPTConfig(n_layer=4, n_embd=256, n_head=4, block_size=128)).cuda().eval()
    idx = torch.randint(0, gpt.config.vocab_size, (8, 128), device="cuda")
    rows = []
    for mode in (None, "reduce-overhead"):
        rows.append(("CausalSelfAttention B32 T1024 C768 fp16", attn, (xa,), None, mode))
        rows.append(("CausalSelfAttention B8 T128 C256 fp16", small, (xs,), None, mode))
        rows.append(("nanoGPT forward, 4 x 256, 8 x 128 tokens", gpt, (idx,), None, mode))
    return rows


def model_rows() -> list[Row]:
    import timm
    import transformers

    def bf16(m: torch.nn.Module) -> torch.nn.Module:
        return m.to("cuda", torch.bfloat16).eval()

    torch.manual_seed(0)
    images = torch.randn(32, 3, 224, 224, device="cuda", dtype=torch.bfloat16)
    tokens = torch.randint(0, 30000, (16, 512), device="cuda")
    bert = transformers.BertModel(transformers.BertConfig())
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config())
    return [
        ("timm resnet50 bf16, 32 x 224^2", bf16(timm.create_model("resnet50")), (images,),
         None, None),
        ("transformers BERT-base bf16, 16 x 512", bf16(bert), (tokens,), None, None),
        ("transformers GPT-2 small bf16, 16 x 512", bf16(gpt2), (tokens,), None, None),
        ("timm ViT-B/16 bf16, 32 x 224^2",
         bf16(timm.create_model("vit_base_patch16_224")), (images,), None, None),
    ]


def train_row() -> str:
    """The GPT (6 layers, 512 wide) train step of examples/train_nanogpt.py in fp32: forward,
    loss, backward and AdamW, each compiler wrapping the loss and the optimizer step; the
    first step's losses checked against eager's."""
    from train_nanogpt import Trainer, batches

    torch.manual_seed(0)
    config = GPTConfig(n_layer=6, n_embd=512, n_head=8, block_size=256, vocab_size=8192)
    base = GPT(config).cuda().train()
    minicompile.reset()
    torch._dynamo.reset()
    trainers = [Trainer("eager", copy.deepcopy(base)),
                Trainer("torch.compile", copy.deepcopy(base), torch.compile),
                Trainer("minicompile", copy.deepcopy(base), minicompile.compile)]
    idx, targets = batches(config, 16, "cuda", 1)[0]
    losses = [t.step(idx, targets) for t in trainers]
    torch.testing.assert_close(losses[2], losses[0], rtol=2e-4, atol=2e-4)
    times = [median_seconds(lambda t=t: t.step(idx, targets), True) * 1e3 for t in trainers]
    s = minicompile.stats()
    return (f"{'GPT 6 x 512 train step fp32, 16 x 256 (AdamW)':58} {times[0]:8.3f} "
            f"{times[1]:8.3f} {times[2]:8.3f} {times[2] / times[1]:6.2f} {'':>6} "
            f"{s['kernels']:4d} {s['graphs']:3d} {s['graph_breaks']:3d}")


def first_tensor(value: Any) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, dict) or hasattr(value, "values"):
        return first_tensor(next(iter(value.values())))
    return first_tensor(value[0])


def check(name: str, got: Any, want: Any) -> None:
    got, want = first_tensor(got), first_tensor(want)
    low = want.dtype in (torch.half, torch.bfloat16)
    got, want = got.float(), want.float()
    err = ((got - want).norm() / want.norm().clamp_min(1e-12)).item()
    if err > (2e-2 if low else 1e-4) or not torch.isfinite(got).all():
        raise SystemExit(f"{name}: minicompile differs from eager (relative error {err:.2e})")


def run_row(row: Row, copy_ms: float) -> str:
    name, fn, args, moved, mode = row
    label = f"{name}{', reduce-overhead' if mode else ''}"
    minicompile.reset()
    torch._dynamo.reset()
    mc = minicompile.compile(fn, mode=mode)
    tc = torch.compile(fn, mode=mode)
    with torch.no_grad():
        want = fn(*args)
        for _ in range(3):  # warm-up and recording under reduce-overhead
            got = mc(*args)
            check(label, got, want)
            tc(*args)
        times = [median_seconds(lambda f=f: f(*args), True) * 1e3 for f in (fn, tc, mc)]
    s = minicompile.stats()
    ratio = times[2] / times[1]
    bw = f"{100 * copy_ms * moved / COPY_BYTES / times[2]:5.0f}%" if moved else f"{'':>6}"
    return (f"{label:58} {times[0]:8.3f} {times[1]:8.3f} {times[2]:8.3f} {ratio:6.2f} {bw} "
            f"{s['kernels']:4d} {s['graphs']:3d} {s['graph_breaks']:3d}")


COPY_BYTES = 2 * 2**30  # the copy row: 1 GiB read, 1 GiB written


def main() -> None:
    groups = sys.argv[1:] or ["kernels", "modules", "overhead", "models", "train"]
    torch.backends.cuda.matmul.allow_tf32 = False
    src = torch.empty(2**28, device="cuda")
    dst = torch.empty_like(src)
    copy_ms = median_seconds(lambda: dst.copy_(src), True) * 1e3
    del src, dst
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; copy of 1 GiB: "
          f"{copy_ms:.3f} ms ({COPY_BYTES / copy_ms / 1e6:.0f} GB/s)")
    lines = []
    rows = {"kernels": kernel_rows, "modules": module_rows, "models": model_rows}
    for group in groups:
        if group == "overhead":
            x = torch.randn(16, device="cuda")
            fn = lambda t: torch.sin(t) + 1  # noqa: E731
            us = [per_call_us(f, x) for f in (fn, torch.compile(fn), minicompile.compile(fn))]
            lines.append(f"{'16-element sin(x) + 1, us per call':58} {us[0]:8.1f} {us[1]:8.1f} "
                         f"{us[2]:8.1f} {us[2] / us[1]:6.2f}")
            continue
        if group == "train":
            lines.append(train_row())
            print(lines[-1], flush=True)
            continue
        for row in rows[group]():
            lines.append(run_row(row, copy_ms))
            print(lines[-1], flush=True)
    print(f"\n{'':58} {'eager':>8} {'t.comp':>8} {'minic':>8} {'mc/tc':>6} {'%copy':>6} "
          f"{'krn':>4} {'gr':>3} {'brk':>3}   (ms)")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
