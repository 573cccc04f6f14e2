"""Attention masks computed from no input (passes/attention_masks.py): folded where they
mask nothing or are the causal mask, kept otherwise; every compiled function checked
against eager, twice with fresh inputs."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import minicompile
from minicompile.passes import attention_masks, pipeline


def all_true(q, k, v):  # noqa: ANN001, ANN201 (transformers' padding mask without padding)
    b, _, l, _ = q.shape
    ones = torch.ones(b, k.shape[-2], dtype=torch.bool, device=q.device)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=ones[:, None, None, :].expand(
        b, 1, l, k.shape[-2]))


def causal_bool(q, k, v):  # noqa: ANN001, ANN201 (transformers' causal mask)
    i = torch.arange(q.shape[-2], device=q.device)
    mask = (i[None, :] <= i[:, None])[None, None]
    return F.scaled_dot_product_attention(q, k, v, mask, 0.0, False) * 2


def causal_float(q, k, v):  # noqa: ANN001, ANN201
    n = q.shape[-2]
    mask = torch.full((n, n), torch.finfo(q.dtype).min, device=q.device).triu(1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def causal_shared(q, k, v):  # noqa: ANN001, ANN201 (the mask is also a result: computed)
    n = q.shape[-2]
    mask = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask), mask


def padded(q, k, v):  # noqa: ANN001, ANN201 (the last key masked: a real mask)
    mask = torch.ones(k.shape[-2], dtype=torch.bool, device=q.device)
    mask[-1] = False
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask[None, :])


def bias(q, k, v):  # noqa: ANN001, ANN201 (an additive bias, not a mask)
    n = q.shape[-2]
    b = torch.arange(n * n, dtype=q.dtype, device=q.device).reshape(n, n) / (n * n)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=b)


def from_input(q, k, v, m):  # noqa: ANN001, ANN201
    return F.scaled_dot_product_attention(q, k, v, attn_mask=m)


CASES = [(all_true, "none"), (causal_bool, "causal"), (causal_float, "causal"),
         (causal_shared, "causal"), (padded, None), (bias, None)]


@pytest.fixture
def folded(monkeypatch):  # noqa: ANN001, ANN201
    """The attention calls of each graph after the fold: (attn_mask, is_causal)."""
    seen: list = []

    def spy(graph):  # noqa: ANN001, ANN202
        out = attention_masks.fold_attention_masks(graph)
        seen.extend((n.kwargs.get("attn_mask", n.args[3] if len(n.args) > 3 else None),
                     n.kwargs.get("is_causal", n.args[5] if len(n.args) > 5 else False),
                     graph.shapes is not None)
                    for n in out.calls() if n.target == attention_masks.SDPA)
        return out

    monkeypatch.setattr(pipeline, "GRAPH_PASSES", (spy, *pipeline.GRAPH_PASSES[1:]))
    return seen


def inputs(device: torch.device, queries: int = 6, keys: int = 6) -> tuple:
    return (torch.randn(2, 3, queries, 8, device=device),
            torch.randn(2, 3, keys, 8, device=device), torch.randn(2, 3, keys, 8, device=device))


@pytest.mark.parametrize("fn, kind", CASES, ids=[f.__name__ for f, _ in CASES])
def test_constant_masks_fold_and_others_stay(fn, kind, backend: str, device: torch.device,
                                             folded: list) -> None:
    compiled = minicompile.compile(fn, backend=backend)
    for _ in range(2):
        args = inputs(device)
        torch.testing.assert_close(compiled(*args), fn(*args))
    assert len(folded) == 1
    mask, causal, _ = folded[0]
    if kind is None:
        assert mask is not None and causal is False
    else:
        assert mask is None and causal == (kind == "causal")


def test_a_lower_triangle_with_more_keys_is_not_the_causal_mask(backend: str, device,
                                                                folded: list) -> None:
    """sdpa's is_causal aligns the triangle top-left; with 4 queries and 6 keys a mask of
    the queries' triangle padded with True is another mask: kept."""
    def fn(q, k, v):  # noqa: ANN001, ANN202
        i = torch.arange(q.shape[-2], device=q.device)
        mask = torch.cat([i[None, :] <= i[:, None],
                          torch.ones(q.shape[-2], 2, dtype=torch.bool, device=q.device)], 1)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    compiled = minicompile.compile(fn, backend=backend)
    for _ in range(2):
        args = inputs(device, 4, 6)
        torch.testing.assert_close(compiled(*args), fn(*args))
    assert folded[0][0] is not None


def test_masks_from_inputs_or_dynamic_sizes_stay(backend: str, device, folded: list) -> None:
    compiled = minicompile.compile(from_input, backend=backend)
    for _ in range(2):
        args = (*inputs(device), torch.ones(6, 6, dtype=torch.bool, device=device))
        torch.testing.assert_close(compiled(*args), from_input(*args))
    assert folded[-1][0] is not None
    del folded[:]
    dynamic = minicompile.compile(causal_bool, backend=backend, dynamic=True)
    for n in (5, 7):
        args = inputs(device, n, n)
        torch.testing.assert_close(dynamic(*args), causal_bool(*args))
    # A graph over symbolic sizes keeps its mask.  (On CUDA, attention's layout rules need
    # static sizes: each size is a graph of its own, folded.)
    assert all(mask is not None for mask, _, symbolic in folded if symbolic)
    assert device.type == "cuda" or any(symbolic for _, _, symbolic in folded)
