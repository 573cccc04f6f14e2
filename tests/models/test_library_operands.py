"""The layouts library calls get from compiled models: matrix products, convolutions and
attention are handed operands the library is fast on.

Every ATen matrix product (mm, addmm, bmm, baddbmm and their out= forms), convolution and
fused attention kernel that a compiled model's call reaches is recorded (a dispatch mode:
what the library is handed, after ``F.linear`` and ``torch.matmul`` have picked their
product), with the layout of each tensor it reads or writes, and checked against rules a
slow kernel cannot hide behind:

- a product's matrices (the last two dims of each operand and of its result) are dense or
  a clean transpose (one stride 1, the other at least the size along the stride-1 dim), as
  cuBLAS reads them without a copy; and a matrix of rows of 1024 elements or more that the
  compiled code made (not a parameter or an input of the model) has rows a multiple of 16
  bytes apart, or cuBLAS runs ``align1`` kernels (GPT-2's LM head, issue #28: 6.7 ms
  against 0.88 on an H200);
- a convolution's input, weight and result are dense (contiguous or channels-last);
- attention's query, key and value have a contiguous last dim and their other strides a
  multiple of 16 bytes; a mask has a contiguous last dim, unless eager's own call gets the
  same mask (T5 under transformers 5.17 builds its position bias transposed, in eager too).

The C++ backend on CPU, with ``gemm_padding="on"``: the layouts the generated code gives a
GPU (passes/gemm_padding.py pads 16-bit products there).  The zoo's models, and GPT-2 and
Llama with real vocabulary sizes, odd ones (50257, 32001), where padding pays for the copy
of the logits back to eager's strides (K = 128, more than 2^20 logits); a smaller product
whose result is returned keeps eager's rows by design.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import minicompile
from minicompile import config

from model_zoo import MODELS, ModelCase, _causal_lm_inputs

aten = torch.ops.aten
PRODUCTS = frozenset({aten.mm, aten.addmm, aten.bmm, aten.baddbmm})
CONVOLUTIONS = frozenset({aten.convolution, aten._convolution, aten.mkldnn_convolution})
ATTENTION = frozenset({aten._scaled_dot_product_flash_attention_for_cpu,
                       aten._scaled_dot_product_flash_attention,
                       aten._scaled_dot_product_efficient_attention,
                       aten._scaled_dot_product_cudnn_attention})
WIDE = 1024  # rows at least this long must be aligned
MASK = "the mask's last dim"
ALIGN_BYTES = 16


@dataclasses.dataclass(frozen=True)
class Operand:
    role: str  # "arg0", "out", "result", "attn_mask"...
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    itemsize: int
    given: bool  # a parameter or input of the model: its layout is not the compiler's


@dataclasses.dataclass(frozen=True)
class Call:
    op: str
    operands: tuple[Operand, ...]

    def __str__(self) -> str:
        return f"{self.op}(" + ", ".join(
            f"{o.role}={list(o.shape)}:{list(o.stride)}" for o in self.operands) + ")"


class LibraryCalls(TorchDispatchMode):
    """Records the library calls of the families above and the layouts of their tensors."""

    def __init__(self, given: set[int]) -> None:
        super().__init__()
        self.given = given  # storage data pointers of the model's parameters and inputs
        self.calls: list[Call] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        if func.overloadpacket in PRODUCTS | CONVOLUTIONS | ATTENTION:
            named = [(f"arg{i}", a) for i, a in enumerate(args)] + list(kwargs.items())
            outs = result if isinstance(result, (tuple, list)) else (result,)
            named += [("result", outs[0])]
            self.calls.append(Call(func.overloadpacket.__name__, tuple(
                self.operand(role, t) for role, t in named
                if isinstance(t, torch.Tensor) and t.device.type != "meta")))
        return result

    def operand(self, role: str, t: torch.Tensor) -> Operand:
        given = t.untyped_storage().data_ptr() in self.given
        return Operand(role, tuple(t.shape), tuple(t.stride()), t.element_size(), given)


def _dense(o: Operand) -> bool:
    """Non-overlapping and dense: the dims, by stride, tile memory with no gap."""
    dims = sorted((d for d, n in enumerate(o.shape) if n != 1), key=lambda d: o.stride[d])
    span = 1
    for d in dims:
        if o.stride[d] != span:
            return False
        span *= o.shape[d]
    return True


def matrix_problems(o: Operand) -> list[str]:
    """What is wrong with ``o``'s last two dims as a matrix cuBLAS reads or writes."""
    if len(o.shape) < 2 or 0 in o.shape:
        return []  # (a bias vector: read by the epilogue)
    (rows, cols), (srow, scol) = o.shape[-2:], o.stride[-2:]
    if srow == 0 or scol == 0:
        return [] if o.role == "arg0" else [f"{o.role} is broadcast"]  # (addmm's bias)
    if scol == 1 and srow >= max(1, cols):
        lead, width = srow, cols
    elif srow == 1 and scol >= max(1, rows):
        lead, width = scol, rows
    elif _dense(o):
        return []  # (a dim of size 1: either reading)
    else:
        return [f"{o.role} is neither contiguous nor a clean transpose"]
    if not o.given and width >= WIDE and (lead * o.itemsize) % ALIGN_BYTES:
        return [f"{o.role}'s leading dimension {lead} is not a multiple of {ALIGN_BYTES} bytes"]
    return []


