"""The nanoGPT-style CausalSelfAttention module, compiled as a whole module and timed.

    python examples/causal_self_attention.py
    MINICOMPILE_TRACE=1 python examples/causal_self_attention.py   # the kernels

The linear layers and scaled_dot_product_attention (FlashAttention-2 on the GPU) are
library calls; the pointwise and view work around them is fused into kernels.
"""

import torch

import minicompile
from gpt import CausalSelfAttention, GPTConfig
from timing import median_seconds


def main() -> None:
    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    dtype = torch.bfloat16 if cuda else torch.float32
    config = GPTConfig(n_embd=768 if cuda else 256, n_head=12 if cuda else 4)
    B, T = (16, 1024) if cuda else (4, 128)
    model = CausalSelfAttention(config).to(device, dtype).eval()
    compiled = minicompile.compile(model)
    x = torch.randn(B, T, config.n_embd, device=device, dtype=dtype)
    with torch.no_grad():
        for _ in range(2):
            x = torch.randn_like(x)
            tol = dict(rtol=2e-2, atol=2e-2) if dtype == torch.bfloat16 else {}
            torch.testing.assert_close(compiled(x), model(x), **tol)
        eager_s = median_seconds(lambda: model(x), cuda)
        mc_s = median_seconds(lambda: compiled(x), cuda)
    print(f"CausalSelfAttention B={B} T={T} C={config.n_embd} {dtype} on {device}: "
          f"matches eager")
    print(f"eager {eager_s * 1e3:.3f} ms   minicompile {mc_s * 1e3:.3f} ms")
    print(f"stats: {minicompile.stats()}")


if __name__ == "__main__":
    main()
