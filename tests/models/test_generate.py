"""Text generation on compiled models: transformers' ``generate`` (GPT-2, Llama; greedy) and
nanoGPT's decode loop (examples/gpt.py), as their users compile them.

Each loop must produce eager's tokens, for two prompts, and compile at most twice: the
prefill, and one decode step whose KV-cache length (or sequence length) is a symbol.  With
transformers' static cache the shapes never change; under ``mode="reduce-overhead"`` on a
GPU each decode step replays a CUDA graph.
"""

from __future__ import annotations

import pytest
import torch

import minicompile
from minicompile.runtime import cudagraphs

from devices import CUDA, device_for
from gpt import GPT, GPTConfig
from model_zoo import MODELS

# Tokens generated for the first prompt, then the second: 32 as users ask for, then a few to
# check the entries serve another prompt.  Under Triton's interpreter (no GPU) a decode step
# takes about half a second: fewer there, which still run the decode entry on several
# cache lengths.
def new_tokens(backend: str) -> tuple[int, int]:
    return (6, 3) if backend == "triton" and not CUDA else (32, 6)


def hf_model(name: str, device: torch.device) -> torch.nn.Module:
    torch.manual_seed(0)
    return next(c for c in MODELS if c.name == name).build().eval().to(device)


def generate(model: torch.nn.Module, ids: torch.Tensor, tokens: int,
             **options: object) -> torch.Tensor:
    """Greedy decoding of exactly ``tokens`` tokens (the zoo's end-of-text id may come up)."""
    return model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=tokens,
                          min_new_tokens=tokens, do_sample=False, pad_token_id=0, **options)


def assert_compiled_twice() -> None:
    stats = minicompile.stats()
    assert stats["graphs"] + stats["warm_entries"] == 2, stats  # prefill, decode
    assert stats["graph_breaks"] == 0 and stats["eager_fallbacks"] == 0, stats


@pytest.mark.parametrize(("name", "how"), [("hf_gpt2", "forward"), ("hf_llama", "module")])
@torch.no_grad()
def test_generate_with_dynamic_cache_compiles_twice(name: str, how: str, backend: str) -> None:
    """The default DynamicCache grows each step: the decode step is compiled with the cache
    length a symbol (it moved there from the prompt's length), so no step recompiles.
    ``how``: ``model.forward = minicompile.compile(model.forward)``, or ``.generate`` of
    ``minicompile.compile(model)``."""
    device = device_for(backend)
    model = hf_model(name, device)
    prompts = [torch.randint(1, 100, (2, 7), device=device) for _ in range(2)]
    counts = new_tokens(backend)
    wants = [generate(model, ids, n) for ids, n in zip(prompts, counts)]
    if how == "forward":
        model.forward = minicompile.compile(model.forward, backend=backend)
    else:
        model = minicompile.compile(model, backend=backend)
    for ids, n, want in zip(prompts, counts, wants):
        assert torch.equal(generate(model, ids, n), want)
    assert_compiled_twice()


@torch.no_grad()
def test_generate_with_static_cache(backend: str) -> None:
    """transformers' static cache (``cache_implementation="static"``), the forward compiled
    with ``mode="reduce-overhead"``: prefill and decode compile once each; on a GPU the
    decode step is recorded as a CUDA graph and replayed each step after, the next call's
    new cache too."""
    device = device_for(backend)
    model = hf_model("hf_llama", device)
    options = {"cache_implementation": "static", "disable_compile": True}  # not torch.compile
    calls = 2 if device.type == "cuda" else 1  # a second call's new cache: on a GPU
    prompts = [torch.randint(1, 100, (2, 7), device=device) for _ in range(calls)]
    tokens = new_tokens(backend)[0]
    wants = [generate(model, ids, tokens, **options) for ids in prompts]
    model.forward = minicompile.compile(model.forward, backend=backend, mode="reduce-overhead")
    for ids, want in zip(prompts, wants):
        assert torch.equal(generate(model, ids, tokens, **options), want)
    assert_compiled_twice()
    # The cache update (index_copy_ of keys and values, each layer) runs in place on the
    # cache: no out-of-place copy of the cache, and rebuild's write-back copies nothing.
    source = model.forward.entries[0].artefact[0].module_path.read_text()
    layers = model.config.num_hidden_layers
    assert source.count("torch.Tensor.index_copy_(") == 2 * layers, source
    assert "torch.Tensor.index_copy(" not in source
    if device.type == "cuda":
        decode = model.forward.entries[0].call  # the newest entry: the decode step
        assert isinstance(decode, cudagraphs.GraphedCall), decode
        assert decode.off is None and len(decode.recorded) == 1


@torch.no_grad()
def test_nanogpt_generate_compiles_twice(backend: str) -> None:
    """nanoGPT's loop feeds a sequence one token longer each step (examples/gpt.py):
    ``minicompile.compile(model).generate`` compiles the first length static, the second
    with the length a symbol, and then no more (within the block size: a cropped sequence
    is a view whose stride changes each step, and strides are not yet symbols)."""
    device = device_for(backend)
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=32, vocab_size=64, n_layer=1, n_embd=32)).to(device).eval()
    compiled = minicompile.compile(model, backend=backend)
    for seed in (1, 2):
        torch.manual_seed(seed)
        idx = torch.randint(0, 64, (2, 5), device=device)
        assert torch.equal(compiled.generate(idx, 8), model.generate(idx, 8))
    assert_compiled_twice()
