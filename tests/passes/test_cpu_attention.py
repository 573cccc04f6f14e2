"""passes/cpu_attention.py: an attention that takes a gradient on the CPU, where PyTorch
runs its flash kernel, becomes that kernel's call with its log-sum-exp kept for the
backward; every other attention stays the call it was.  (Values and gradients against
eager: tests/training/test_attention_grads.py, test_attention_decomposed.py.)"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from minicompile import ops
from minicompile.passes.cpu_attention import flash_attention_calls

from graph_builder import GraphBuilder

FLASH = "torch.ops.aten._scaled_dot_product_flash_attention_for_cpu"


def _attention(grad: bool = True, mask: torch.dtype | None = None, kv_heads: int = 3,
               **kwargs: object) -> str:
    """The graph text after the pass, of one attention over 2 x 3 heads x 7 tokens x 16."""
    b = GraphBuilder()
    q, k, v = (b.input(f"L_{n}", torch.empty(2, 3 if n == "q" else kv_heads, 7, 16,
                                             device="meta", requires_grad=grad))
               for n in "qkv")
    if mask is not None:
        kwargs["attn_mask"] = b.input("L_mask", (7, 7), mask)
    out = b(ops.extern_op(F.scaled_dot_product_attention), q, k, v, **kwargs)
    out.meta = dataclasses.replace(out.meta, requires_grad=grad)  # (as capture marks it)
    b.output(out)
    return str(flash_attention_calls(b.graph)[0])


@pytest.mark.parametrize("kwargs", [{}, {"is_causal": True}, {"scale": 0.3},
                                    {"mask": torch.bool}, {"mask": torch.float32},
                                    {"enable_gqa": True, "kv_heads": 1}],
                         ids=["plain", "causal", "scale", "bool_mask", "float_mask", "gqa"])
def test_an_attention_that_takes_a_gradient_calls_the_flash_kernel(kwargs: dict) -> None:
    text = _attention(**kwargs)
    assert f"{FLASH}(" in text and "scaled_dot_product_attention(" not in text
    assert "getitem" in text  # (the log-sum-exp, for the backward)
    assert ("where" in text) == (kwargs.get("mask") == torch.bool)  # eager's float mask


@pytest.mark.parametrize("kwargs", [{"grad": False}, {"dropout_p": 0.1}],
                         ids=["inference", "dropout"])
def test_other_attentions_stay_the_library_call(kwargs: dict) -> None:
    text = _attention(**kwargs)
    assert FLASH not in text and "scaled_dot_product_attention(" in text
