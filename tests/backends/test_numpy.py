"""NumPy code under compile, against NumPy itself.

Each case is a function written with NumPy arrays and ``np.*`` calls.  It is compiled on
each backend and called twice on fresh random inputs (the second call must reuse the
compiled code); every result must be what NumPy returns: the same Python type (an
``np.ndarray`` or the same NumPy scalar type), dtype, shape and values, and input arrays the
function mutates must end up as NumPy leaves them.  The cases compile whole (no graph
break, no eager fallback) and produce kernels.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

import minicompile

from devices import CUDA


@pytest.fixture(autouse=True)
def _cpu_arrays_under_the_interpreter(request: pytest.FixtureRequest) -> None:
    """NumPy arrays are CPU memory: the Triton backend runs their graphs under Triton's
    interpreter, which a GPU machine's test run leaves off (conftest.py), so there they run
    eagerly by design.  The GPU path is test_under_a_cuda_default_device."""
    params = getattr(request.node, "callspec", None)
    if CUDA and params is not None and params.params.get("backend") == "triton":
        pytest.skip("Triton on CPU arrays needs TRITON_INTERPRET=1 (off with a GPU)")

RTOL = {np.dtype(np.float16): 2e-3, np.dtype(np.float32): 1e-5, np.dtype(np.float64): 1e-9}


def assert_numpy_same(got: Any, want: Any, where: str = "result") -> None:
    """The same NumPy value: type, dtype, shape, values (NaNs where NumPy has them)."""
    assert type(got) is type(want), f"{where}: {type(got).__name__} != {type(want).__name__}"
    if isinstance(want, (tuple, list)):
        assert len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want)):
            assert_numpy_same(g, w, f"{where}[{i}]")
        return
    if isinstance(want, (np.ndarray, np.generic)):
        assert got.dtype == want.dtype, f"{where}: dtype {got.dtype} != {want.dtype}"
        shapes = np.shape(got), np.shape(want)
        assert shapes[0] == shapes[1], f"{where}: shape {shapes[0]} != {shapes[1]}"
        rtol = RTOL.get(want.dtype, 0)
        np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol, equal_nan=True,
                                   err_msg=where)
        return
    assert got == want, where


def rand(rng: np.random.Generator, dtype: Any, *shape: int) -> np.ndarray:
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.random(shape) > 0.5
    if dtype.kind in "iu":
        return rng.integers(-9 if dtype.kind == "i" else 0, 10, shape).astype(dtype)
    return (rng.standard_normal(shape) * 2).astype(dtype)


def nonzero(rng: np.random.Generator, dtype: Any, *shape: int) -> np.ndarray:
    a = rand(rng, dtype, *shape)
    return np.where(a == 0, 3, a).astype(dtype)


@dataclasses.dataclass
class Case:
    name: str
    fn: Callable
    inputs: Callable[[np.random.Generator], tuple]


CASES: list[Case] = []


def case(inputs: Callable[[np.random.Generator], tuple]) -> Callable[[Callable], Callable]:
    def deco(fn: Callable) -> Callable:
        CASES.append(Case(fn.__name__, fn, inputs))
        return fn

    return deco


# -- arithmetic, promotion, NumPy's division rules -------------------------------------------


@case(lambda r: (rand(r, np.float64, 4, 5), rand(r, np.int64, 5)))
def arithmetic_broadcast(a, b):
    return a * 2 + b - 1.5, (a - b) ** 2, -a


@case(lambda r: (rand(r, np.int64, 3, 4), nonzero(r, np.int64, 3, 4)))
def integer_division_rules(a, b):
    return a / b, a // b, a % b, np.floor_divide(a, 3), np.remainder(a, -4), a // -2


@case(lambda r: (rand(r, np.float32, 6), nonzero(r, np.float32, 6)))
def float_division_signs(a, b):
    return a // b, a % b, np.fmod(a, b), a / 3


@case(lambda r: (rand(r, np.int64, 7), rand(r, np.int64, 7)))
def integer_division_by_zero(a, b):
    return a // b, a % b  # NumPy: 0 where b == 0


@case(lambda r: (rand(r, np.float32, 3, 2), rand(r, np.float64, 3, 2)[0, 0],
                 rand(r, np.int32, 2), rand(r, np.bool_, 3, 2), rand(r, np.uint8, 2)))
def promotion(f32, f64_0d, i32, b, u8):
    return (f32 + 1.5, f32 * f64_0d, f32 + np.float64(2.0), i32 + 1, i32 * 2.5, b + b,
            b + 1, b * 1.5, u8 + 3, u8 + i32, f32 + i32, i32 / 2)


@case(lambda r: (rand(r, np.float64, 3, 4), rand(r, np.float64, 3, 4)))
def comparisons_and_logic(a, b):
    return a < b, (a >= 0) & (b < 1), ~(a == b), np.logical_or(a > 1, b > 1), a != 0.5


# -- ufuncs and elementwise functions --------------------------------------------------------


@case(lambda r: (rand(r, np.float32, 4, 3), rand(r, np.int64, 4, 3)))
def unary_ufuncs(a, i):
    x = np.abs(a) + 0.5
    return (np.exp(a), np.log(x), np.sqrt(x), np.abs(i), np.sqrt(i), np.sin(a), np.tanh(a),
            np.floor(a), np.sign(a), np.square(i), np.negative(a), abs(a), np.exp(i))


@case(lambda r: (rand(r, np.float64, 5, 3), rand(r, np.float32, 3)))
def maximum_minimum_where_clip(a, b):
    return (np.maximum(a, b), np.minimum(a, 0.5), np.where(a > 0, a, b),
            np.where(a > 0, 1.0, 0), np.clip(a, -1, 1), a.clip(min=0), np.clip(b, -0.5, 0.5))


@case(lambda r: (rand(r, np.float64, 4, 3), rand(r, np.float64, 3, 2), rand(r, np.float64, 3)))
def dot_matmul(a, b, v):
    return a @ b + 1, np.dot(a, v), np.dot(v, v), np.matmul(a, b), a.dot(v), v @ v


# -- reductions ------------------------------------------------------------------------------


@case(lambda r: (rand(r, np.float64, 4, 5), rand(r, np.int32, 4, 5), rand(r, np.bool_, 4, 5)))
def reductions(a, i, b):
    return (np.sum(a), a.sum(axis=0), np.sum(a, axis=1, keepdims=True), np.mean(a),
            np.mean(i, axis=0), np.sum(i), i.sum(axis=1), np.sum(b), a.max(), a.min(axis=1),
            np.max(i, axis=0, keepdims=True), np.argmax(a), a.argmin(axis=0), b.any(),
            np.all(b, axis=1), np.prod(i % 3 + 1, axis=0), a.mean(axis=(0, 1)))


@case(lambda r: (rand(r, np.float32, 6, 4), rand(r, np.int64, 6)))
def std_var(a, i):
    return (np.std(a), np.var(a, axis=0), np.std(a, ddof=1), a.var(axis=1, ddof=1, keepdims=True),
            np.std(i), np.var(i, ddof=1))


@case(lambda r: (rand(r, np.float64, 3, 4),))
def cumulative(a):
    return np.cumsum(a) * 2, np.cumsum(a, axis=1), a.cumprod(axis=0)


# -- shapes ----------------------------------------------------------------------------------


@case(lambda r: (rand(r, np.float64, 2, 3), rand(r, np.float32, 2, 3)))
def shape_functions(a, b):
    return (np.concatenate([a, b]), np.concatenate((a, b), axis=1), np.stack([a, b], axis=1),
            np.reshape(a, (3, 2)), a.reshape(-1), a.reshape(3, 2), np.transpose(a), a.T,
            np.transpose(np.expand_dims(a, 0), (2, 0, 1)), np.expand_dims(a, (0, 3)),
            np.squeeze(a[None]), np.swapaxes(a, 0, 1), a.ravel(), a.flatten(),
            np.concatenate([a, b], axis=None))


@case(lambda r: (rand(r, np.float64, 3, 4),))
def metadata(a):
    n = a.shape[0] * a.ndim + a.size
    z = np.zeros(a.shape)
    return a + n, z, a.astype(np.float32), a.astype(int), (a > 0).astype(a.dtype), len(a)


# -- making arrays ---------------------------------------------------------------------------


@case(lambda r: (rand(r, np.float32, 3, 2),))
def creation(a):
    return (np.zeros((2, 3)), np.ones(4, dtype=np.int32), np.zeros_like(a), np.ones_like(a),
            np.arange(5), np.arange(1, 2, 0.25), np.linspace(0, 1, 7), np.full((2, 2), 3),
            np.eye(3), np.array([1.0, 2.0]) * a[0], np.asarray(a) is a, np.float32(2) * a,
            np.arange(6).reshape(2, 3) + a.T, np.linspace(-1, 1, 4, endpoint=False),
            np.empty((0, 3)), np.full_like(a, 7))


# -- indexing, in-place ops ------------------------------------------------------------------


@case(lambda r: (rand(r, np.float64, 4, 5), r.integers(0, 4, 3)))
def indexing(a, idx):
    return (a[0], a[1, 2], a[1:, ::2], a[:, None, 0], a[..., 0], a[idx], a[-1, -1], a[[0, 2]],
            a[idx[0]], a[np.argmax(a[:, 0])])


@case(lambda r: (rand(r, np.float64, 4, 3), rand(r, np.int64, 3)))
def inplace_on_new_arrays(a, i):
    c = a.copy()
    c += 1
    c *= i
    c[0] = 5
    c[1:, 1] = i[:3].max()
    d = np.zeros(3, dtype=np.int64)
    d += i
    d -= 1
    view = c[2]
    view /= 2  # writes through the view into c
    return c, d, view


@case(lambda r: (rand(r, np.float64, 3, 4), rand(r, np.int64, 4)))
def mutates_inputs(a, i):
    a += 1.0
    a[0, :] = 0
    i *= 2
    return a.sum(), i


@case(lambda r: (rand(r, np.float32, 4),))
def returns_list_and_scalars(a):
    s = a.sum()
    return [a * s, s, np.float32(a.max()), float(2.0)]


# -- 0-d, empty, non-contiguous and bool inputs ----------------------------------------------


@case(lambda r: (np.array(r.standard_normal()), np.zeros((0, 3)), rand(r, np.float64, 3)))
def zero_d_and_empty(s, e, v):
    return s * v, s + 1, np.exp(s), e.sum(axis=0), e * 2, e.mean(axis=1), np.sum(e), s[()]


@case(lambda r: (rand(r, np.float64, 5, 4).T, rand(r, np.int64, 6, 3)[::2, 1:]))
def non_contiguous_inputs(t, s):
    return t + 1, t.sum(axis=0), s * t[:3, :2], s[1:, ::2], t.T @ t


@case(lambda r: (rand(r, np.bool_, 3, 4), rand(r, np.float32, 3, 4)))
def bool_arrays(m, x):
    return m & (x > 0), ~m, np.where(m, x, -x), m.sum(axis=0), m.mean(), m.astype(np.float32) * x


@case(lambda r: (np.float64(r.standard_normal()), rand(r, np.float32, 3)))
def numpy_scalar_input(s, a):
    return s * a, s + 1, np.sqrt(abs(s)), type(s).__name__


# -- NumPy and torch together ----------------------------------------------------------------


@case(lambda r: (rand(r, np.float32, 3, 2),))
def from_numpy_and_back(a):
    t = torch.from_numpy(a)
    u = (t * 2).relu()
    return u.numpy() + a, np.sum(u.numpy())


@pytest.mark.parametrize("c", CASES, ids=lambda c: c.name)
def test_matches_numpy(c: Case, backend: str) -> None:
    compiled = minicompile.compile(c.fn, backend=backend, fullgraph=True)
    for call in range(2):
        rng = np.random.default_rng(1000 * call + len(c.name))
        args = c.inputs(rng)
        eager_args = copy.deepcopy(args)
        with np.errstate(all="ignore"):
            want = c.fn(*eager_args)
        got = compiled(*args)
        assert_numpy_same(got, want, f"{c.name} call {call}")
        for k, (arg, eager_arg) in enumerate(zip(args, eager_args)):
            assert_numpy_same(arg, eager_arg, f"{c.name} call {call} input {k} afterwards")
    stats = minicompile.stats()
    assert stats["graphs"] == 1 and stats["eager_fallbacks"] == 0, stats
    assert stats["kernels"] > 0, stats


# -- graph breaks, guards, dynamic sizes -----------------------------------------------------


def _svd_norm(a):
    b = a * 2
    s = np.linalg.svd(b, compute_uv=False)
    return s.sum() + b.mean()


def test_unsupported_function_breaks_with_its_name(backend: str) -> None:
    compiled = minicompile.compile(_svd_norm, backend=backend)
    for seed in range(2):
        a = rand(np.random.default_rng(seed), np.float64, 4, 3)
        assert_numpy_same(compiled(a), _svd_norm(a))
    explained = minicompile.explain(_svd_norm)(a)
    reasons = [b.reason for b in explained.break_reasons]
    assert any("numpy.linalg.svd is not supported" in r for r in reasons), reasons
    with pytest.raises(minicompile.Unsupported, match="numpy.linalg.svd is not supported"):
        minicompile.compile(_svd_norm, fullgraph=True)(a)


def _reads_data(a):
    b = np.exp(a)
    if b.sum() > 3:  # data-dependent: a graph break, then NumPy's answer
        return b - 1
    return b + 1


def test_data_dependent_branch_breaks(backend: str) -> None:
    compiled = minicompile.compile(_reads_data, backend=backend)
    for scale in (0.01, 10.0):
        a = np.full(4, scale)
        assert_numpy_same(compiled(a), _reads_data(a))
    assert minicompile.stats()["graph_breaks"] >= 1


def _scale(a, b):
    return a * b + np.sum(a)


def test_guards_on_dtype_shape_and_strides(backend: str) -> None:
    compiled = minicompile.compile(_scale, backend=backend, dynamic=False)
    rng = np.random.default_rng(0)
    calls = [rand(rng, np.float64, 3, 4), rand(rng, np.float32, 3, 4),
             rand(rng, np.float64, 4, 3).T, rand(rng, np.float64, 3, 4), rand(rng, np.int64, 3, 4)]
    for a in calls:
        assert_numpy_same(compiled(a, 2.0), _scale(a, 2.0))
    assert minicompile.stats()["recompiles"] == 3


def test_dynamic_sizes(backend: str) -> None:
    compiled = minicompile.compile(_scale, backend=backend)
    rng = np.random.default_rng(0)
    for n in (3, 5, 7, 9):
        a = rand(rng, np.float32, n, 4)
        assert_numpy_same(compiled(a, 3), _scale(a, 3))
    assert minicompile.stats()["graphs"] <= 2


def _increment(a):
    a += 1
    return a


def test_read_only_input_raises_as_numpy_does(backend: str) -> None:
    compiled = minicompile.compile(_increment, backend=backend)
    a = np.arange(3.0)
    a.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        compiled(a)
    b = np.arange(3.0)
    assert compiled(b) is b and b.tolist() == [1.0, 2.0, 3.0]


def _two_arrays(a, b):
    a += b
    return a


def test_mutated_input_overlapping_another(backend: str) -> None:
    compiled = minicompile.compile(_two_arrays, backend=backend)
    x = np.arange(6.0)
    compiled(x[:4], np.ones(4))  # no overlap: compiled
    y, y_eager = np.arange(6.0), np.arange(6.0)
    compiled(y[:4], y[2:])
    _two_arrays(y_eager[:4], y_eager[2:])
    assert y.tolist() == y_eager.tolist()


def test_numpy_not_imported_by_capture_modules() -> None:
    """The front end imports NumPy only in the NumPy modules, loaded on first use."""
    import ast
    from pathlib import Path

    root = Path(minicompile.__file__).parent / "capture"
    for path in root.glob("*.py"):
        if path.stem.startswith("numpy_"):  # the NumPy modules themselves
            continue
        tree = ast.parse(path.read_text())
        top = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
        names = [a.name for n in top if isinstance(n, ast.Import) for a in n.names]
        names += [n.module or "" for n in top if isinstance(n, ast.ImportFrom)]
        assert not any(n.split(".")[0] == "numpy" or n.rpartition(".")[2].startswith("numpy_")
                       for n in names), path


WARM_SOURCE = """
import numpy as np

