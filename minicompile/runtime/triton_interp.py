"""Running generated Triton kernels on CPU tensors, under Triton's interpreter.

Triton's interpreter implements ``triton.language`` and ``tl.math`` with numpy, but not
``libdevice``, whose functions the kernels use for exact math (tanh, log1p, pow, fmod...).
:data:`libdevice` here stands in for it: the same function names, computed with numpy on the
interpreter's tensors.  Only the interpreter uses it; on a GPU kernels call the real one.
"""

from __future__ import annotations

import types
from collections.abc import Callable

import numpy as np
import triton.language as tl
from triton.runtime.interpreter import TensorHandle


def _result_type(args: tuple) -> tl.core.base_type:
    blocks = [a.type for a in args if isinstance(a, tl.tensor) and a.type.is_block()]
    if blocks:
        return blocks[0]
    return next(a.type for a in args if isinstance(a, tl.tensor))


def _numpy(fn: Callable[..., np.ndarray]) -> Callable[..., tl.tensor]:
    def apply(*args: object) -> tl.tensor:
        tensors = [a for a in args if isinstance(a, tl.tensor)]
        dtype = tensors[0].handle.data.dtype
        data = [a.handle.data if isinstance(a, tl.tensor) else np.asarray(a, dtype) for a in args]
        ty = _result_type(args)
        out = np.asarray(fn(*data)).astype(dtype, copy=False)
        return tl.tensor(TensorHandle(out, ty.scalar), ty)

    return apply


def _nearbyint(x: np.ndarray) -> np.ndarray:
    return np.rint(x)


libdevice = types.SimpleNamespace(
    # Functions the interpreter already has, looked up when called (it patches tl.math).
    exp=lambda x: tl.math.exp(x),
    exp2=lambda x: tl.math.exp2(x),
    log=lambda x: tl.math.log(x),
    log2=lambda x: tl.math.log2(x),
    sin=lambda x: tl.math.sin(x),
    cos=lambda x: tl.math.cos(x),
    rsqrt=lambda x: tl.math.rsqrt(x),
    erf=lambda x: tl.math.erf(x),
    floor=lambda x: tl.math.floor(x),
    ceil=lambda x: tl.math.ceil(x),
    # The rest, with numpy.  (sqrt: tl.math.sqrt_rn takes float32 only; numpy's is
    # correctly rounded in float32 and float64 alike, as libdevice's is.)
    sqrt=_numpy(np.sqrt),
    tan=_numpy(np.tan),
    tanh=_numpy(np.tanh),
    expm1=_numpy(np.expm1),
    log1p=_numpy(np.log1p),
    trunc=_numpy(np.trunc),
    nearbyint=_numpy(_nearbyint),
    pow=_numpy(np.power),
    fmod=_numpy(np.fmod),
)
