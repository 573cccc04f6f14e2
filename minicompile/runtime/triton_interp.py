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

from minicompile.op_table import ROWS


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


def _stand_in(function: str, how: str) -> Callable[..., tl.tensor]:
    if how == "tl":  # the interpreter has it: looked up when called (it patches tl.math)
        return lambda *args: getattr(tl.math, function)(*args)
    return _numpy(getattr(np, how))


# The stand-ins op_table's rows name for the libdevice function of their Triton template
# (sqrt with numpy: tl.math.sqrt_rn takes float32 only; numpy's is correctly rounded in
# float32 and float64 alike, as libdevice's is), and fmod, which the mc_* helpers call.
libdevice = types.SimpleNamespace(fmod=_numpy(np.fmod), **{
    row.libdevice: _stand_in(row.libdevice, row.interp) for row in ROWS if row.interp
})
