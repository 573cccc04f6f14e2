"""The cases of the differential suite: user functions over torch ops, and their inputs.

Each :class:`OpCase` is a function written as a user writes it (``torch.sin(x)``,
``x.sin()``, ``x + 2``, ``2 - x``, ``F.gelu(x, approximate="tanh")``) and a generator of
sample inputs.  The generator draws FRESH random values on every call, so a compiled
function that baked its first inputs into the code is caught.  Inputs stay within each
op's domain: positive for log/sqrt/rsqrt, non-zero divisors for integer division.
Non-contiguous inputs (transposed, sliced with a step) are made here, outside the
compiled function.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F

f32, f16, bf16 = torch.float32, torch.float16, torch.bfloat16
i32, i64, b8 = torch.int32, torch.int64, torch.bool
FLOATS = (f32, f16, bf16)
SHORT = {f32: "f32", f16: "f16", bf16: "bf16", i32: "i32", i64: "i64", b8: "b8"}

Sampler = Callable[[torch.device], tuple]


@dataclasses.dataclass(frozen=True)
class OpCase:
    name: str
    fn: Callable[..., Any]
    sample: Sampler  # device -> fresh arguments for fn
    # Bitwise equal to eager: casts, and single correctly rounded ops (+ - * /) whose
    # float16/bfloat16 forms compute in float32 and round once, exactly as eager does.
    exact: bool = False
    # Per-dtype tolerances that replace the suite's defaults for this case (reductions
    # accumulate in another order than eager's kernels: a few ulps of the result's dtype).
    tol: dict[torch.dtype, dict[str, float]] | None = None

    def __repr__(self) -> str:
        return self.name


# -- input makers ------------------------------------------------------------------------


def rand(shape: Sequence[int], dtype: torch.dtype = f32, kind: str = "any") -> Callable:
    """A maker of fresh tensors: ``kind`` is "any", "pos" (in [0.1, 2.1)), "nonzero"
    (bounded away from 0, both signs), "small_int" (integer-valued, so == finds equal
    pairs), "nan" (some NaNs) or "unit" (in (-0.9, 0.9))."""

    def make(device: torch.device) -> torch.Tensor:
        shape_ = tuple(shape)
        if dtype == b8:
            return torch.randint(0, 2, shape_, device=device).bool()
        if not dtype.is_floating_point:
            if kind == "nonzero":
                mag = torch.randint(1, 10, shape_, device=device)
                sign = torch.randint(0, 2, shape_, device=device) * 2 - 1
                return (mag * sign).to(dtype)
            if kind == "pos":
                return torch.randint(1, 10, shape_, device=device).to(dtype)
            return torch.randint(-9, 10, shape_, device=device).to(dtype)
        if kind == "pos":
            t = torch.rand(shape_, device=device) * 2 + 0.1
        elif kind == "nonzero":
            mag = torch.rand(shape_, device=device) + 0.5
            sign = torch.randint(0, 2, shape_, device=device) * 2 - 1
            t = mag * sign
        elif kind == "small_int":
            t = torch.randint(-3, 4, shape_, device=device).float()
        elif kind == "unit":
            t = torch.rand(shape_, device=device) * 1.8 - 0.9
        else:
            t = torch.randn(shape_, device=device) * 2
            if kind == "nan":
                t[torch.rand(shape_, device=device) < 0.2] = float("nan")
        return t.to(dtype)

    return make


def transposed(shape: Sequence[int], dtype: torch.dtype = f32, kind: str = "any") -> Callable:
    """A fresh tensor of ``shape`` whose memory is column-major (``t.T`` of a contiguous)."""
    inner = rand(tuple(reversed(shape)), dtype, kind)
    return lambda device: inner(device).T


def strided(shape: Sequence[int], dtype: torch.dtype = f32, kind: str = "any") -> Callable:
    """A fresh ``base[:, ::2]`` view: last-dim stride 2."""
    *lead, last = shape
    inner = rand((*lead, last * 2), dtype, kind)
    return lambda device: inner(device)[..., ::2]


def offset(shape: Sequence[int], dtype: torch.dtype = f32, kind: str = "any") -> Callable:
    """A fresh ``base[1:, 2:]`` view: non-zero storage offset, padded rows."""
    a, b = shape
    inner = rand((a + 1, b + 2), dtype, kind)
    return lambda device: inner(device)[1:, 2:]


def inputs(*makers: Callable) -> Sampler:
    return lambda device: tuple(m(device) for m in makers)


S = (4, 8)  # the default shape: small, as Triton's interpreter is slow
CASES: list[OpCase] = []


def case(name: str, fn: Callable, *makers: Callable, exact: bool = False) -> None:
    CASES.append(OpCase(name, fn, inputs(*makers), exact))


# -- unary math, on every floating dtype --------------------------------------------------

UNARY: list[tuple[str, Callable, str]] = [
    ("neg", lambda x: -x, "any"),
    ("torch_neg", lambda x: torch.neg(x), "any"),
    ("abs", lambda x: torch.abs(x), "any"),
    ("abs_method", lambda x: x.abs(), "any"),
    ("exp", lambda x: torch.exp(x), "any"),
    ("log", lambda x: torch.log(x), "pos"),
    ("log1p", lambda x: torch.log1p(x), "unit"),
    ("sqrt", lambda x: x.sqrt(), "pos"),
    ("rsqrt", lambda x: torch.rsqrt(x), "pos"),
    ("sin", lambda x: torch.sin(x), "any"),
    ("sin_method", lambda x: x.sin(), "any"),
    ("cos", lambda x: torch.cos(x), "any"),
    ("tanh", lambda x: torch.tanh(x), "any"),
    ("sigmoid", lambda x: torch.sigmoid(x), "any"),
    ("sigmoid_method", lambda x: x.sigmoid(), "any"),
    ("relu", lambda x: torch.relu(x), "any"),
    ("F_relu", lambda x: F.relu(x), "any"),
    ("gelu", lambda x: F.gelu(x), "any"),
    ("gelu_tanh", lambda x: F.gelu(x, approximate="tanh"), "any"),
    ("silu", lambda x: F.silu(x), "any"),
    ("hardswish", lambda x: F.hardswish(x * 4), "any"),
    ("hardsigmoid", lambda x: F.hardsigmoid(x * 4), "any"),
    ("relu6", lambda x: F.relu6(x * 8), "any"),
    ("erf", lambda x: torch.erf(x), "any"),
    ("atan", lambda x: torch.atan(x), "any"),
]
for _name, _fn, _kind in UNARY:
    for _dt in FLOATS:
        case(f"{_name}_{SHORT[_dt]}", _fn, rand(S, _dt, _kind))
for _dt in (i32, i64):
    case(f"neg_{SHORT[_dt]}", lambda x: -x, rand(S, _dt))
    case(f"abs_{SHORT[_dt]}", lambda x: torch.abs(x), rand(S, _dt))
    case(f"relu_{SHORT[_dt]}", lambda x: torch.relu(x), rand(S, _dt))
# Integer inputs to float-only math promote to the default float dtype.
case("sin_of_i64", lambda x: torch.sin(x), rand(S, i64))
case("sqrt_of_i32", lambda x: torch.sqrt(x), rand(S, i32, "pos"))
case("sigmoid_f32_nan", lambda x: torch.sigmoid(x), rand(S, f32, "nan"))
case("relu_f32_nan", lambda x: torch.relu(x), rand(S, f32, "nan"))

# -- binary arithmetic --------------------------------------------------------------------

for _dt in (f32, f16, bf16, i32, i64):
    _t = SHORT[_dt]
    case(f"add_{_t}", lambda x, y: x + y, rand(S, _dt), rand(S, _dt), exact=True)
    case(f"sub_{_t}", lambda x, y: torch.sub(x, y), rand(S, _dt), rand(S, _dt), exact=True)
    case(f"mul_{_t}", lambda x, y: x.mul(y), rand(S, _dt), rand(S, _dt), exact=True)
    case(f"add_int_scalar_{_t}", lambda x: x + 2, rand(S, _dt))
    case(f"rsub_int_scalar_{_t}", lambda x: 2 - x, rand(S, _dt))
    case(f"mul_float_scalar_{_t}", lambda x: x * 1.5, rand(S, _dt))
    case(f"radd_float_scalar_{_t}", lambda x: 0.25 + x, rand(S, _dt))
for _dt in (f32, f16, bf16):
    _t = SHORT[_dt]
    case(f"truediv_{_t}", lambda x, y: x / y, rand(S, _dt), rand(S, _dt, "nonzero"),
         exact=True)
    case(f"rtruediv_scalar_{_t}", lambda x: 3 / x, rand(S, _dt, "nonzero"))
case("torch_add_alpha_f32", lambda x, y: torch.add(x, y, alpha=2), rand(S), rand(S))
case("add_bool", lambda x, y: x + y, rand(S, b8), rand(S, b8))
case("mul_bool", lambda x, y: x * y, rand(S, b8), rand(S, b8))
case("truediv_i64", lambda x, y: x / y, rand(S, i64), rand(S, i64, "nonzero"))
case("truediv_i32_scalar", lambda x: x / 4, rand(S, i32))
case("torch_div_f32", lambda x, y: torch.div(x, y), rand(S), rand(S, f32, "nonzero"))
# Floor division: `//` and torch.div(rounding_mode="floor"), with negative operands.
case("floordiv_f32", lambda x, y: x // y, rand(S), rand(S, f32, "nonzero"))
case("floordiv_f16", lambda x, y: x // y, rand(S, f16), rand(S, f16, "nonzero"))
case("floordiv_i32", lambda x, y: x // y, rand(S, i32), rand(S, i32, "nonzero"))
case("floordiv_i64", lambda x, y: x // y, rand(S, i64), rand(S, i64, "nonzero"))
case("floordiv_i64_scalar", lambda x: x // 3, rand(S, i64))
case("floordiv_f32_scalar", lambda x: x // 0.7, rand(S))
case("div_floor_f32", lambda x, y: torch.div(x, y, rounding_mode="floor"),
     rand(S), rand(S, f32, "nonzero"))
case("div_floor_i64", lambda x, y: torch.div(x, y, rounding_mode="floor"),
     rand(S, i64), rand(S, i64, "nonzero"))
case("remainder_f32", lambda x, y: x % y, rand(S), rand(S, f32, "nonzero"))
case("remainder_i32", lambda x, y: x % y, rand(S, i32), rand(S, i32, "nonzero"))
# pow: tensor ** scalar, scalar ** tensor, tensor ** tensor.
for _dt in FLOATS:
    case(f"pow_square_{SHORT[_dt]}", lambda x: x**2, rand(S, _dt))
    case(f"pow_cube_{SHORT[_dt]}", lambda x: x**3.0, rand(S, _dt))
case("pow_half_f32", lambda x: x**0.5, rand(S, f32, "pos"))
case("pow_tensor_f32", lambda x, y: torch.pow(x, y), rand(S, f32, "pos"), rand(S))
case("rpow_f32", lambda x: 2**x, rand(S))
case("pow_method_f16", lambda x: x.pow(3), rand(S, f16, "unit"))
case("pow_i64", lambda x: x**2, rand(S, i64))
case("pow_i32_tensor_exp", lambda x, y: x**y, rand(S, i32), rand(S, i32, "small_int"))
case("pow_i64_wraps", lambda x: x**41, rand(S, i64))
# maximum / minimum, with NaN propagation.
for _dt in (f32, f16, i32):
    case(f"maximum_{SHORT[_dt]}", lambda x, y: torch.maximum(x, y), rand(S, _dt), rand(S, _dt))
    case(f"minimum_{SHORT[_dt]}", lambda x, y: torch.minimum(x, y), rand(S, _dt), rand(S, _dt))
case("maximum_nan", lambda x, y: torch.maximum(x, y), rand(S, f32, "nan"), rand(S, f32, "nan"))
case("minimum_nan", lambda x, y: torch.minimum(x, y), rand(S, f32, "nan"), rand(S, f32, "nan"))

# -- comparisons and logic ----------------------------------------------------------------

COMPARE: list[tuple[str, Callable]] = [
    ("eq", lambda x, y: x == y),
    ("ne", lambda x, y: x != y),
    ("lt", lambda x, y: x < y),
    ("le", lambda x, y: x <= y),
    ("gt", lambda x, y: x > y),
    ("ge", lambda x, y: x >= y),
]
for _name, _fn in COMPARE:
    case(f"{_name}_f32", _fn, rand(S, f32, "small_int"), rand(S, f32, "small_int"))
    case(f"{_name}_i64", _fn, rand(S, i64), rand(S, i64))
case("eq_scalar_f16", lambda x: x == 1.0, rand(S, f16, "small_int"))
case("lt_i32_float_scalar", lambda x: x < 2.5, rand(S, i32))
case("ge_scalar_left", lambda x: 0 >= x, rand(S))
case("gt_i32_vs_f16", lambda x, y: x > y, rand(S, i32), rand(S, f16))
case("ne_nan", lambda x, y: x != y, rand(S, f32, "nan"), rand(S, f32, "nan"))
case("eq_bool", lambda x, y: x == y, rand(S, b8), rand(S, b8))
case("torch_eq", lambda x, y: torch.eq(x, y), rand(S, i32), rand(S, i32))

LOGICAL: list[tuple[str, Callable]] = [
    ("logical_and", lambda x, y: torch.logical_and(x, y)),
    ("logical_or", lambda x, y: torch.logical_or(x, y)),
    ("logical_xor", lambda x, y: torch.logical_xor(x, y)),
]
for _name, _fn in LOGICAL:
    case(f"{_name}_bool", _fn, rand(S, b8), rand(S, b8))
    case(f"{_name}_f32_i32", _fn, rand(S, f32, "small_int"), rand(S, i32))
case("logical_not_bool", lambda x: torch.logical_not(x), rand(S, b8))
case("logical_not_f32", lambda x: torch.logical_not(x), rand(S, f32, "small_int"))
case("logical_not_method_i64", lambda x: x.logical_not(), rand(S, i64))
case("logical_and_method", lambda x, y: x.logical_and(y), rand(S, b8), rand(S, b8))
case("compare_and_logic", lambda x, y: torch.logical_and(x > 0, y < 0) | (x == y),
     rand(S, f32, "small_int"), rand(S, f32, "small_int"))

# -- where, clamp -------------------------------------------------------------------------

for _dt in (f32, f16, i64):
    case(f"where_{SHORT[_dt]}", lambda c, x, y: torch.where(c, x, y),
         rand(S, b8), rand(S, _dt), rand(S, _dt))
case("where_cond_from_compare", lambda x, y: torch.where(x > 0, x, y), rand(S), rand(S))
case("where_scalar_other", lambda x: torch.where(x > 0, x, 0.0), rand(S))
case("where_scalar_both", lambda x: torch.where(x > 0, 1.0, -1.0), rand(S))
case("where_method", lambda x, c, y: x.where(c, y), rand(S), rand(S, b8), rand(S))
case("where_promote", lambda c, x, y: torch.where(c, x, y), rand(S, b8), rand(S, f16), rand(S))
case("where_broadcast", lambda c, x, y: torch.where(c, x, y),
     rand((4, 1), b8), rand((1, 8)), rand(S))
for _dt in (f32, f16, bf16, i32):
    case(f"clamp_{SHORT[_dt]}", lambda x: torch.clamp(x, -1, 1), rand(S, _dt))
case("clamp_min_kw", lambda x: x.clamp(min=0.1), rand(S))
case("clamp_max_kw", lambda x: torch.clamp(x, max=-0.2), rand(S))
case("clip", lambda x: torch.clip(x, -0.5, 0.5), rand(S))
case("clamp_nan", lambda x: torch.clamp(x, -1.0, 1.0), rand(S, f32, "nan"))
case("clamp_i64_float_bounds", lambda x: torch.clamp(x, -2.5, 2.5), rand(S, i64))
case("clamp_min_gt_max", lambda x: torch.clamp(x, 1.0, -1.0), rand(S))

# -- infinities and NaN as constants: in kernels (both printers) and in library calls ------

INF = float("inf")
GLOBAL_NAN = float("nan")  # NaN is written out in the other cases: see mul_global_nan
case("clamp_min_minus_inf", lambda x: x.clamp(min=-INF), rand(S, f32, "nan"))
case("clamp_max_inf_f16", lambda x: torch.clamp(x, -1.0, INF), rand(S, f16))
case("where_minus_inf", lambda x: torch.where(x > 0, x, float("-inf")), rand(S))
case("where_nan_bf16", lambda x: torch.where(x > 0, float("nan"), x), rand(S, bf16))
case("add_inf", lambda x: (x + INF) * (x < 0), rand(S))
case("mul_nan", lambda x: x * float("nan") + x, rand(S))
case("mul_global_nan", lambda x: x * GLOBAL_NAN + x, rand(S))  # known failure: recompiles
case("full_like_inf", lambda x: torch.full_like(x, INF) - x, rand(S))
case("full_like_minus_inf_nan",
     lambda x: (torch.full_like(x, -INF), torch.full_like(x, float("nan"))), rand(S))
case("nan_to_num", lambda x: torch.nan_to_num(x / (x > 0)), rand(S, f32, "nan"))
case("nan_to_num_infinite_args",
     lambda x: torch.nan_to_num(torch.log(x), nan=0.5, posinf=INF, neginf=-INF).exp(),
     rand(S, f32, "nan"))

# -- casts --------------------------------------------------------------------------------

case("to_f16", lambda x: x.to(torch.float16), rand(S), exact=True)
case("to_bf16_method", lambda x: x.bfloat16(), rand(S), exact=True)
case("half", lambda x: x.half(), rand(S), exact=True)
case("float_of_f16", lambda x: x.float(), rand(S, f16), exact=True)
case("float_of_i64", lambda x: x.float(), rand(S, i64), exact=True)
case("float_of_bool", lambda x: x.float(), rand(S, b8), exact=True)
# Truncation toward zero, negatives included.
case("int_of_f32", lambda x: x.int(), rand(S), exact=True)
case("int_of_bf16", lambda x: x.int(), rand(S, bf16), exact=True)
case("bool_of_f32", lambda x: x.bool(), rand(S, f32, "small_int"), exact=True)
case("bool_of_i64", lambda x: x.bool(), rand(S, i64), exact=True)
case("to_i64_of_bool", lambda x: x.to(torch.int64), rand(S, b8), exact=True)
case("to_dtype_kw", lambda x: x.to(dtype=torch.float16), rand(S, i32), exact=True)
case("f16_to_bf16", lambda x: x.to(torch.bfloat16), rand(S, f16), exact=True)
case("cast_roundtrip", lambda x: x.half().float() - x, rand(S), exact=True)
case("cast_then_math", lambda x: torch.sin(x.float()) * 2, rand(S, i32))

# -- promotion between tensors ------------------------------------------------------------

case("add_f16_f32", lambda x, y: x + y, rand(S, f16), rand(S, f32))
case("mul_i32_f16", lambda x, y: x * y, rand(S, i32), rand(S, f16))
case("sub_i64_f32", lambda x, y: x - y, rand(S, i64), rand(S, f32))
case("add_bf16_f16", lambda x, y: x + y, rand(S, bf16), rand(S, f16))
case("add_i32_i64", lambda x, y: x + y, rand(S, i32), rand(S, i64))
case("mul_bool_f32", lambda x, y: x * y, rand(S, b8), rand(S))
case("add_i32_float_scalar", lambda x: x + 0.5, rand(S, i32))

# -- broadcasting, 0-dim and empty tensors -------------------------------------------------

case("broadcast_418_51", lambda x, y: x + y, rand((4, 1, 8)), rand((5, 1)))
case("broadcast_row", lambda x, y: x * y, rand(S), rand((8,)))
case("broadcast_col_f16", lambda x, y: x - y, rand((4, 1), f16), rand(S, f16))
case("broadcast_both", lambda x, y: torch.maximum(x, y), rand((4, 1)), rand((1, 8)))
case("zero_dim_sin", lambda x: torch.sin(x), rand(()))
case("zero_dim_add", lambda x, y: x + y, rand(()), rand(()))
case("zero_dim_with_tensor", lambda x, y: x * y, rand(S), rand(()))
case("zero_dim_f32_with_f16", lambda x, y: x + y, rand(S, f16), rand(()))
case("zero_dim_i64_scalar", lambda x: x * 3, rand((), i64))
case("empty_sin", lambda x: torch.sin(x), rand((0, 4)))
case("empty_add", lambda x, y: x + y, rand((0, 4)), rand((4,)))
case("empty_and_full", lambda x, y: (x.sin(), y.cos()), rand((0, 4)), rand(S))

# -- non-contiguous inputs (made outside the compiled function) -----------------------------

case("transposed_sin", lambda x: torch.sin(x), transposed((4, 8)))
case("transposed_plus_contiguous", lambda x, y: x + y, transposed((4, 8)), rand((4, 8)))
case("strided_cos", lambda x: x.cos(), strided((4, 8)))
case("strided_mul_f16", lambda x, y: x * y, strided((4, 8), f16), rand((4, 8), f16))
case("offset_exp", lambda x: torch.exp(x), offset((4, 8)))
case("offset_plus_transposed", lambda x, y: x + y, offset((4, 8)), transposed((4, 8)))
case("transposed_broadcast", lambda x, y: x * y, transposed((4, 8)), rand((8,)))
case("strided_i64_floordiv", lambda x, y: x // y, strided((4, 8), i64),
     rand((4, 8), i64, "nonzero"))

# -- fused chains, several outputs, aliases, views ------------------------------------------

case("sin_sin", lambda x: torch.sin(torch.sin(x)), rand(S))
case("sin_sin_f16", lambda x: torch.sin(torch.sin(x)), rand(S, f16))
case("tutorial_sin_plus_sin", lambda x, y: torch.sin(x) + torch.sin(y), rand(S), rand(S))
case("long_chain", lambda x: ((x * 2 + 1).sigmoid() - 0.5).abs().sqrt(), rand(S))
case("chain_bf16", lambda x, y: F.gelu(x * y + 1) - y, rand(S, bf16), rand(S, bf16))
case("chain_with_compare", lambda x: torch.where(x.abs() > 1, x.exp(), -x), rand(S))
case("two_outputs", lambda x: (x.sin(), x.cos()), rand(S))
case("two_outputs_list", lambda x, y: [x + y, x * y], rand(S), rand(S))
case("outputs_of_two_shapes", lambda x, y: (x.sin(), y.exp()), rand(S), rand((3, 5)))
case("outputs_of_two_dtypes", lambda x: (x * 2, x > 0), rand(S))


def same_output_twice(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    a = x.sin()
    return a, a


def intermediate_and_final(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    a = x * 3
    return a, a.exp()


case("same_output_twice", same_output_twice, rand(S))
case("intermediate_and_final", intermediate_and_final, rand(S))
case("return_input", lambda x: x, rand(S))
case("return_input_and_result", lambda x: (x, x.sin()), rand(S))
case("return_transposed_view", lambda x: x.T, rand(S))
case("return_permute_view", lambda x: x.permute(2, 0, 1), rand((2, 3, 4)))
case("transpose_then_sin", lambda x: x.T.sin(), rand(S))
case("transpose_plus", lambda x, y: x.T + y, rand(S), rand((8, 4)))
case("permute_mul", lambda x: x.permute(1, 2, 0) * 2, rand((2, 3, 4)))
case("permute_of_transposed_input", lambda x: x.permute(1, 0).exp(), transposed((4, 8)))
case("unsqueeze_broadcast", lambda x, y: x.unsqueeze(1) + y, rand((4,)), rand((4, 8)))
case("view_of_strided_input", lambda x: x.T, strided((4, 8)))


def by_name() -> dict[str, OpCase]:
    names = [c.name for c in CASES]
    duplicates = {n for n in names if names.count(n) > 1}
    assert not duplicates, f"duplicate case names: {sorted(duplicates)}"
    return {c.name: c for c in CASES}


def permuted(shape: Sequence[int], dims: Sequence[int]) -> Callable:
    """A fresh contiguous tensor of ``shape``, permuted by ``dims`` (made outside)."""
    inner = rand(shape)
    return lambda device: inner(device).permute(*dims)


# -- a few more layouts and sizes -----------------------------------------------------------

# Over the C++ backend's OpenMP threshold (codegen/cpp_threads.py): the parallel loop.
case("large_parallel", lambda x: x.sin() * 2, rand((200, 170)))
case("large_parallel_transposed", lambda x, y: x + y, transposed((200, 170)), rand((200, 170)))
case("permuted_3d_input", lambda x, y: x * y, permuted((2, 3, 4), (2, 0, 1)), rand((4, 2, 3)))
case("expand_view_return", lambda x: x.expand(3, 8), rand((8,)))
case("expand_then_sin", lambda x: x.expand(3, 8).sin(), rand((8,)))
case("squeeze_then_exp", lambda x: x.squeeze(1).exp(), rand((4, 1, 3)))
# An integer scalar outside int32: eager wraps it to the tensor's dtype.
case("mul_i32_big_scalar", lambda x: x * 3000000000, rand(S, i32), exact=True)
