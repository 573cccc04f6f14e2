"""Result metadata of pointwise ops on float, integer and bool tensors
(minicompile/meta_rules.py) is what PyTorch's meta functions give, found without running
them (they import torch._dynamo)."""

from __future__ import annotations

import os
import random
import subprocess
import sys

import pytest
import torch

from minicompile import meta_rules, ops
from minicompile.graph import TensorMeta

from meta_check import rule_and_eager

FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
DTYPES = (*FLOATS, torch.int32, torch.int64, torch.uint8, torch.bool)


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
    count = 1 if ops.OPS[name].family in ("unary", "composite") else 2
    args = [random_tensor(rng)]
    for _ in range(count - 1):
        args.append(rng.choice([2, 0.5, -1, 3.0]) if rng.random() < 0.3 else random_tensor(rng))
    return args


@pytest.mark.parametrize("seed", range(4))
def test_matches_the_meta_functions(seed: int) -> None:
    rng = random.Random(seed)
    names = sorted(meta_rules.FLOAT_POINTWISE | meta_rules.INTEGRAL_POINTWISE.keys())
    compared = 0
    for _ in range(500):
        name = rng.choice(names)
        args = random_args(name, rng)
        kwargs = {k: rng.choice([None, -1, 0.5, 2]) for k in ("min", "max")} if (
            name == "clamp") else {}
        metas = tuple(TensorMeta.of(a) if isinstance(a, torch.Tensor) else a for a in args)
        fast = meta_rules.pointwise_meta(name, metas, kwargs, torch.device("cpu"))
        try:
            eager = ops.run_eager(name, tuple(args), kwargs)
        except (RuntimeError, TypeError, ValueError):  # PyTorch refuses: so does the slow path
            assert fast is None, (name, args)
            continue
        if fast is None:
            continue
        compared += 1
        got = (tuple(map(int, fast.shape)), tuple(map(int, fast.stride)), fast.dtype)
        if got != (tuple(eager.shape), eager.stride(), eager.dtype):
            # relu's meta kernel keeps a size-1 dim's input stride where its CPU kernel
            # (and the fast rule) does not: either of PyTorch's answers will do
            eager = ops.run_eager(name, tuple(
                torch.empty_strided(a.shape, a.stride(), dtype=a.dtype)
                if isinstance(a, torch.Tensor) else a for a in args), kwargs)
        assert got == (tuple(eager.shape), eager.stride(), eager.dtype), (name, args)
    assert compared > 100


def test_refuses_what_it_does_not_model() -> None:
    f32 = TensorMeta.of(torch.empty(4, 4))
    i64 = TensorMeta.of(torch.empty(4, 4, dtype=torch.int64))
    cpu = torch.device("cpu")
    b8 = TensorMeta.of(torch.empty(4, 4, dtype=torch.bool))
    assert meta_rules.pointwise_meta("sub", (b8, b8), {}, cpu) is None  # eager refuses
    assert meta_rules.pointwise_meta("sin", (i64,), {}, cpu).dtype == torch.float32
    assert meta_rules.pointwise_meta("bitwise_and", (f32, f32), {}, cpu) is None  # refused
    assert meta_rules.pointwise_meta("maximum", (f32, 2.0), {}, cpu) is None  # eager refuses
    assert meta_rules.pointwise_meta("add", (f32, TensorMeta.of(torch.empty(3))), {}, cpu) is None
    assert meta_rules.pointwise_meta("add", (f32, f32), {"alpha": 2}, cpu) is None
    half = TensorMeta.of(torch.empty(4, 4, dtype=torch.float16))
    assert meta_rules.pointwise_meta("sin", (half,), {}, cpu) is None  # computed in float32


CHAIN = """
import sys, torch, minicompile
def chain(x, y):
    a = torch.relu(x * 1.5 + y)
    b = torch.sigmoid(a) * torch.tanh(y) + torch.nn.functional.silu(y)
    return torch.exp(-b * b) + torch.abs(x) / (1.0 + y * y)
f = minicompile.compile(chain, backend="cpp")
for _ in range(2):
    x, y = torch.randn(64), torch.randn(64)
    torch.testing.assert_close(f(x, y), chain(x, y))
print("torch._dynamo" in sys.modules)
"""


def test_capturing_a_pointwise_chain_leaves_dynamo_unimported(tmp_path) -> None:
    # Importing torch._dynamo (which torch._refs' relu did on its first call) made the
    # capture of a 12-op chain take a second of its first call.
    env = dict(os.environ, MINICOMPILE_CACHE_DIR=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", CHAIN], env=env, capture_output=True,
                         text=True, check=True)
    assert out.stdout.strip() == "False"


def random_library_args(name: str, rng: random.Random) -> tuple[tuple, dict]:
    """Real CPU tensors for F.layer_norm / F.linear / gelu: mostly plain, sometimes not (another
    dtype, a transposed input, a size mismatch, a 1-d input, keyword arguments)."""
    dtype = rng.choice(FLOATS[1:])

    def other() -> torch.dtype:
        return rng.choice(FLOATS[1:]) if rng.random() < 0.15 else dtype

    shape = [rng.choice([1, 2, 3, 5]) for _ in range(rng.randint(1, 4))]
    x = torch.randn(shape, dtype=dtype)
    if x.dim() >= 2 and rng.random() < 0.2:
        x = x.transpose(0, -1)
    last = x.shape[-1] + (1 if rng.random() < 0.1 else 0)
    if name == "torch.nn.functional.layer_norm":
        k = rng.randint(1, x.dim())
        normalized = tuple(x.shape[x.dim() - k:])
        normalized = normalized[:-1] + (last,)
        w = torch.randn(normalized, dtype=other()) if rng.random() < 0.7 else None
        b = torch.randn(normalized, dtype=other()) if rng.random() < 0.7 else None
        if rng.random() < 0.3:
            return (x, normalized), {"weight": w, "bias": b, "eps": 1e-6}
        return (x, normalized, w, b), {}
    if name == "gelu":
        if x.dim() >= 1 and rng.random() < 0.3 and x.shape[-1] >= 2:
            x = x[..., ::2]
        mode = rng.choice(["none", "tanh", "tanh", "exact"])
        return ((x, mode), {}) if rng.random() < 0.5 else ((x,), {"approximate": mode})
    rows = rng.choice([1, 4, 7])
    w = torch.randn(rows, last, dtype=other())
    b = torch.randn(rows, dtype=other()) if rng.random() < 0.7 else None
    return ((x, w, b), {}) if rng.random() < 0.7 else ((x, w), {"bias": b})


@pytest.mark.parametrize("name", ["torch.nn.functional.layer_norm", "torch.nn.functional.linear",
                                  "gelu"])
def test_library_rules_match_eager(name: str) -> None:
    """Where the rule answers, eager's result has that shape, strides and dtype; where
    eager raises, the rule does not answer (the slow path raises eager's error)."""
    rng = random.Random(name)
    answered = 0
    for _ in range(400):
        args, kwargs = random_library_args(name, rng)
        run = (lambda *a, **k: ops.run_eager(name, a, k)) if name == "gelu" else getattr(
            torch.nn.functional, name.rpartition(".")[2])
        fast, eager, _, _ = rule_and_eager(meta_rules.LIBRARY[name], args, kwargs, run)
        if fast is None:
            continue
        answered += 1
        assert (tuple(map(int, fast.shape)), tuple(map(int, fast.stride)), fast.dtype) == (
            tuple(eager.shape), eager.stride(), eager.dtype), (args, kwargs)
    assert answered > 150
