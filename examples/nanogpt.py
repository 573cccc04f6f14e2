"""A small GPT forward pass (nanoGPT-style), compiled as a whole module.

    python examples/nanogpt.py
    MINICOMPILE_TRACE=1 python examples/nanogpt.py   # matmuls are library calls, the rest fused
"""

import torch

import minicompile
from gpt import GPT, GPTConfig
from timing import median_seconds


def main() -> None:
    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    torch.manual_seed(0)
    config = GPTConfig(n_layer=4 if cuda else 2, n_embd=256 if cuda else 128)
    model = GPT(config).to(device).eval()
    compiled = minicompile.compile(model)
    idx = torch.randint(0, config.vocab_size, (8, config.block_size), device=device)
    with torch.no_grad():
        torch.testing.assert_close(compiled(idx), model(idx), rtol=1e-4, atol=1e-4)
        eager_s = median_seconds(lambda: model(idx), cuda)
        mc_s = median_seconds(lambda: compiled(idx), cuda)
    s = minicompile.stats()
    print(f"GPT forward ({config.n_layer} layers, {config.n_embd} wide) on {device}: matches eager")
    print(f"eager {eager_s * 1e3:.3f} ms   minicompile {mc_s * 1e3:.3f} ms")
    print(f"graphs {s['graphs']}, kernels {s['kernels']}, graph breaks {s['graph_breaks']}, "
          f"eager fallbacks {s['eager_fallbacks']}")
    if s["eager_fallbacks"] or s["graph_breaks"]:
        raise SystemExit("the model did not compile as one graph: see MINICOMPILE_LOGS=graph_breaks")


if __name__ == "__main__":
    main()
