"""A small GPT forward pass (nanoGPT-style), compiled as a whole module.

    python examples/nanogpt.py
    MINICOMPILE_TRACE=1 python examples/nanogpt.py   # matmuls are library calls, the rest fused
    python examples/nanogpt.py --backends            # also torch.compile(backend="minicompile")
                                                     # beside backend="inductor": time per
                                                     # call and first call (compiling)
    python examples/nanogpt.py --generate            # GPT.generate, nanoGPT's decode loop, on
                                                     # the compiled model: eager's tokens,
                                                     # two compiles (the length a symbol)

For cold first calls, give both compilers empty caches:
``MINICOMPILE_CACHE_DIR=$(mktemp -d) TORCHINDUCTOR_CACHE_DIR=$(mktemp -d) python ...``.
"""

import argparse
import time

import torch

import minicompile
from gpt import GPT, GPTConfig
from timing import median_seconds


def first_call_seconds(fn: object, idx: torch.Tensor, cuda: bool) -> float:
    start = time.perf_counter()
    fn(idx)
    if cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - start


def compare_backends(model: torch.nn.Module, idx: torch.Tensor, cuda: bool) -> None:
    """eager, minicompile.compile, torch.compile with backend "minicompile" and
    "inductor": ms per call and the first call's seconds."""
    rows = [("eager", model)]
    rows.append(("minicompile.compile(model)", minicompile.compile(model)))
    rows.append(('torch.compile(backend="minicompile")',
                 torch.compile(model, backend="minicompile")))
    rows.append(('torch.compile(backend="inductor")', torch.compile(model)))
    want = model(idx)
    print("| | ms per call | first call s |")
    print("|---|---|---|")
    for name, fn in rows:
        first = first_call_seconds(fn, idx, cuda)
        torch.testing.assert_close(fn(idx), want, rtol=1e-4, atol=1e-4)
        ms = median_seconds(lambda: fn(idx), cuda) * 1e3
        print(f"| {name} | {ms:.3f} | {first:.2f} |")


def generate(model: torch.nn.Module, idx: torch.Tensor, new_tokens: int, cuda: bool) -> None:
    """``compiled.generate``: the loop feeds a sequence one token longer each step; the
    first length compiles static, the second makes it a symbol, and no step after that
    compiles again.  Checks eager's tokens and the compile count; prints tokens/s."""
    compiled = minicompile.compile(model)
    want = model.generate(idx, new_tokens)
    got = compiled.generate(idx, new_tokens)
    if not torch.equal(got, want):
        raise SystemExit("minicompile's tokens differ from eager's")
    compiles = minicompile.stats()["frames"]
    if compiles > 2:
        raise SystemExit(f"{compiles} compiles for one decode loop (at most 2 expected)")
    tokens = idx.shape[0] * new_tokens
    for name, fn in (("eager", model), ("minicompile", compiled)):
        s = median_seconds(lambda fn=fn: fn.generate(idx, new_tokens), cuda, reps=3)
        print(f"{name}: {tokens / s:.0f} tokens/s")
    print(f"generate: eager's {new_tokens} tokens, {compiles} compiles")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backends", action="store_true",
                        help='torch.compile(backend="minicompile") beside "inductor"')
    parser.add_argument("--generate", action="store_true",
                        help="GPT.generate on the compiled model: tokens, compiles, tokens/s")
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    torch.manual_seed(0)
    config = GPTConfig(n_layer=4 if cuda else 2, n_embd=256 if cuda else 128)
    model = GPT(config).to(device).eval()
    idx = torch.randint(0, config.vocab_size, (8, config.block_size), device=device)
    if args.generate:
        generate(model, idx[:, :8], 32, cuda)
        return
    if args.backends:
        print(f"GPT forward ({config.n_layer} layers, {config.n_embd} wide, 8 x "
              f"{config.block_size} tokens) on {device}")
        with torch.no_grad():
            compare_backends(model, idx, cuda)
        return
    compiled = minicompile.compile(model)
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