def f(a, n):
    return np.exp(a).sum(axis=0) * n, a.T, np.float32(n) * a[0, 0]
"""


def test_warm_entry_on_disk(tmp_path, backend: str) -> None:
    """A NumPy entry is stored, and a fresh process (simulated: reset()) runs it without
    capture; its helpers live in minicompile/runtime/values.py for that."""
    import sys
    import types

    from minicompile import config

    module = types.ModuleType("numpy_warm_module")
    module.__file__ = "/virtual/numpy_warm_module.py"
    sys.modules[module.__name__] = module
    exec(compile(WARM_SOURCE, module.__file__, "exec"), module.__dict__)
    try:
        with config.patch(warm_entries=True, cache_dir=tmp_path / "cache"):
            for process in ("cold", "warm"):
                minicompile.reset()
                compiled = minicompile.compile(module.f, backend=backend)
                for seed in range(2):
                    a = rand(np.random.default_rng(seed), np.float64, 3, 4)
                    assert_numpy_same(compiled(a, 2), module.f(a, 2))
                stats = minicompile.stats()
                assert stats["frames"] == (1 if process == "cold" else 0), (process, stats)
    finally:
        sys.modules.pop(module.__name__, None)


def _mixed(a, t):
    u = torch.from_numpy(a) * t  # a tensor sharing a's memory, times a tensor: traced
    b = u.numpy()
    b += 1  # writes through to u (and not to a)
    return a.sum(), u, b.mean(), np.ndarray.sort(b)  # the last: a graph break, run for real


def test_numpy_and_torch_together(backend: str) -> None:
    compiled = minicompile.compile(_mixed, backend=backend)
    for seed in range(2):
        a = rand(np.random.default_rng(seed), np.float32, 5)
        t = torch.from_numpy(rand(np.random.default_rng(seed + 7), np.float32, 5))
        got, want = compiled(a.copy(), t), _mixed(a.copy(), t)
        assert_numpy_same(got[0], want[0])
        torch.testing.assert_close(got[1], want[1])
        assert_numpy_same(got[2], want[2])
        assert got[3] is None and want[3] is None
    reasons = [b.reason for b in minicompile.explain(_mixed)(a, t).break_reasons]
    assert reasons and all("numpy.ndarray.sort" in r or "sort" in r for r in reasons), reasons


def _reversed_slices(a):
    b = a[::-1]
    a += 1  # b is a view in NumPy: it sees the change
    return b + 0, a[1:, ::-2], a[::-1, 1], a[-1:0:-1], a[5:1:-3], a[::-1][0, 0]


def _view_mutated_after_break(a):
    c = a * 2
    rows = c[1:3]
    col = a[:, 0]
    print(end="")  # a graph break: rows must stay a view of c, col of a
    rows += 1
    col *= 10
    return c, a.sum()


def _reversed_view_written_after_break(a):
    b = a[::-1]
    print(end="")
    b += 1  # a view the graph computes as a copy: that frame runs eagerly
    return a


@pytest.mark.parametrize("fn", [_reversed_slices, _view_mutated_after_break,
                                _reversed_view_written_after_break], ids=lambda f: f.__name__)
def test_views_of_arrays(fn, backend: str) -> None:
    compiled = minicompile.compile(fn, backend=backend)
    for seed in range(2):
        a = rand(np.random.default_rng(seed), np.float64, 6, 4)
        a_eager = a.copy()
        assert_numpy_same(compiled(a), fn(a_eager))
        assert_numpy_same(a, a_eager, "the input afterwards")


@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_under_a_cuda_default_device() -> None:
    """Under ``torch.device("cuda")`` the arrays' work runs on the GPU and comes back as
    NumPy arrays and scalars of NumPy's dtypes."""
    def f(a, w):
        return np.maximum(a - a.mean(0), 0) @ w, np.sum(a ** 2)

    compiled = minicompile.compile(f)
    rng = np.random.default_rng(0)
    w = rng.random((64, 8))
    with torch.device("cuda"):
        for call in range(2):
            a = rng.random((512, 64)) + call
            (out, total), (want, want_total) = compiled(a, w), f(a, w)
            assert type(out) is np.ndarray and out.dtype == np.float64
            assert type(total) is np.float64
            np.testing.assert_allclose(out, want, rtol=1e-10)
            np.testing.assert_allclose(total, want_total, rtol=1e-10)
    stats = minicompile.stats()
    assert (stats["graphs"], stats["eager_fallbacks"]) == (1, 0) and stats["kernels"] > 0, stats
