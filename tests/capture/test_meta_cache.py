"""Remembered result metadata (minicompile/meta_cache.py) is what infer_meta computes."""

from __future__ import annotations

import random

import pytest
import sympy
import torch

from minicompile import meta_cache, ops
from minicompile.graph import Graph, TensorMeta

CPU = torch.device("cpu")
DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.int64, torch.bool)


def _meta(rng: random.Random) -> TensorMeta:
    shape = [rng.choice([1, 2, 3]) for _ in range(rng.randint(0, 3))]
    t = torch.empty(shape, dtype=rng.choice(DTYPES), device="meta")
    if t.dim() >= 2 and rng.random() < 0.4:
        t = t.transpose(0, 1)
    return TensorMeta.of(t)


def _call(rng: random.Random) -> tuple[str, tuple, dict]:
    name = rng.choice(["add", "mul", "sub", "lt", "where", "neg", "relu", "to_dtype",
                       "unsqueeze", "truediv"])
    x = _meta(rng)
    if name == "where":
        cond = TensorMeta.of(torch.empty(x.concrete_shape(), dtype=torch.bool, device="meta"))
        return name, (cond, x, rng.choice([0, 0.0, x])), {}
    if name in ("neg", "relu"):
        return name, (x,), {}
    if name == "to_dtype":
        return name, (x,), {"dtype": rng.choice(DTYPES)}
    if name == "unsqueeze":
        return name, (x, rng.randint(-1, x.ndim)), {}
    return name, (x, rng.choice([1, 1.0, True, -0.0, 2, _meta(rng)])), {}


def _result(name: str, args: tuple, kwargs: dict, cached: bool) -> object:
    if not cached:
        meta_cache.clear()
    try:
        return ops.infer_meta(name, args, kwargs, CPU)
    except Exception as e:  # noqa: BLE001  (the same error either way)
        return (type(e), str(e))


@pytest.mark.parametrize("seed", range(3))
def test_remembered_results_are_the_computed_ones(seed: int) -> None:
    """Calls drawn from a small pool (so most repeat: 1 and 1.0, True and 1, bool and float
    tensors) answer from the cache exactly what a cold infer_meta computes."""
    rng = random.Random(seed)
    pool = [_call(rng) for _ in range(60)]
    meta_cache.clear()
    warm = [_result(*pool[rng.randrange(len(pool))], cached=True) for _ in range(20)]
    calls = [pool[rng.randrange(len(pool))] for _ in range(200)]
    hits = 0
    for name, args, kwargs in calls:
        before = meta_cache.key(name, args, kwargs, CPU) in meta_cache._results
        hits += before
        got = _result(name, args, kwargs, cached=True)
        assert got == _result(name, args, kwargs, cached=False), (name, args, kwargs)
        meta_cache.clear()
        for n, a, k in pool[:20]:  # re-warm a little, so later calls hit again
            _result(n, a, k, cached=True)
    assert warm and hits > 20


def test_keys_tell_numbers_and_layouts_apart() -> None:
    x = TensorMeta.of(torch.empty(2, 3))
    xt = TensorMeta.of(torch.empty(3, 2).t())
    keys = {meta_cache.key("add", (x, v), {}, CPU) for v in (1, 1.0, True, 0.0, -0.0)}
    assert len(keys) == 5
    assert meta_cache.key("neg", (x,), {}, CPU) != meta_cache.key("neg", (xt,), {}, CPU)
    assert meta_cache.key("neg", (x,), {}, CPU) != meta_cache.key(
        "neg", (x,), {}, torch.device("cuda"))
    i64 = TensorMeta.of(torch.empty(2, 3, dtype=torch.int64))
    meta_cache.clear()
    assert ops.infer_meta("add", (i64, 1.0), {}, CPU).dtype == torch.float32
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:  # a Python float takes the default dtype: not the remembered float32 answer
        assert ops.infer_meta("add", (i64, 1.0), {}, CPU).dtype == torch.float64
    finally:
        torch.set_default_dtype(default)


def test_errors_and_symbolic_sizes_are_not_remembered() -> None:
    meta_cache.clear()
    a, b = TensorMeta.of(torch.empty(2, 3)), TensorMeta.of(torch.empty(4, 5))
    for _ in range(2):
        with pytest.raises(RuntimeError):
            ops.infer_meta("add", (a, b), {}, CPU)
    assert not meta_cache._results
    assert meta_cache.key("to_device", (a, torch.device("cpu")), {}, CPU) is None
    s0 = sympy.Symbol("s0", integer=True, positive=True)
    symbolic = TensorMeta((s0, sympy.Integer(3)), (sympy.Integer(3), sympy.Integer(1)),
                          torch.float32, CPU)
    assert meta_cache.key("neg", (symbolic,), {}, CPU) is None
    assert meta_cache.key("reshape", (a, (s0, 3)), {}, CPU) is None


def test_graph_nodes_key_by_their_meta() -> None:
    g = Graph()
    x = g.placeholder("x", TensorMeta.of(torch.empty(2, 3)))
    assert meta_cache.key("neg", (x,), {}, CPU) == meta_cache.key("neg", (x.meta,), {}, CPU)
