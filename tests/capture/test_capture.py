"""Capture of straight-line tensor code: graph text and eager replay."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from capture_helpers import body, capture, check_matches_eager, replay

from minicompile.capture import capture_frame

SCALE = 0.5
WEIGHT = torch.linspace(-1.0, 1.0, 8)


def x48(dtype: torch.dtype = torch.float32) -> torch.Tensor:
    torch.manual_seed(0)
    return torch.randn(4, 8).to(dtype)


def test_graph_text_and_source_lines() -> None:
    def f(x, y):
        a = torch.sin(x)
        return a + y

    cap = check_matches_eager(f, x48(), x48())
    assert body(cap) == (
        "f(L_x: f32[4, 8], L_y: f32[4, 8]):\n"
        "    %0 = placeholder L_x : f32[4, 8]\n"
        "    %1 = sin(%0) : f32[4, 8]\n"
        "    %2 = placeholder L_y : f32[4, 8]\n"
        "    %3 = add(%1, %2) : f32[4, 8]\n"
        "    return (%3,)"
    )
    sin = cap.graph.nodes[1]
    assert sin.stack[-1].function == "f"
    assert sin.stack[-1].text == "a = torch.sin(x)"
    assert sin.stack[-1].filename.endswith("test_capture.py")
    assert "test_capture.py:" in str(cap.graph) and "a = torch.sin(x)" in str(cap.graph)
    assert cap.input_sources == ["L['x']", "L['y']"]
    assert cap.ops == 2


UNARY_SPELLINGS = [
    ("torch.sin", lambda x: torch.sin(x), "sin"),
    ("method", lambda x: x.cos(), "cos"),
    ("Tensor.exp", lambda x: torch.Tensor.exp(x), "exp"),
    ("neg", lambda x: -x, "neg"),
    ("abs builtin", lambda x: abs(x), "abs"),
    ("F.relu", lambda x: F.relu(x), "relu"),
    ("torch.relu", lambda x: torch.relu(x), "relu"),
    ("F.silu", lambda x: F.silu(x), "silu"),
    ("F.gelu", lambda x: F.gelu(x), "gelu"),
    ("F.gelu tanh", lambda x: F.gelu(x, approximate="tanh"), "gelu"),
    ("F.sigmoid", lambda x: F.sigmoid(x), "sigmoid"),
    ("expit", lambda x: torch.special.expit(x), "sigmoid"),
    ("special.erf", lambda x: torch.special.erf(x), "erf"),
    ("tanh", lambda x: x.tanh(), "tanh"),
    ("rsqrt", lambda x: x.abs().rsqrt(), "rsqrt"),
    ("round", lambda x: torch.round(x * 3), "round"),
    ("exp2", lambda x: x.exp2(), "exp2"),
    ("log1p", lambda x: torch.log1p(x.abs()), "log1p"),
    ("sign", lambda x: x.sign(), "sign"),
    ("trunc", lambda x: torch.trunc(x * 2), "trunc"),
    ("reciprocal", lambda x: x.reciprocal(), "reciprocal"),
]


@pytest.mark.parametrize(
    "fn,op", [(f, op) for _, f, op in UNARY_SPELLINGS], ids=[n for n, _, _ in UNARY_SPELLINGS]
)
def test_unary_spellings(fn, op) -> None:
    cap = check_matches_eager(fn, x48())
    assert op in [n.target for n in cap.graph.calls()]


def test_invert_bool_is_logical_not_and_int_is_bitwise_not() -> None:
    cap = check_matches_eager(lambda m: ~m, torch.tensor([True, False]))
    assert [n.target for n in cap.graph.calls()] == ["logical_not"]
    cap = check_matches_eager(lambda m: ~m, torch.tensor([1, 2, -3]))
    assert [n.target for n in cap.graph.calls()] == ["bitwise_not"]


BINARY_SPELLINGS = [
    ("add", lambda x, y: x + y),
    ("radd", lambda x, y: 1 + x),
    ("rsub", lambda x, y: 2 - x),
    ("rtruediv", lambda x, y: 1.5 / (x.abs() + 1)),
    ("rpow", lambda x, y: 2**x),
    ("pow", lambda x, y: x**2),
    ("floordiv", lambda x, y: x // 0.3),
    ("mod", lambda x, y: x % 0.7),
    ("torch.add alpha", lambda x, y: torch.add(x, y, alpha=3)),
    ("sub alpha", lambda x, y: x.sub(y, alpha=2)),
    ("torch.rsub", lambda x, y: torch.rsub(x, y)),
    ("div floor", lambda x, y: torch.div(x, y, rounding_mode="floor")),
    ("div trunc", lambda x, y: torch.div(x, y, rounding_mode="trunc")),
    ("true_divide", lambda x, y: torch.true_divide(x, y)),
    ("mul method", lambda x, y: x.mul(2)),
    ("maximum", lambda x, y: torch.maximum(x, y)),
    ("minimum method", lambda x, y: x.minimum(y)),
    ("compare", lambda x, y: (x < y, x >= 0, x == y, x != 0.5, torch.gt(x, y), x.le(y))),
    ("greater", lambda x, y: torch.greater(x, y)),
    ("logical", lambda x, y: torch.logical_and(x > 0, y > 0) | (x < -1)),
    ("bitwise bool", lambda x, y: (x > 0) & (y > 0) ^ (x > 1)),
    ("where", lambda x, y: torch.where(x > 0, x, y)),
    ("where scalars", lambda x, y: torch.where(x > 0, 1.0, 0.0)),
    ("where method", lambda x, y: x.where(x > 0, 0.0)),
    ("clamp", lambda x, y: torch.clamp(x, -0.5, 0.5)),
    ("clamp kw", lambda x, y: x.clamp(min=0.1)),
    ("clip", lambda x, y: torch.clip(x, max=0.2)),
    ("clamp_min", lambda x, y: x.clamp_min(0.0)),
    ("clamp_max", lambda x, y: torch.clamp_max(x, 0.3)),
    ("clamp tensor", lambda x, y: torch.clamp(x, min=y, max=y + 1)),
]


@pytest.mark.parametrize(
    "fn", [f for _, f in BINARY_SPELLINGS], ids=[n for n, _ in BINARY_SPELLINGS]
)
def test_binary_spellings(fn) -> None:
    check_matches_eager(fn, x48(), x48().flip(0))


def test_reflected_and_scalar_arguments() -> None:
    def f(x, s):
        return 2 - x, x * s, s / (x.abs() + 1)

    cap = check_matches_eager(f, x48(), 2.0)
    text = body(cap)
    assert "sub(2, %0)" in text
    assert "mul(%0, 2.0)" in text
    assert "truediv(2.0, %" in text


def test_int_tensor_promotion() -> None:
    check_matches_eager(lambda x: (x / 2, x * 1.5, x // 2, x + True), torch.arange(6))


def test_globals_and_closures() -> None:
    bias = torch.ones(8)
    k = 3

    def f(x):
        return (x * SCALE + WEIGHT) * k + bias

    cap = check_matches_eager(f, x48())
    assert cap.input_sources == ["L['x']", "G['WEIGHT']", "C['bias']"]
    assert [p.target for p in cap.graph.placeholders] == ["L_x", "G_WEIGHT", "C_bias"]
    text = str(cap.guards)
    assert "G.get('SCALE') == 0.5" in text or "G['SCALE'] == 0.5" in text
    assert "C['k'] value" in text


def test_kwargs_defaults_and_kwonly() -> None:
    def f(x, y=None, *, alpha=2.0, mode="relu"):
        out = x * alpha
        if y is not None:
            out = out + y
        if mode == "relu":
            out = F.relu(out)
        return out

    check_matches_eager(f, x48())
    check_matches_eager(f, x48(), x48(), alpha=0.5, mode="none")


def test_varargs_and_kwargs() -> None:
    def g(a, b, scale=1.0):
        return a * scale + b

    def f(*ts, **kw):
        return g(*ts, **kw)

    check_matches_eager(f, x48(), x48(), scale=3.0)


def helper_inner(t, k):
    return t.sigmoid() * k


def helper_outer(t, k=2):
    return helper_inner(t + 1, k) - t


def test_inlined_helpers_two_levels() -> None:
    def f(x):
        return helper_outer(x), helper_outer(x, k=5)

    cap = check_matches_eager(f, x48())
    sig = next(n for n in cap.graph.calls() if n.target == "sigmoid")
    assert [s.function for s in sig.stack] == ["f", "helper_outer", "helper_inner"]
    assert "G['helper_outer'] identity" in str(cap.guards)
    assert "G['helper_inner'] identity" in str(cap.guards)


def test_nested_function_with_cell() -> None:
    def f(x):
        c = x.shape[0] * 2

        def g(z, w=1):
            return z * c + w

        return g(x), g(x, w=3)

    check_matches_eager(f, x48())


def test_returns_structures_input_and_constants() -> None:
    def f(x, y):
        a = x.exp()
        return {"a": a, "pair": (a, [y, 3]), "none": None, "x": x, "shape": x.shape}

    cap, frame = capture(f, x48(), x48())
    out = replay(cap, frame)
    assert out["x"] is frame[0]  # a returned input is the input itself
    assert out["pair"][1][0] is frame[1]
    assert out["pair"][0] is out["a"]
    assert out["none"] is None and out["pair"][1][1] == 3
    assert out["shape"] == torch.Size([4, 8]) and type(out["shape"]) is torch.Size
    torch.testing.assert_close(out["a"], frame[0].exp())


def test_return_constant_only_gives_empty_graph() -> None:
    cap, frame = capture(lambda x: x.shape[0] + 1, x48())
    assert cap.graph.outputs == () and cap.ops == 0
    assert replay(cap, frame) == 5


def test_shape_arithmetic_and_branch_on_metadata() -> None:
    def f(x):
        if x.ndim == 2 and x.size(1) == x.shape[1] and x.dim() > 1:
            n, m = x.shape
            x = x * (n * m) / x.numel()
        else:
            x = x - 1
        if x.is_cuda:
            x = x + 100
        return x + len(x) + x.shape[-1] + x.size()[0]

    check_matches_eager(f, x48())
    check_matches_eager(f, torch.ones(3))


def test_branch_on_python_flag() -> None:
    def f(x, flag, n=None):
        if flag:
            x = x + 1
        if not flag:
            x = x * 2
        return x if n is None else x * n

    check_matches_eager(f, x48(), True)
    check_matches_eager(f, x48(), False, 3)


def test_dtype_casts() -> None:
    def f(x, i, d):
        return (
            x.to(torch.float16),
            x.to(dtype=torch.float64),
            i.float(),
            x.half().float(),
            x.int(),
            x.long(),
            x.bool(),
            x.type(torch.bfloat16),
            x.to(i),
            x.to(d),
            i.type_as(x),
            x.to("cpu"),
            x.double(),
        )

    cap = check_matches_eager(f, x48(), torch.arange(4), torch.float16)
    # A cast to the same dtype is the value itself, as in eager.
    same = capture(lambda x: x.float(), x48())[0]
    # ... returned as the caller's own object, not through the graph.
    assert same.ops == 0 and same.graph.outputs == ()
    assert "ret = L_x" in same.rebuild_source
    assert "to_dtype(%0, dtype=torch.float16)" in body(cap)


def test_views() -> None:
    def f(x, other):
        return (
            x.T,
            x.mT,
            x.t(),
            x.permute(1, 0),
            torch.permute(x, (-1, 0)),
            x.transpose(0, -1),
            x.unsqueeze(-1),
            torch.unsqueeze(x, 0),
            x.unsqueeze(1).squeeze(1),
            x.unsqueeze(0).squeeze(),
            x.unsqueeze(0).expand(3, -1, -1),
            x.expand(2, 4, 8),
            x.unsqueeze(0).expand_as(other),
            x.contiguous(),
        )

    cap = check_matches_eager(f, x48(), torch.zeros(5, 4, 8))
    text = body(cap)
    assert "permute(%0, (1, 0))" in text
    assert "unsqueeze(%0, 2)" in text
    assert "expand(%" in text and "(3, 4, 8)" in text


def test_tuples_and_indexing() -> None:
    def f(pair, x):
        a, b = pair
        t = (a, b, x)
        first, *rest = t
        return t[0] + t[-1], rest[0] * 2, pair[1:], (*rest, 1)

    cap = check_matches_eager(f, (x48(), x48() + 1), x48())
    assert cap.input_sources == ["L['pair'][0]", "L['pair'][1]", "L['x']"]
    assert [p.target for p in cap.graph.placeholders] == ["L_pair_0", "L_pair_1", "L_x"]


def test_math_and_builtins_fold() -> None:
    def f(x, d):
        scale = 1 / math.sqrt(d)
        n = max(x.shape[0], 2) + min(1, 2) + int(2.7) + round(1.4)
        return x * scale * n, isinstance(x, torch.Tensor), type(d) is int

    check_matches_eager(f, x48(), 16)


def test_torch_queries() -> None:
    def f(x):
        if torch.is_tensor(x) and x.is_floating_point() and x.dtype == torch.float32:
            x = x + 1
        if x.device.type == "cpu" and torch.is_grad_enabled():
            x = x * 2
        return x, x.requires_grad, x.stride(), x.is_contiguous(), x.element_size()

    check_matches_eager(f, x48())


def test_half_and_bool_dtypes() -> None:
    check_matches_eager(lambda x: (x * 2 + 1).sigmoid(), x48(torch.float16))
    check_matches_eager(
        lambda m, n: (m & n, m | n, m ^ n, ~m), torch.rand(5) > 0.5, torch.rand(5) > 0.5
    )


def test_no_grad_inputs_requiring_grad() -> None:
    x = x48().requires_grad_()
    with torch.no_grad():
        cap, frame = capture(lambda t: t * 2, x)
        assert "is_grad_enabled() is False" in str(cap.guards)
        assert not replay(cap, frame).requires_grad


def test_capture_frame_rejects_generators() -> None:
    from minicompile.errors import Unsupported

    def gen(x):
        yield x

    with pytest.raises(Unsupported, match="generator"):
        capture_frame(gen, (x48(),))


def test_fstrings_and_asserts_on_constants() -> None:
    def f(x, name="w"):
        assert x.ndim == 2, f"{name}: bad rank {x.ndim}"
        key = f"{name}_{x.shape[0]:03d}!r{name!r}"
        return x * len(key)

    check_matches_eager(f, x48())


def test_version_specific_opcodes() -> None:
    """BINARY_SLICE, CALL_INTRINSIC_1 (3.12), LIST_TO_TUPLE (3.11), RETURN_CONST (3.12),
    UNPACK_EX, JUMP_IF_*_OR_POP (3.11) / COPY+POP_JUMP (3.12)."""

    def f(x, flag=False):
        head, *tail = x.shape[0:], 1
        y = +x
        z = flag or x.ndim
        w = flag and x.ndim
        return (*head, *tail), y * z + w

    check_matches_eager(f, x48())

    def g(x):
        x.exp()
        return None

    cap, frame = capture(g, x48())
    assert replay(cap, frame) is None and cap.graph.outputs == ()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_tensors() -> None:
    def f(x, y):
        if x.is_cuda:
            x = x.to("cuda") * 2
        return x + y, x.to(torch.float16)

    x = torch.randn(4, 8, device="cuda")
    cap = check_matches_eager(f, x, torch.randn(8, device="cuda"))
    assert "L_x.device == dev_cuda0" in str(cap.guards)
    frame = (x.cpu(), torch.randn(8, device="cuda"))
    assert cap.guards.explain_failure(*frame) == "L['x'] device: expected cuda:0, got cpu"
