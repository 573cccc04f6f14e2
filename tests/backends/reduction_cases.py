"""Cases of issue #4 for the differential suite: reductions, normalisations and losses.

Each case is an :class:`op_cases.OpCase`, run by ``test_reductions.py`` through the same
check as ``test_ops.py`` (fresh inputs each call, value, dtype, shape, strides and aliasing
compared with eager, no eager fallback).  Reductions are taken at several shapes: a 1-d
row, ``[4, 33]`` (a row that is not a power of two), ``[3, 5, 17]`` (inner, middle and
multiple dims), ``[2, 5000]`` (a row over 4096 elements: Triton's looped reduction), and
empty dims where eager allows them; on non-contiguous inputs made outside the function
(transposed, sliced with a step).  Views, index ops and extern kernels are in
``shape_cases.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from op_cases import SHORT, OpCase, b8, bf16, f16, f32, i32, i64, inputs, rand, strided, transposed

CASES: list[OpCase] = []

# Reductions accumulate in another order than eager's kernels (and float16/bfloat16 ones
# in float32, rounded once): a few ulps of the result dtype, more for the long rows.
RED_TOL: dict[torch.dtype, dict[str, float]] = {
    f32: dict(rtol=1e-5, atol=1e-5),
    f16: dict(rtol=5e-3, atol=5e-3),
    bf16: dict(rtol=2e-2, atol=2e-2),
}
LONG_TOL: dict[torch.dtype, dict[str, float]] = {
    f32: dict(rtol=1e-4, atol=1e-4),
    f16: dict(rtol=1e-2, atol=1e-2),
    bf16: dict(rtol=3e-2, atol=3e-2),
}

ROW, MAT, CUBE, LONG = (7,), (4, 33), (3, 5, 17), (2, 5000)
SHAPES: dict[str, tuple[int, ...]] = {"7": ROW, "4x33": MAT, "3x5x17": CUBE}


def case(name: str, fn: Callable, *makers: Callable,
         tol: dict[torch.dtype, dict[str, float]] | None = None) -> None:
    CASES.append(OpCase(name, fn, inputs(*makers), tol=RED_TOL if tol is None else tol))


# Cases whose rows are longer than a GPU's persistent Triton reduction (4096 elements):
# test_reductions.py runs them with the interpreter's limit lowered to the GPU's, so that
# the looped kernel (for roffset in range(0, rnumel, RBLOCK)) is what runs on CPU too.
LOOPED: set[str] = set()


def long_case(name: str, fn: Callable, *makers: Callable) -> None:
    LOOPED.add(name)
    case(name, fn, *makers, tol=LONG_TOL)


def near_one(shape: Sequence[int], dtype: torch.dtype = f32) -> Callable:
    """Values in [0.6, 1.4), either sign: products of a few dozen stay in range."""

    def make(device: torch.device) -> torch.Tensor:
        mag = torch.rand(tuple(shape), device=device) * 0.8 + 0.6
        sign = torch.randint(0, 2, tuple(shape), device=device) * 2 - 1
        return (mag * sign).to(dtype)

    return make


def ints(shape: Sequence[int], dtype: torch.dtype, low: int, high: int) -> Callable:
    return lambda device: torch.randint(low, high, tuple(shape), device=device).to(dtype)


def mostly(shape: Sequence[int], value: bool) -> Callable:
    """Booleans that are ``value`` 90% of the time, so any/all see both answers per row."""
    return lambda device: (torch.rand(tuple(shape), device=device) < 0.9) == value


# -- the reductions with dim / dims / keepdim / all dims -----------------------------------

REDUCTIONS: list[tuple[str, Callable, Callable, Callable]] = [
    # name, fn(x) at dim -1, fn(x, dims, keepdim), fn(x) over all dims
    ("sum", lambda x: x.sum(-1), lambda x, d, k: torch.sum(x, d, keepdim=k), lambda x: x.sum()),
    ("mean", lambda x: x.mean(-1), lambda x, d, k: x.mean(d, keepdim=k), lambda x: torch.mean(x)),
    ("amax", lambda x: x.amax(-1), lambda x, d, k: torch.amax(x, d, keepdim=k),
     lambda x: torch.amax(x)),
    ("amin", lambda x: torch.amin(x, -1), lambda x, d, k: x.amin(d, k), lambda x: x.amin()),
    ("logsumexp", lambda x: torch.logsumexp(x, -1), lambda x, d, k: x.logsumexp(d, k),
     lambda x: torch.logsumexp(x, tuple(range(x.ndim)))),
    ("norm", lambda x: x.norm(dim=-1), lambda x, d, k: torch.norm(x, dim=d, keepdim=k),
     lambda x: x.norm()),
    ("var", lambda x: x.var(-1), lambda x, d, k: torch.var(x, d, keepdim=k),
     lambda x: torch.var(x)),
    ("std", lambda x: torch.std(x, -1), lambda x, d, k: x.std(d, keepdim=k), lambda x: x.std()),
]
# Every op at every shape kind; the rarer layouts (1-d, a middle dim, a strided input) on
# one op of each way of computing (plain, opmath, two-pass, exp-shifted), to keep the suite fast.
FULL = {"sum", "amax", "var", "logsumexp"}
for _name, _last, _dims, _all in REDUCTIONS:
    for _s, _shape in SHAPES.items():
        if _name in FULL or _s != "7":
            case(f"{_name}_last_{_s}", _last, rand(_shape))
    case(f"{_name}_dim0_4x33", lambda x, f=_dims: f(x, 0, False), rand(MAT))
    case(f"{_name}_dims02_keep_3x5x17", lambda x, f=_dims: f(x, (0, 2), True), rand(CUBE))
    case(f"{_name}_all_3x5x17", _all, rand(CUBE))
    case(f"{_name}_last_transposed", _last, transposed(MAT))
    if _name in FULL:
        case(f"{_name}_dim1_keep_3x5x17", lambda x, f=_dims: f(x, 1, True), rand(CUBE))
        case(f"{_name}_dim0_strided", lambda x, f=_dims: f(x, 0, False), strided(MAT))
    case(f"{_name}_last_f16", _last, rand(MAT, f16))
    case(f"{_name}_dim0_bf16", lambda x, f=_dims: f(x, 0, False), rand(MAT, bf16))
    long_case(f"{_name}_last_long", _last, rand(LONG))
long_case("sum_long_f16", lambda x: x.sum(-1), rand(LONG, f16))
case("sum_dtype_f32_of_f16", lambda x: x.sum(-1, dtype=torch.float32), rand(MAT, f16))
long_case("mean_all_long", lambda x: x.mean(), rand(LONG))
long_case("amax_all_long_transposed", lambda x: x.amax(), transposed(LONG))

# prod: values near +-1 so that the products neither overflow nor vanish.
for _s, _shape in SHAPES.items():
    case(f"prod_last_{_s}", lambda x: x.prod(-1), near_one(_shape))
case("prod_dim0_keep", lambda x: torch.prod(x, 0, keepdim=True), near_one(MAT))
case("prod_all", lambda x: x.prod(), near_one((3, 7)))
case("prod_last_transposed", lambda x: x.prod(-1), lambda d: near_one((33, 4))(d).T)
case("prod_last_f16", lambda x: x.prod(-1), near_one(MAT, f16))
case("prod_dim0_bf16", lambda x: x.prod(0), near_one(MAT, bf16))

# max/min: the full reduction (a 0-dim tensor) and the (values, indices) forms.
for _s, _shape in SHAPES.items():
    case(f"max_full_{_s}", lambda x: torch.max(x), rand(_shape))
    case(f"min_full_{_s}", lambda x: x.min(), rand(_shape))
    case(f"max_dim_{_s}", lambda x: torch.max(x, -1), rand(_shape))
    case(f"min_dim_keep_{_s}", lambda x: x.min(0, keepdim=True), rand(_shape))
    case(f"argmax_{_s}", lambda x: torch.argmax(x, -1), rand(_shape))
    case(f"argmin_dim0_{_s}", lambda x: x.argmin(0), rand(_shape))
long_case("max_full_long", lambda x: x.max(), rand(LONG))
case("max_dim_values_indices_used", lambda x: (lambda v, i: (v * 2, i + 1))(*x.max(1)), rand(MAT))
case("max_dim_named", lambda x: x.max(dim=1).values.sin(), rand(MAT))
case("max_full_transposed", lambda x: x.max(), transposed(MAT))
case("min_full_f16", lambda x: torch.min(x), rand(MAT, f16))
case("argmax_all", lambda x: x.argmax(), rand(CUBE))
case("argmax_keepdim_transposed", lambda x: x.argmax(1, keepdim=True), transposed(MAT))
case("argmin_bf16", lambda x: torch.argmin(x, 1), rand(MAT, bf16))


def ties_and_nans(shape: Sequence[int], dtype: torch.dtype = f32, nans: bool = True) -> Callable:
    """Small integer values (many ties per row) with some NaNs, some rows all NaN."""

    def make(device: torch.device) -> torch.Tensor:
        t = torch.randint(-2, 3, tuple(shape), device=device).float()
        if nans:
            t[torch.rand(tuple(shape), device=device) < 0.15] = float("nan")
            t[0] = float("nan")
        return t.to(dtype)

    return make


# argmax/argmin and max/min(dim) are compiled natively (decompose_reductions.py): NaN is the
# extreme and ties give the first index, as eager.
case("argmax_ties_nan", lambda x: x.argmax(1), ties_and_nans(MAT))
case("argmin_ties_nan_dim0", lambda x: torch.argmin(x, 0), ties_and_nans(CUBE))
case("argmax_ties_no_nan", lambda x: (x.argmax(-1), x.argmin(-1)), ties_and_nans(CUBE, nans=False))
case("argmax_all_nan_f16", lambda x: x.argmax(), ties_and_nans(MAT, f16))
case("argmax_middle_dim_keep", lambda x: x.argmax(1, keepdim=True), rand(CUBE))
case("argmax_all_keepdim", lambda x: torch.argmax(x, keepdim=True), rand(CUBE))
case("argmin_all_transposed", lambda x: x.argmin(), transposed(MAT))
case("argmax_strided", lambda x: x.argmax(0), strided(MAT))
case("argmax_i32", lambda x: x.argmax(1), ints(MAT, i32, -3, 4))
case("argmin_i64_dim0", lambda x: x.argmin(0), ints(CUBE, i64, -3, 4))
case("argmax_size1_dim", lambda x: x.argmax(1), rand((4, 1)))
case("argmax_empty_kept_dim", lambda x: x.argmax(1), rand((0, 5)))
case("max_dim_empty_kept_dim", lambda x: torch.max(x, 1), rand((0, 5)))
case("max_dim_ties_nan", lambda x: x.max(1), ties_and_nans(MAT))
case("min_dim_ties_nan_keep", lambda x: torch.min(x, 0, keepdim=True), ties_and_nans(CUBE))
case("max_dim_bf16", lambda x: x.max(-1), ties_and_nans(MAT, bf16))
case("min_dim_i32_named", lambda x: (lambda r: (r.indices, r.values + 1))(x.min(dim=1)),
     ints(MAT, i32, -3, 4))
case("max_dim_indices_only", lambda x: x.max(0)[1] * 2, rand(CUBE))
case("argmax_of_softmax", lambda x: torch.softmax(x * 2, -1).argmax(-1), rand(MAT))
case("argmax_plus_amax", lambda x: (x.argmax(-1), x.amax(-1) + 1), rand(MAT))
long_case("argmax_long", lambda x: x.argmax(-1), ties_and_nans(LONG, f32, nans=False))
long_case("max_dim_long_nan", lambda x: x.max(-1), ties_and_nans(LONG))
case("max_full_nan", lambda x: x.max(), rand(MAT, f32, "nan"))
case("amax_last_nan", lambda x: x.amax(-1), rand(MAT, f32, "nan"))
case("sum_last_nan", lambda x: x.sum(-1), rand(MAT, f32, "nan"))

# var/std: correction and unbiased, every spelling.
for _fname, _f in (("var", torch.var), ("std", torch.std)):
    case(f"{_fname}_correction0", lambda x, f=_f: f(x, 1, correction=0), rand(MAT))
    case(f"{_fname}_correction1_keep", lambda x, f=_f: f(x, 1, correction=1, keepdim=True),
         rand(MAT))
    case(f"{_fname}_unbiased_false", lambda x, f=_f: f(x, 1, unbiased=False), rand(MAT))
    case(f"{_fname}_unbiased_true_dims", lambda x, f=_f: f(x, (0, 2), unbiased=True),
         rand(CUBE))
    case(f"{_fname}_positional_unbiased", lambda x, f=_f: f(x, False), rand(MAT))
    case(f"{_fname}_correction0_all", lambda x, f=_f: f(x, correction=0), rand(CUBE))

# Integers: sum and prod give int64, amax/amin keep the dtype, any/all give bool.
for _dt in (i32, i64):
    _t = SHORT[_dt]
    case(f"sum_last_{_t}", lambda x: x.sum(-1), rand(MAT, _dt))
    case(f"prod_last_{_t}", lambda x: x.prod(-1), ints((4, 9), _dt, -3, 4))
    case(f"amax_last_{_t}", lambda x: x.amax(-1), rand(MAT, _dt))
    case(f"any_last_{_t}", lambda x: x.any(-1), ints(MAT, _dt, 0, 2))
    case(f"all_last_{_t}", lambda x: x.all(-1),
         lambda d, dt=_dt: (torch.rand(MAT, device=d) < 0.97).to(dt))
case("sum_all_i64", lambda x: torch.sum(x), rand(CUBE, i64))
case("sum_dims_keep_i32", lambda x: x.sum((0, 2), keepdim=True), rand(CUBE, i32))
case("amin_dim0_i64", lambda x: torch.amin(x, 0), rand(MAT, i64))
case("max_full_i32", lambda x: x.max(), rand(MAT, i32))
long_case("sum_long_i64", lambda x: x.sum(-1), rand(LONG, i64))
case("sum_strided_i32", lambda x: x.sum(0), strided(MAT, i32))
case("sum_of_bool", lambda x: x.sum(-1), rand(MAT, b8))

# any / all on bool and float inputs.
for _s, _shape in SHAPES.items():
    case(f"any_last_{_s}", lambda x: x.any(-1), mostly(_shape, False))
    case(f"all_last_{_s}", lambda x: torch.all(x, -1), mostly(_shape, True))
case("any_all_dims", lambda x: x.any(), mostly(CUBE, False))
case("all_all_dims", lambda x: torch.all(x), mostly((3, 4), True))
case("any_dims_keep", lambda x: torch.any(x, (0, 2), keepdim=True), mostly(CUBE, False))
case("all_dim0_transposed", lambda x: x.all(0), lambda d: mostly((33, 4), True)(d).T)
case("any_of_f32", lambda x: (x > 3).any(-1), rand(MAT))
case("all_of_f32_values", lambda x: x.all(-1), rand(MAT, f32, "small_int"))
long_case("any_long", lambda x: x.any(-1), mostly(LONG, False))

# Empty dims: sum/prod/any/all/mean of nothing (amax/max of nothing raise in eager).
case("sum_empty_dim", lambda x: x.sum(0), rand((0, 5)))
case("sum_over_empty_row", lambda x: x.sum(1), rand((3, 0)))
case("prod_empty_dim", lambda x: x.prod(0), rand((0, 5)))
case("mean_empty_dim", lambda x: x.mean(0), rand((0, 5)))
case("any_empty", lambda x: x.any(1), rand((3, 0), b8))
case("all_empty", lambda x: x.all(1), rand((3, 0), b8))
case("amax_nonempty_dim_of_empty", lambda x: x.amax(1), rand((0, 5)))
case("sum_all_empty", lambda x: x.sum(), rand((0, 5)))

# 0-dim inputs: a row of one element.  The result is a new tensor of the reduction's dtype
# (bool for any/all, int64 for an integer sum), and dim 0 / -1 names the whole tensor.
ZERO_DIM = ()
for _name, _last, _dims, _all in REDUCTIONS:
    case(f"{_name}_0dim_all", _all, rand(ZERO_DIM))
    case(f"{_name}_0dim_dim0", lambda x, f=_dims: f(x, 0, False), rand(ZERO_DIM))
    case(f"{_name}_0dim_last_keep", lambda x, f=_dims: f(x, -1, True), rand(ZERO_DIM))
for _fname, _f in (("any", torch.any), ("all", torch.all)):
    case(f"{_fname}_0dim", lambda x, f=_f: f(x), rand(ZERO_DIM, f32, "small_int"))
    case(f"{_fname}_0dim_method", lambda x, n=_fname: getattr(x, n)(), rand(ZERO_DIM, f32,
                                                                              "small_int"))
    case(f"{_fname}_0dim_dim0", lambda x, f=_f: f(x, 0), rand(ZERO_DIM, b8))
    case(f"{_fname}_0dim_keep_method", lambda x, n=_fname: getattr(x, n)(-1, keepdim=True),
         rand(ZERO_DIM, f16, "small_int"))
    for _dt in (i32, i64):
        case(f"{_fname}_0dim_{SHORT[_dt]}", lambda x, f=_f: f(x), ints(ZERO_DIM, _dt, 0, 2))
        case(f"{_fname}_all_dims_{SHORT[_dt]}", lambda x, f=_f: f(x), ints(MAT, _dt, 0, 2))
case("sum_0dim_i32", lambda x: x.sum(), rand(ZERO_DIM, i32))
case("sum_0dim_bool_dim0", lambda x: torch.sum(x, 0), rand(ZERO_DIM, b8))
case("sum_0dim_f16", lambda x: x.sum(-1), rand(ZERO_DIM, f16))
case("prod_0dim_i64", lambda x: x.prod(), rand(ZERO_DIM, i64))
case("prod_0dim_dim0_keep", lambda x: torch.prod(x, 0, keepdim=True), rand(ZERO_DIM))
case("mean_0dim_bf16_dim0", lambda x: x.mean(0), rand(ZERO_DIM, bf16))
case("max_0dim", lambda x: x.max(), rand(ZERO_DIM))
case("max_0dim_dim0", lambda x: torch.max(x, 0), rand(ZERO_DIM))
case("min_0dim_keep", lambda x: x.min(-1, keepdim=True), rand(ZERO_DIM))
case("argmax_0dim", lambda x: x.argmax(), rand(ZERO_DIM))
case("argmax_0dim_dim0", lambda x: torch.argmax(x, 0), rand(ZERO_DIM))
case("argmin_0dim_keep", lambda x: x.argmin(-1, keepdim=True), rand(ZERO_DIM))
case("var_0dim_correction0", lambda x: x.var(correction=0), rand(ZERO_DIM))
case("std_0dim_dim0_correction0", lambda x: torch.std(x, 0, correction=0), rand(ZERO_DIM))
for _name, _f in (("softmax", F.softmax), ("log_softmax", F.log_softmax)):
    case(f"{_name}_0dim_dim0", lambda x, f=_f: f(x, 0), rand(ZERO_DIM))
    case(f"{_name}_0dim_last", lambda x, f=_f: f(x, -1), rand(ZERO_DIM))
case("sum_of_0dim_sin_plus_one", lambda x: x.sin().sum() + 1, rand(ZERO_DIM))

# p-norms (torch.norm, Tensor.norm): max/min magnitude, count of non-zeros, sum of p-th
# powers; the infinite orders print inf as a literal in the kernels of both backends.
INF = float("inf")
for _p, _pname in ((INF, "inf"), (-INF, "minus_inf"), (0, "0"), (1, "1"), (2, "2"),
                   (3.5, "3_5")):
    case(f"norm_p{_pname}_all", lambda x, p=_p: torch.norm(x, p=p), rand(MAT, f32, "small_int"))
    case(f"norm_p{_pname}_last", lambda x, p=_p: x.norm(p, dim=-1), rand(CUBE))
    case(f"norm_p{_pname}_dim0_keep", lambda x, p=_p: torch.norm(x, p, 0, keepdim=True),
         transposed(MAT))
case("norm_pinf_f16", lambda x: x.norm(INF, dim=1), rand(MAT, f16))
case("norm_p3_bf16", lambda x: x.norm(3, dim=1), rand(MAT, bf16))
case("norm_pinf_nan", lambda x: x.norm(INF, dim=1), rand(MAT, f32, "nan"))
case("norm_pinf_0dim", lambda x: torch.norm(x, INF), rand(ZERO_DIM))
# torch.linalg's functions are named linalg_vector_norm: found under their public name.
case("linalg_vector_norm_inf", lambda x: torch.linalg.vector_norm(x, ord=INF), rand(MAT))
case("linalg_vector_norm_2_last", lambda x: torch.linalg.vector_norm(x, ord=2, dim=-1),
     rand(CUBE))

# Reductions inside pointwise work (fused prologue / epilogue).
case("sum_of_sin_plus_one", lambda x: (x.sin() * 2).sum(-1) + 1, rand(MAT))
case("sum_and_amax_same_x", lambda x: (x.sum(1), x.amax(1)), rand(MAT))
case("mean_subtracted", lambda x: x - x.mean(-1, keepdim=True), rand(CUBE))
case("sum_of_product", lambda x, y: (x * y).sum(0), rand(MAT), transposed(MAT))

# -- softmax and log_softmax --------------------------------------------------------------

for _name, _f in (("softmax", F.softmax), ("log_softmax", F.log_softmax)):
    for _s, _shape in SHAPES.items():
        case(f"{_name}_last_{_s}", lambda x, f=_f: f(x, -1), rand(_shape))
    case(f"{_name}_dim0_4x33", lambda x, f=_f: f(x, 0), rand(MAT))
    case(f"{_name}_dim0_3x5x17", lambda x, f=_f: f(x, dim=0), rand(CUBE))
    case(f"{_name}_last_transposed", lambda x, f=_f: f(x, -1), transposed(MAT))
    case(f"{_name}_dim0_strided", lambda x, f=_f: f(x, 0), strided(MAT))
    case(f"{_name}_last_f16", lambda x, f=_f: f(x, -1), rand(MAT, f16))
    case(f"{_name}_dim0_bf16", lambda x, f=_f: f(x, 0), rand(MAT, bf16))
    long_case(f"{_name}_last_long", lambda x, f=_f: f(x, -1), rand(LONG))
case("softmax_method", lambda x: x.softmax(-1), rand(MAT))
case("torch_log_softmax", lambda x: torch.log_softmax(x, 1), rand(MAT))
case("softmax_dtype_f32_of_f16", lambda x: F.softmax(x, -1, dtype=torch.float32), rand(MAT, f16))
case("softmax_of_scaled", lambda x: F.softmax(x * 0.5 + 1, -1) * 3, rand(MAT))
# The C++ backend stores a reduced operand with a math function in the output that contains
# it, in the reduction's pass, and reads it back after (cpp_reduction.kept_operands).
case("softmax_nan", lambda x: F.softmax(x, -1), rand(MAT, f32, "nan"))
case("sigmoid_and_its_row_sum", lambda x: (x.sigmoid(), x.sigmoid().sum(-1)), rand(MAT))
case("exp_over_its_sum_scaled",
     lambda x: (x - x.amax(-1, True)).exp() * 3 / (x - x.amax(-1, True)).exp().sum(-1, True),
     rand(CUBE))

# -- normalisations -----------------------------------------------------------------------


def _weight(n: Sequence[int] | int, dtype: torch.dtype = f32) -> Callable:
    return rand((n,) if isinstance(n, int) else tuple(n), dtype)


case("layer_norm_last1", lambda x: F.layer_norm(x, (33,)), rand(MAT))


def _patch_merge(x: torch.Tensor) -> torch.Tensor:
    """Swin's patch merging: each 2x2 patch of [B, H, W, C] as one row of 4C."""
    b, h, w, c = x.shape
    return x.reshape(b, h // 2, 2, w // 2, 2, c).permute(0, 1, 3, 4, 2, 5).flatten(3)


# The row is read through a reshape of the reduced dim (not affine in it) while the kept
# dims merge: each loop variable stands for its dims in every index.
case("layer_norm_patch_merging", lambda x, w, b: F.layer_norm(_patch_merge(x), (64,), w, b),
     rand((2, 8, 8, 16)), rand((64,)), rand((64,)))
case("sum_patch_merging", lambda x: _patch_merge(x).sum(-1, keepdim=True) * 2,
     rand((3, 4, 6, 5)))
case("layer_norm_last1_affine", lambda x, w, b: F.layer_norm(x, (33,), w, b),
     rand(MAT), _weight(33), _weight(33))
case("layer_norm_last1_weight_only", lambda x, w: F.layer_norm(x, (17,), weight=w, eps=1e-3),
     rand(CUBE), _weight(17))
case("layer_norm_last2", lambda x: F.layer_norm(x, (5, 17)), rand(CUBE))
case("layer_norm_last2_affine", lambda x, w, b: F.layer_norm(x, x.shape[-2:], w, b),
     rand(CUBE), _weight((5, 17)), _weight((5, 17)))
case("layer_norm_1d", lambda x: F.layer_norm(x, (7,)), rand(ROW))
case("layer_norm_transposed", lambda x, w, b: F.layer_norm(x, (33,), w, b),
     transposed(MAT), _weight(33), _weight(33))
case("layer_norm_strided", lambda x: F.layer_norm(x, (33,)), strided(MAT))
case("layer_norm_f16", lambda x, w, b: F.layer_norm(x, (33,), w, b),
     rand(MAT, f16), _weight(33, f16), _weight(33, f16))
case("layer_norm_bf16", lambda x: F.layer_norm(x, (33,)), rand(MAT, bf16))
long_case("layer_norm_long", lambda x, w, b: F.layer_norm(x, (5000,), w, b),
     rand(LONG), _weight(5000), _weight(5000))
case("residual_layer_norm", lambda x, r, w, b: F.layer_norm(x + r, (33,), w, b),
     rand(MAT), rand(MAT), _weight(33), _weight(33))
# mlp_mixer's: the residual sum read transposed, kept as an output and normalised.  The C++
# backend stores it in the first pass and reads it back (cpp_reduction.kept_operands).
case("residual_transposed_layer_norm",
     lambda x, r, w, b: ((x + r.mT) * 1, F.layer_norm(x + r.mT, (33,), w, b)),
     rand((3, 5, 33)), rand((3, 33, 5)), _weight(33), _weight(33))
case("residual_transposed_rms_norm_alone",
     lambda x, r: F.rms_norm(x + r.mT, (33,)), rand((2, 7, 33)), rand((2, 33, 7)))

case("rms_norm_last1", lambda x: F.rms_norm(x, (33,)), rand(MAT))
case("rms_norm_weight", lambda x, w: F.rms_norm(x, (33,), w), rand(MAT), _weight(33))
case("rms_norm_eps", lambda x, w: F.rms_norm(x, (17,), w, eps=1e-6), rand(CUBE), _weight(17))
case("rms_norm_last2", lambda x: F.rms_norm(x, (5, 17)), rand(CUBE))
case("rms_norm_transposed", lambda x: F.rms_norm(x, (33,)), transposed(MAT))
case("rms_norm_f16", lambda x, w: F.rms_norm(x, (33,), w), rand(MAT, f16), _weight(33, f16))
case("rms_norm_bf16", lambda x: F.rms_norm(x, (33,)), rand(MAT, bf16))
long_case("rms_norm_long", lambda x: F.rms_norm(x, (5000,)), rand(LONG))
long_case("softmax_of_cat_long", lambda x, y: F.softmax(torch.cat([x, y.sin()], -1), -1),
          rand((2, 3000)), rand((2, 2000)))

case("group_norm", lambda x, w, b: F.group_norm(x, 3, w, b), rand((2, 6, 5)), _weight(6),
     _weight(6))
case("group_norm_no_affine", lambda x: F.group_norm(x, 2), rand((2, 4, 3, 3)))
case("group_norm_f16", lambda x: F.group_norm(x, 2), rand((2, 4, 5), f16))
case("group_norm_with_pointwise", lambda x: F.group_norm(x.sin(), 2).relu() * 2,
     rand((2, 4, 5)))
case("group_norm_4d_affine", lambda x, w, b: F.group_norm(x, 2, w, b, eps=1e-3),
     rand((2, 6, 3, 4)), _weight(6), _weight(6))
case("group_norm_one_group", lambda x: F.group_norm(x, 1), rand((3, 4, 5)))
case("group_norm_per_channel", lambda x, w: F.group_norm(x, 4, w), rand((2, 4, 7)), _weight(4))
case("group_norm_2d_input", lambda x: F.group_norm(x, 3), rand((5, 6)))
case("group_norm_transposed", lambda x: F.group_norm(x, 2), lambda d: rand((2, 5, 4))(d).transpose(1, 2))
case("group_norm_bf16_affine", lambda x, w, b: F.group_norm(x, 2, w, b), rand((2, 4, 5), bf16),
     _weight(4, bf16), _weight(4, bf16))


def _bn_inputs(shape: Sequence[int], dtype: torch.dtype = f32) -> list[Callable]:
    c = shape[1]
    return [rand(shape, dtype), rand((c,), dtype), rand((c,), dtype, "pos"),
            rand((c,), dtype), rand((c,), dtype)]


case("batch_norm_eval_2d", lambda x, m, v, w, b: F.batch_norm(x, m, v, w, b, training=False),
     *_bn_inputs((4, 3)))
case("batch_norm_eval_4d", lambda x, m, v, w, b: F.batch_norm(x, m, v, w, b, False, 0.1, 1e-3),
     *_bn_inputs((2, 3, 4, 5)))
case("batch_norm_eval_no_affine", lambda x, m, v: F.batch_norm(x, m, v), *_bn_inputs((2, 3, 5))[:3])
case("batch_norm_eval_f16", lambda x, m, v, w, b: F.batch_norm(x, m, v, w, b),
     *_bn_inputs((2, 3, 5), f16))
case("batch_norm_eval_transposed", lambda x, m, v: F.batch_norm(x, m, v),
     lambda d: rand((5, 3))(d).T.unsqueeze(0).expand(2, 3, 5) + 0, rand((3,)),
     rand((3,), f32, "pos"))

case("dropout_eval", lambda x: F.dropout(x, 0.5, training=False) * 2, rand(MAT))
case("dropout_eval_returned", lambda x: F.dropout(x, p=0.1, training=False), rand(MAT))

# -- losses -------------------------------------------------------------------------------

N, C = 6, 5


def targets(n: int, c: int, ignore: int | None = None) -> Callable:
    """Class indices; with ``ignore``, a third of them are ``ignore`` (never all)."""

    def make(device: torch.device) -> torch.Tensor:
        t = torch.randint(0, c, (n,), device=device)
        if ignore is not None:
            t[torch.rand(n, device=device) < 0.33] = ignore
            t[0] = 0
        return t

    return make


for _red in ("mean", "sum", "none"):
    case(f"cross_entropy_{_red}", lambda x, t, r=_red: F.cross_entropy(x, t, reduction=r),
         rand((N, C)), targets(N, C))
    case(f"cross_entropy_{_red}_ignore",
         lambda x, t, r=_red: F.cross_entropy(x, t, ignore_index=-100, reduction=r),
         rand((N, C)), targets(N, C, -100))
    case(f"nll_loss_{_red}", lambda x, t, r=_red: F.nll_loss(F.log_softmax(x, 1), t, reduction=r),
         rand((N, C)), targets(N, C))
    case(f"nll_loss_{_red}_ignore",
         lambda x, t, r=_red: F.nll_loss(F.log_softmax(x, 1), t, ignore_index=2, reduction=r),
         rand((N, C)), targets(N, C, 2))
case("cross_entropy_f16", lambda x, t: F.cross_entropy(x, t), rand((N, C), f16), targets(N, C))
case("cross_entropy_transposed_logits", lambda x, t: F.cross_entropy(x, t),
     transposed((N, C)), targets(N, C))
case("cross_entropy_3d", lambda x, t: F.cross_entropy(x, t),
     rand((2, C, 3)), lambda d: torch.randint(0, C, (2, 3), device=d))
case("nll_loss_weight", lambda x, t, w: F.nll_loss(x, t, w), rand((N, C)), targets(N, C),
     rand((C,), f32, "pos"))


def probs(shape: Sequence[int], dtype: torch.dtype = f32) -> Callable:
    """Class probabilities along dim 1 (rows of a softmax), for probability targets."""
    return lambda device: torch.softmax(torch.randn(tuple(shape), device=device), 1).to(dtype)


def all_ignored(n: int) -> Callable:
    return lambda device: torch.full((n,), -100, device=device)


_W = rand((C,), f32, "pos")
for _red in ("mean", "sum", "none"):
    case(f"cross_entropy_smoothing_{_red}",
         lambda x, t, r=_red: F.cross_entropy(x, t, reduction=r, label_smoothing=0.2),
         rand((N, C)), targets(N, C))
    case(f"cross_entropy_smoothing_weight_ignore_{_red}",
         lambda x, t, w, r=_red: F.cross_entropy(x, t, w, ignore_index=-100, reduction=r,
                                                 label_smoothing=0.1),
         rand((N, C)), targets(N, C, -100), _W)
    case(f"cross_entropy_weight_ignore_{_red}",
         lambda x, t, w, r=_red: F.cross_entropy(x, t, w, ignore_index=1, reduction=r),
         transposed((N, C)), targets(N, C, 1), _W)
    case(f"cross_entropy_probs_{_red}", lambda x, p, r=_red: F.cross_entropy(x, p, reduction=r),
         rand((N, C)), probs((N, C)))
    case(f"cross_entropy_probs_weight_smoothing_{_red}",
         lambda x, p, w, r=_red: F.cross_entropy(x, p, w, reduction=r, label_smoothing=0.3),
         transposed((N, C)), probs((N, C)), _W)
    case(f"nll_loss_weight_ignore_{_red}",
         lambda x, t, w, r=_red: F.nll_loss(x, t, w, ignore_index=3, reduction=r),
         strided((N, C)), targets(N, C, 3), _W)
    case(f"nll_loss_1d_{_red}", lambda x, t, r=_red: F.nll_loss(x, t, reduction=r),
         rand((C,)), lambda d: torch.tensor(3, device=d))
    case(f"cross_entropy_4d_weight_{_red}",
         lambda x, t, w, r=_red: F.cross_entropy(x, t, w, reduction=r),
         rand((2, C, 3, 2)), lambda d: torch.randint(0, C, (2, 3, 2), device=d), _W)
for _dt in (f16, bf16):
    _t = SHORT[_dt]
    case(f"cross_entropy_smoothing_weight_{_t}",
         lambda x, t, w: F.cross_entropy(x, t, w, label_smoothing=0.1),
         rand((N, C), _dt), targets(N, C, -100), rand((C,), _dt, "pos"))
    case(f"cross_entropy_probs_{_t}", lambda x, p: F.cross_entropy(x, p),
         rand((N, C), _dt), probs((N, C), _dt))
    case(f"nll_loss_weight_none_{_t}", lambda x, t, w: F.nll_loss(x, t, w, reduction="none"),
         rand((N, C), _dt), targets(N, C), rand((C,), _dt, "pos"))
case("cross_entropy_bf16_3d_sum", lambda x, t: F.cross_entropy(x, t, reduction="sum"),
     rand((2, C, 3), bf16), lambda d: torch.randint(0, C, (2, 3), device=d))
case("cross_entropy_1d_smoothing", lambda x, t: F.cross_entropy(x, t, label_smoothing=0.25),
     rand((C,)), lambda d: torch.tensor(1, device=d))
case("cross_entropy_1d_probs", lambda x, p: F.cross_entropy(x, p), rand((C,)),
     lambda d: torch.softmax(torch.randn(C, device=d), 0))
case("cross_entropy_3d_probs_smoothing_none",
     lambda x, p: F.cross_entropy(x, p, reduction="none", label_smoothing=0.1),
     rand((2, C, 3)), probs((2, C, 3)))
# Every target ignored: "mean" is 0/0, nan in eager too.
case("nll_loss_all_ignored_mean", lambda x, t: F.nll_loss(x, t), rand((N, C)), all_ignored(N))
case("cross_entropy_all_ignored_smoothing",
     lambda x, t: F.cross_entropy(x, t, label_smoothing=0.1), rand((N, C)), all_ignored(N))
case("cross_entropy_with_pointwise", lambda x, t: F.cross_entropy(x.sin() * 3, t) + 1,
     rand((N, C)), targets(N, C))
long_case("cross_entropy_long_rows", lambda x, t: F.cross_entropy(x, t),
          rand((2, 5000)), targets(2, 5000))
