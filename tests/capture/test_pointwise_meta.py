"""Result metadata of float pointwise ops (minicompile/ops.py: _pointwise_meta) is what
PyTorch's meta functions give, found without running them (they import torch._dynamo)."""

from __future__ import annotations

import random

import pytest
import torch

from minicompile import ops
from minicompile.graph import TensorMeta

DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def random_tensor(rng: random.Random) -> torch.Tensor:
    """A meta tensor of 0-4 dims, sometimes transposed, sliced with a step or permuted."""
    ndim = rng.randint(0, 4)
    t = torch.empty([rng.choice([0, 1, 1, 2, 3, 4, 6]) for _ in range(ndim)],
                    dtype=rng.choice(DTYPES), device="meta")
    if ndim >= 2 and rng.random() < 0.4:
        t = t.transpose(0, 1)
    if ndim >= 1 and rng.random() < 0.3 and t.shape[-1] >= 2:
        t = t[..., ::2]
    if ndim == 3 and rng.random() < 0.3:
        t = t.permute(2, 0, 1)
    return t


def random_args(name: str, rng: random.Random) -> list:
    if name == "where":
        cond = torch.empty(rng.choice([[], [1], [4], [3, 4]]), dtype=torch.bool, device="meta")
        return [cond, random_tensor(rng), random_tensor(rng)]
    count = 1 if name in ops.UNARY else 2
    args = [random_tensor(rng)]
    for _ in range(count - 1):
        args.append(rng.choice([2, 0.5, -1, 3.0]) if rng.random() < 0.3 else random_tensor(rng))
    return args


@pytest.mark.parametrize("seed", range(4))
def test_matches_the_meta_functions(seed: int) -> None:
    rng = random.Random(seed)
    names = sorted(ops._FLOAT_POINTWISE | {"where"})
    compared = 0
    for _ in range(500):
        name = rng.choice(names)
        args = random_args(name, rng)
        metas = tuple(TensorMeta.of(a) if isinstance(a, torch.Tensor) else a for a in args)
        fast = ops._pointwise_meta(name, metas, {}, torch.device("cpu"))
        try:
            eager = ops.run_eager(name, tuple(args), {})
        except (RuntimeError, TypeError):  # PyTorch refuses: the slow path raises its error
            assert fast is None, (name, args)
            continue
        if fast is None:
            continue
        compared += 1
        got = (tuple(map(int, fast.shape)), tuple(map(int, fast.stride)), fast.dtype)
        assert got == (tuple(eager.shape), eager.stride(), eager.dtype), (name, args)
    assert compared > 100


def test_refuses_what_it_does_not_model() -> None:
    f32 = TensorMeta.of(torch.empty(4, 4))
    i64 = TensorMeta.of(torch.empty(4, 4, dtype=torch.int64))
    cpu = torch.device("cpu")
    assert ops._pointwise_meta("sin", (i64,), {}, cpu) is None  # int to float
    assert ops._pointwise_meta("bitwise_and", (f32, f32), {}, cpu) is None  # not modelled
    assert ops._pointwise_meta("maximum", (f32, 2.0), {}, cpu) is None  # eager refuses
    assert ops._pointwise_meta("add", (f32, TensorMeta.of(torch.empty(3))), {}, cpu) is None
    assert ops._pointwise_meta("add", (f32, f32), {"alpha": 2}, cpu) is None
    half = TensorMeta.of(torch.empty(4, 4, dtype=torch.float16))
    assert ops._pointwise_meta("sin", (half,), {}, cpu) is None  # computed in float32
