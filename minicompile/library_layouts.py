"""The result layouts of library calls where the meta device's rule is not the real
kernel's (ops.infer_meta runs extern calls on meta tensors): convolutions (channels-last
where an operand suggests it), scaled_dot_product_attention (the kernel the device picks)
and batch_norm on CPU (the input's suggested memory format).  Fake tensors of the real
device would answer too, but a fake-tensor mode imports torch._dynamo (most of a second of
a cold start).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from minicompile import compat
from minicompile.graph import Node, TensorMeta

# Library calls whose result layout depends on the kernel the device picks.  On the meta
# device scaled_dot_product_attention takes its math path ([B, H, T, D]-contiguous output);
# on CUDA FlashAttention and the memory-efficient kernel write [B, T, H, D] memory, so the
# transpose back to [B, T, H * D] that attention modules do is free.  With static sizes
# their rules run the call itself on the real device (run_on_device), where PyTorch makes
# the choice the kernel will make; with symbolic sizes, on fake tensors of that device.
ATTENTION = frozenset({"torch.nn.functional.scaled_dot_product_attention",
                       "torch._C._nn.scaled_dot_product_attention"})
DEVICE_RULES = ATTENTION
# Convolutions: the meta device's rule always gives a contiguous result; the CPU and CUDA
# kernels give a channels-last one when the input or the weight is (see conv_layout).
CONVOLUTIONS = frozenset(f"{prefix}.conv{n}d" for prefix in ("torch.nn.functional", "torch")
                         for n in (1, 2, 3))


def conv_layout(out: Any, args: tuple, kwargs: dict[str, Any]) -> Any:
    """A convolution's result in the memory format PyTorch's kernels give it
    (``_conv_determine_backend_memory_format``): channels-last (3d) when the input or the
    weight suggests it."""
    suggest_memory_format = compat.prims_common().suggest_memory_format
    tensors = [*args[:2], kwargs.get("input"), kwargs.get("weight")]
    for fmt, ndim in ((torch.channels_last, 4), (torch.channels_last_3d, 5)):
        if isinstance(out, torch.Tensor) and out.ndim == ndim and any(
            isinstance(t, torch.Tensor) and t.ndim == ndim and suggest_memory_format(t) == fmt
            for t in tensors
        ):
            return out.contiguous(memory_format=fmt)
    return out


def uninitialised(v: Any) -> Any:
    """``v`` with each tensor's metadata made an uninitialised tensor of its layout on its
    own device (for a call whose result's values are never read)."""
    if isinstance(v, Node):
        v = v.meta
    if isinstance(v, TensorMeta):
        return torch.empty_strided(v.concrete_shape(), v.concrete_stride(), dtype=v.dtype,
                                   device=v.device, requires_grad=v.requires_grad)
    if isinstance(v, (tuple, list)):
        return type(v)(uninitialised(x) for x in v)
    return v


def run_on_device(fn: Callable[..., Any], args: tuple, kwargs: dict[str, Any]) -> Any:
    """``fn`` run on uninitialised tensors of the arguments' layouts on their own device
    (the result's values are never read), with the random state put back after it."""
    devices = [m.device for m in (getattr(v, "meta", v) for v in (*args, *kwargs.values()))
               if isinstance(m, TensorMeta) and m.device.type == "cuda"]
    with torch.random.fork_rng(devices=devices[:1]):  # a dropout draws no number here
        return fn(*uninitialised(args), **{k: uninitialised(v) for k, v in kwargs.items()})


# Library calls whose CPU kernels lay their result out by a rule the meta device does not
# follow (its rule is the CUDA kernels'): see cpu_layout.
BATCH_NORMS = frozenset({"torch.nn.functional.batch_norm", "torch.batch_norm"})
ATTENTION_ARGS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale",
                   "enable_gqa")


def cpu_layout(name: str, out: Any, args: tuple, kwargs: dict[str, Any],
                fake_args: tuple, fake_kwargs: dict[str, Any]) -> Any:
    """``out`` (the meta kernel's result) in the layout PyTorch's CPU kernel gives it:
    batch_norm, the input's suggested memory format (``batch_norm_cpu``); attention, where
    ``_fused_sdp_choice`` picks the CPU flash kernel, its layout (the query's)."""
    if name in BATCH_NORMS:
        suggest_memory_format = compat.prims_common().suggest_memory_format
        first = fake_args[0] if fake_args else fake_kwargs.get("input")
        if isinstance(first, torch.Tensor) and isinstance(out, torch.Tensor):
            return out.contiguous(memory_format=suggest_memory_format(first))
        return out
    a = dict(zip(ATTENTION_ARGS, fake_args), **fake_kwargs)
    if a.get("enable_gqa") or not isinstance(out, torch.Tensor):
        return out  # (grouped heads: the kernel's own handling, not reproduced here)
    real = dict(zip(ATTENTION_ARGS, args), **kwargs)
    q, k, v, mask = (uninitialised(real.get(n)) for n in ATTENTION_ARGS[:4])
    dropout, causal, scale = a.get("dropout_p", 0.0), a.get("is_causal", False), a.get("scale")
    from torch.nn.attention import SDPBackend

    choice = torch._fused_sdp_choice(q, k, v, mask, dropout, causal, scale=scale)
    if choice != int(SDPBackend.FLASH_ATTENTION):
        return out
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    return flash(a["query"], a["key"], a["value"], dropout, causal, attn_mask=a.get("attn_mask"),
                 scale=scale)[0]