def problems(call: Call) -> list[str]:
    found = []
    for o in call.operands:
        if call.op in {p.__name__ for p in PRODUCTS}:
            found += matrix_problems(o)
        elif call.op in {c.__name__ for c in CONVOLUTIONS}:
            if len(o.shape) > 1 and not _dense(o):
                found.append(f"{o.role} is not dense")
        elif o.role in ("arg0", "arg1", "arg2", "result") and len(o.shape) == 4:
            if o.stride[-1] != 1 or any((s * o.itemsize) % ALIGN_BYTES
                                        for s, n in zip(o.stride[:-1], o.shape) if n > 1):
                found.append(f"{o.role} has strides {list(o.stride)}")
        elif o.role == "attn_mask" and o.shape[-1] > 1 and o.stride[-1] != 1:
            found.append(f"{MASK} has stride {o.stride[-1]}")
    return found


def _gpt2_vocab_50257() -> torch.nn.Module:
    from model_report import import_torchvision

    import_torchvision()
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(GPT2Config(vocab_size=50257, n_embd=128, n_layer=1, n_head=4,
                                      n_positions=64))


def _llama_vocab_32001() -> torch.nn.Module:
    from model_report import import_torchvision

    import_torchvision()
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(LlamaConfig(vocab_size=32001, hidden_size=128, intermediate_size=256,
                                        num_hidden_layers=1, num_attention_heads=4,
                                        num_key_value_heads=2, max_position_embeddings=64))


ZOO = {c.name: c for c in MODELS}
CASES = [ZOO[n] for n in ("torchvision_resnet18", "timm_vit_tiny", "hf_bert", "hf_gpt2",
                          "hf_t5", "hf_llama")] + [
    ModelCase("hf_gpt2_vocab_50257", _gpt2_vocab_50257, _causal_lm_inputs, float_inputs=False),
    ModelCase("hf_llama_vocab_32001", _llama_vocab_32001,
              lambda device: _causal_lm_inputs(device, length=24), float_inputs=False),
]


def record(fn: Callable, model: torch.nn.Module, args: tuple, kwargs: dict) -> list[Call]:
    given = {t.untyped_storage().data_ptr() for t in (
        *model.parameters(), *model.buffers(), *args, *kwargs.values())
        if isinstance(t, torch.Tensor)}
    with LibraryCalls(given) as mode:
        fn(*args, **kwargs)
    return mode.calls


@pytest.mark.parametrize("case", CASES, ids=str)
@torch.no_grad()
def test_library_calls_get_operands_they_are_fast_on(case: ModelCase) -> None:
    torch.manual_seed(0)
    model = case.build().eval()
    with config.patch(gemm_padding="on"):
        compiled = minicompile.compile(model, backend="cpp", fullgraph=True)
        args, kwargs = case.inputs(torch.device("cpu"))
        compiled(*args, **kwargs)  # compiles: the recorded call runs the generated code
        calls = record(compiled, model, args, kwargs)
    assert calls, "no library call recorded"
    eagers = {p for call in record(model, model, args, kwargs) for p in problems(call)
              if p.startswith(MASK)}
    bad = [f"{call}: {'; '.join(p)}" for call in calls
           if (p := [q for q in problems(call) if q not in eagers])]
    assert not bad, "\n".join(bad)
