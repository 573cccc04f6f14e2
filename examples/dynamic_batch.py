"""Dynamic shapes: one compile serves every batch size and sequence length.

    python examples/dynamic_batch.py
    MINICOMPILE_LOGS=dynamic python examples/dynamic_batch.py   # which dims became symbols

The causal self-attention module and a small MLP are called over 8 batch sizes and 3
sequence lengths, each call checked against eager.  With automatic dynamic shapes (the
default) the first call compiles static sizes; the first change of the batch size makes
the batch dimension a symbol, the first change of the sequence length makes that one a
symbol too, and every later size reuses the symbolic code.  Batch size 1 is specialised:
it gets an entry of its own, as in PyTorch.
"""

import torch
import torch.nn as nn

import minicompile
from gpt import CausalSelfAttention, GPTConfig

BATCHES = (8, 16, 3, 24, 5, 32, 2, 12)
LENGTHS = (64, 96, 40)


class MLP(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)
        self.norm = nn.LayerNorm(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


def run(name: str, model: nn.Module, width: int, device: str, dtype: torch.dtype) -> None:
    compiled = minicompile.compile(model)
    minicompile.reset()
    tol = dict(rtol=2e-2, atol=2e-2) if dtype == torch.bfloat16 else dict(rtol=1e-4, atol=1e-4)
    calls = 0
    with torch.no_grad():
        for t in LENGTHS:
            for b in BATCHES:
                x = torch.randn(b, t, width, device=device, dtype=dtype)
                torch.testing.assert_close(compiled(x), model(x), **tol)
                calls += 1
    stats = minicompile.stats()
    print(f"{name}: {calls} calls ({len(BATCHES)} batch sizes x {len(LENGTHS)} lengths), "
          f"all match eager; compiles: {stats['graphs']} "
          f"(recompiles {stats['recompiles']}, eager fallbacks {stats['eager_fallbacks']})")


def main() -> None:
    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    dtype = torch.bfloat16 if cuda else torch.float32
    torch.manual_seed(0)
    config = GPTConfig(n_embd=128, n_head=4)
    attention = CausalSelfAttention(config).to(device, dtype).eval()
    run("CausalSelfAttention", attention, config.n_embd, device, dtype)
    mlp = MLP(config.n_embd).to(device, dtype).eval()
    run("MLP", mlp, config.n_embd, device, dtype)


if __name__ == "__main__":
    main()
