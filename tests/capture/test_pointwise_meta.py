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
import torch.nn.functional as F
def chain(x, y):
    a = torch.relu(x * 1.5 + y)
    b = torch.sigmoid(a) * torch.tanh(y) + torch.nn.functional.silu(y)
    return torch.exp(-b * b) + torch.abs(x) / (1.0 + y * y)
def norm(x, w, b):
    return torch.softmax(F.layer_norm(x, (x.shape[-1],), w, b), -1)
def attend(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True) * 2
loaded, results = [], []
for fn, make in ((chain, lambda: (torch.randn(64), torch.randn(64))),
                 (norm, lambda: (torch.randn(4, 32), torch.randn(32), torch.randn(32))),
                 (attend, lambda: [torch.randn(2, 8, 4, 16).transpose(1, 2) for _ in "qkv"])):
    compiled = minicompile.compile(fn, backend="cpp")
    results += [(compiled(*args), fn(*args)) for args in (make(), make())]
    loaded.append(tuple(m in sys.modules for m in ("torch._dynamo",
                                                    "torch.fx.experimental.symbolic_shapes")))
for got, want in results:  # (after: assert_close imports the symbolic-shapes module)
    torch.testing.assert_close(got, want)
print(loaded)
"""


def test_capturing_pointwise_norms_and_attention_leaves_dynamo_unimported(tmp_path) -> None:
    # Importing torch._dynamo (which torch._refs' relu, and CPU attention's meta functions
    # did on their first call) made the capture of a 12-op chain take a second of its first
    # call, and nanogpt's two; PyTorch's symbolic-shapes module (imported by the meta
    # functions of reductions and broadcasts) tens of ms of a layer norm's.
    env = dict(os.environ, MINICOMPILE_CACHE_DIR=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", CHAIN], env=env, capture_output=True,
                         text=True, check=True)
    # (CPU attention's flash layout still asks PyTorch's meta function: symbolic shapes)
    assert out.stdout.strip() == "[(False, False), (False, False), (False, True)]"


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


@pytest.mark.parametrize("name", ["sum", "amax", "amin"])
def test_reduction_rules_match_the_meta_functions(name: str) -> None:
    rng = random.Random(name)
    answered = 0
    for _ in range(300):
        x = random_tensor(rng)
        dims = tuple(rng.sample(range(x.ndim), rng.randint(1, x.ndim))) if x.ndim else (0,)
        args = (x, dims, rng.random() < 0.5)
        fast = meta_rules.LIBRARY[name]((TensorMeta.of(x), *args[1:]), {}, torch.device("cpu"))
        if fast is None:
            assert not x.dtype.is_floating_point or 0 in x.shape or x.ndim == 0, args
            continue
        answered += 1
        eager = ops.run_eager(name, args, {})
        assert (tuple(map(int, fast.shape)), tuple(map(int, fast.stride)), fast.dtype) == (
            tuple(eager.shape), eager.stride(), eager.dtype), args
    assert answered > 50


def test_attention_rule_matches_the_meta_path_and_eager(monkeypatch) -> None:
    """On CPU tensors: what the slow path (the meta functions, then cpu_layout) gives, and
    eager's layout (strides of dims longer than 1)."""
    name = ops.extern_op(torch.nn.functional.scaled_dot_product_attention)
    rule = meta_rules.LIBRARY[name]
    monkeypatch.delitem(meta_rules.LIBRARY, name)  # ops.infer_meta: the slow path
    rng = random.Random(0)
    answered = 0
    for _ in range(60):
        dtype = rng.choice([torch.float32, torch.bfloat16, torch.float64])
        b, h, length, s, e = (rng.choice(n) for n in ([1, 2], [1, 4], [1, 5, 16], [1, 5, 16],
                                                      [8, 16]))

        def make(*shape: int, dtype: torch.dtype = dtype) -> torch.Tensor:
            if rng.random() < 0.5:  # (batch, length, heads, dim) transposed, as in GPT
                return torch.randn(shape[0], shape[2], shape[1], shape[3], dtype=dtype
                                   ).transpose(1, 2)
            return torch.randn(*shape, dtype=dtype)

        args = (make(b, h, length, e), make(b, h, s, e), make(b, h, s, rng.choice([e, 8])))
        kwargs = rng.choice([{}, {"is_causal": True}, {"scale": 0.5}, {"dropout_p": 0.0}])
        fast, eager, metas, _ = rule_and_eager(rule, args, kwargs,
                                               torch.nn.functional.scaled_dot_product_attention)
        if fast is None:
            continue
        answered += 1
        slow = ops.infer_meta(name, metas, kwargs, torch.device("cpu"))
        assert (fast.shape, fast.stride, fast.dtype) == (slow.shape, slow.stride, slow.dtype)
        assert tuple(map(int, fast.shape)) == tuple(eager.shape) and fast.dtype == eager.dtype
        assert [int(st) for st, n in zip(fast.stride, eager.shape) if n > 1] == [
            st for st, n in zip(eager.stride(), eager.shape) if n > 1], (args, kwargs)
    assert answered > 40
    half = TensorMeta.of(torch.empty(1, 2, 4, 8))
    assert rule((half, half, half), {"attn_mask": half}, torch.device("cpu")) is None
    assert rule((half, half, half), {}, torch.device("cuda")) is None  # (the call decides)
