"""What a kernel or library call moves and computes, and what the device can do: the two
sides of the roofline that ``MINICOMPILE_LOGS=profile`` (runtime/profile.py) reports.  The
device's limits are measured once per process, device and dtype (a large copy, a large
square matmul), never looked up in a table.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable
from typing import Any

import torch

# Matrix products: the position of the left operand (its last dim is the contraction).
GEMMS = {"mm": 0, "matmul": 0, "bmm": 0, "linear": 0, "addmm": 1, "baddbmm": 1}
COPY_BYTES = {"cpu": 2**26, "cuda": 2**28}  # each side of the measured copy
MATMUL_SIZE = {"cpu": 1024, "cuda": 8192}  # n of the measured n x n x n matmul


def library_op(op: str, args: tuple) -> tuple[str, tuple]:
    """The library function and arguments of a call (training's ``record`` runs another)."""
    if op.endswith(".record") and args and isinstance(args[0], str):
        return args[0], args[3:]
    return op, args


def tensors_of(value: Any) -> list[torch.Tensor]:
    """The tensors in ``value`` (nested tuples, lists and dicts), each once."""
    # (imported here: it imports sympy, which `import minicompile` does not)
    from minicompile.runtime.autograd import flatten

    found: list[torch.Tensor] = []
    flatten(value, found)
    return list({id(t): t for t in found}.values())


def moved_bytes(*values: Any) -> int:
    """Bytes read and written by a step handed and making the tensors in ``values``."""
    return sum(t.numel() * t.element_size() for t in tensors_of(values))


def flops(op: str, result: Any, args: tuple, kwargs: dict) -> tuple[int, torch.dtype] | None:
    """A matrix product's, convolution's or attention's FLOPs and dtype; None for other calls."""
    base = op.rsplit(".", 1)[-1]
    out = next(iter(tensors_of(result)), None)
    operands = [a for a in args if isinstance(a, torch.Tensor)]
    operands += [v for v in kwargs.values() if isinstance(v, torch.Tensor)]
    if out is None or len(operands) < 2:
        return None
    if base in GEMMS:
        left = args[GEMMS[base]] if len(args) > GEMMS[base] else operands[0]
        if not isinstance(left, torch.Tensor) or left.dim() == 0:
            return None
        return 2 * out.numel() * left.shape[-1], left.dtype
    x, w = operands[0], operands[1]
    if base.startswith("conv") and w.dim() >= 3:
        per_point = w.shape[1] * math.prod(w.shape[2:])  # (in or out channels / groups) x kernel
        transposed = "transpose" in base or base == "convolution" and len(args) > 6 and args[6]
        points = x.numel() if transposed else out.numel()
        return 2 * points * per_point, x.dtype
    if base == "scaled_dot_product_attention" and len(operands) >= 3 and x.dim() >= 2:
        q, k, v = operands[:3]
        rows = q.numel() // max(q.shape[-1], 1)
        return 2 * rows * k.shape[-2] * (q.shape[-1] + v.shape[-1]), q.dtype
    return None


def _seconds(fn: Callable[[], Any], device: torch.device, reps: int) -> float:
    """The best time of ``fn`` over ``reps`` runs after one warm-up run."""
    fn()
    best = math.inf
    for _ in range(reps):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize(device)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize(device)
            best = min(best, start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - t0)
    return best


@functools.cache
def copy_bandwidth(device: torch.device) -> float:
    """Bytes per second (read + written) of a large copy on ``device``, measured once."""
    n = COPY_BYTES.get(device.type, COPY_BYTES["cpu"])
    src = torch.empty(n, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    return 2 * n / _seconds(lambda: dst.copy_(src), device, 4)


@functools.cache
def peak_flops(device: torch.device, dtype: torch.dtype) -> float | None:
    """FLOP/s of a large square matmul in ``dtype`` on ``device``, once (None: no such matmul)."""
    if not dtype.is_floating_point:
        return None
    n = matmul_size(device, dtype)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    try:
        return 2 * n**3 / _seconds(lambda: torch.mm(a, b), device, 3)
    except RuntimeError:  # (no kernel for this dtype on this device)
        return None


def matmul_size(device: torch.device, dtype: torch.dtype) -> int:
    """n of the n x n x n matmul measuring the peak: smaller for the CPU's slow dtypes."""
    n = MATMUL_SIZE.get(device.type, MATMUL_SIZE["cpu"])
    slow = device.type != "cuda" and dtype not in (torch.float32, torch.float64)
    return n // 2 if slow else n
