"""The program suite's case table: :class:`Program`, input makers, and the function cases
that exercise ordinary Python (arguments, closures, containers, loops, branches on Python
values and on tensor metadata, builtins, ``math``, context managers, ``try``).

Every case is written the way a person who never heard of minicompile writes model code.
Mutation cases live in ``mutation_programs.py``, ``nn.Module`` cases in
``module_programs.py``; ``test_programs.py`` runs all of them against eager.

A case is registered with :func:`program` (a decorator on the function) or by appending a
:class:`Program` to a table.  Its sampler draws FRESH random tensors on every call (so code
that baked its first inputs in is caught) and fixed Python values (so the second call passes
the guards of the first).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any, Union

import torch
import torch.nn as nn
import torch.nn.functional as F

Inputs = tuple[tuple, dict]  # (args, kwargs)
Sampler = Callable[[torch.device], Inputs]


@dataclasses.dataclass(frozen=True)
class State:
    """Program state outside the arguments (globals, global lists): ``reset`` puts it back
    before each run (eager and compiled), ``read`` returns it for comparison."""

    reset: Callable[[], None]
    read: Callable[[], Any]


@dataclasses.dataclass(frozen=True)
class Program:
    name: str
    sample: Sampler
    fn: Callable[..., Any] | None = None  # a function case ...
    module: Callable[[], nn.Module] | None = None  # ... or a factory of a module case
    graphs: int = 1  # graphs compiled by the first call
    breaks: int = 0  # graph breaks met by the first call
    state: State | None = None
    # Applied to both the compiled and the eager module between the two calls (an
    # optimizer step, say); the second call must still reuse the first call's code.
    between: Callable[[nn.Module], None] | None = None
    no_grad: bool = False  # run both calls under torch.no_grad() (module cases always do)
    # Recompiles the second call may legitimately need (a guarded Python value changed).
    max_recompiles: int = 0
    tol: dict[str, float] = dataclasses.field(default_factory=dict)

    def __repr__(self) -> str:
        return self.name


FUNCTION_CASES: list[Program] = []


# -- input makers ---------------------------------------------------------------------------


class Make:
    """A maker of one fresh tensor on a device (anything else in a spec is passed as is)."""

    def __init__(self, fn: Callable[[torch.device], torch.Tensor]) -> None:
        self.fn = fn

    def __call__(self, device: torch.device) -> torch.Tensor:
        return self.fn(device)


def randn(*shape: int, dtype: torch.dtype = torch.float32) -> Make:
    return Make(lambda d: torch.randn(shape, device=d).to(dtype))


def pos(*shape: int) -> Make:
    """In [0.1, 2.1): logs, square roots and data-dependent branches that always go one way."""
    return Make(lambda d: torch.rand(shape, device=d) * 2 + 0.1)


def ints(high: int, *shape: int, dtype: torch.dtype = torch.int64) -> Make:
    return Make(lambda d: torch.randint(0, high, shape, device=d, dtype=dtype))


def const(value: list | float, dtype: torch.dtype = torch.float32) -> Make:
    """A tensor with the same values on every call (lengths, masks that steer control flow)."""
    return Make(lambda d: torch.tensor(value, device=d, dtype=dtype))


def build(spec: Any, device: torch.device) -> Any:
    if isinstance(spec, Make):
        return spec(device)
    if isinstance(spec, (list, tuple)):
        return type(spec)(build(s, device) for s in spec)
    if isinstance(spec, dict):
        return {k: build(v, device) for k, v in spec.items()}
    return spec


def inputs(*args: Any, **kwargs: Any) -> Sampler:
    """A sampler from a spec: Make leaves become fresh tensors, other values stay."""
    return lambda device: (build(args, device), build(kwargs, device))


def program(sample: Sampler, table: list[Program] = FUNCTION_CASES, **options: Any) -> Callable:
    """Register the decorated function as a case named after it; returns it unchanged."""

    def register(fn: Callable) -> Callable:
        table.append(Program(fn.__name__, sample, fn=fn, **options))
        return fn

    return register


# -- module-level state the cases read -----------------------------------------------------

SCALE = 0.5
EPS = 1e-5


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    hidden: int = 8
    act: str = "gelu"
    eps: float = 1e-5
    residual: bool = True
    scale: float = 0.5


CONFIG = ModelConfig()


class Options:
    """A plain object of settings, as scripts pass around."""

    def __init__(self, scale: float = 2.0, act: str = "tanh") -> None:
        self.scale = scale
        self.act = act
        self.bias = 0.25


OPTIONS = Options()


def scaled_add(a: torch.Tensor, b: torch.Tensor, alpha: float = 1.0) -> torch.Tensor:
    return a + alpha * b


def make_affine(weight: float, bias: float) -> Callable:
    def affine(x):
        return x * weight + bias

    return affine


def make_shift(offsets: torch.Tensor) -> Callable:
    def shift(x):
        return (x - offsets.to(x.device)).abs()

    return shift


swish = lambda t: t * torch.sigmoid(t)  # noqa: E731  (a global lambda, as scripts write)


# -- arguments ------------------------------------------------------------------------------


@program(inputs(randn(4, 8), shift=0.5))
def keyword_and_default_args(x, scale=2.0, *, shift=1.0):
    return x * scale + shift


@program(inputs(randn(4, 8)))
def none_default(x, y=None, alpha=0.5):
    if y is None:
        return x * alpha
    return x * alpha + y


@program(inputs(randn(4, 8), randn(4, 8), randn(4, 8)))
def star_args_average(*tensors):
    out = tensors[0]
    for t in tensors[1:]:
        out = out + t
    return out / len(tensors)


@program(inputs(randn(4, 8), scale=3.0, relu=True, bias=randn(8)))
def star_kwargs_options(x, **opts):
    y = x * opts.get("scale", 1.0)
    if opts.get("relu", False):
        y = y.relu()
    if "bias" in opts:
        y = y + opts["bias"]
    return y


@program(inputs(randn(4, 8), randn(4, 8)))
def call_with_star_unpacking(x, y):
    def combine(a, b, *, w=1.0):
        return a * w + b

    args = (x, y)
    kw = {"w": 0.25}
    return combine(*args, **kw)


@program(inputs(randn(4, 8), randn(4, 8), alpha=2.0))
def forwarding_wrapper(*args, **kwargs):
    return scaled_add(*args, **kwargs).tanh()


# -- closures, nested functions, lambdas ----------------------------------------------------

FUNCTION_CASES.append(
    Program("closure_over_floats", inputs(randn(4, 8)), fn=make_affine(1.5, -0.5))
)
FUNCTION_CASES.append(
    Program("closure_over_tensor", inputs(randn(4, 8)), fn=make_shift(torch.linspace(-1, 1, 8)))
)


@program(inputs(randn(4, 8)))
def nested_function(x):
    def gelu_tanh(t):
        inner = math.sqrt(2.0 / math.pi) * (t + 0.044715 * t * t * t)
        return 0.5 * t * (1.0 + torch.tanh(inner))

    return gelu_tanh(x) - gelu_tanh(-x)


@program(inputs(randn(4, 8), randn(4, 8)))
def nested_closure_reads_tensor(x, y):
    def add_y(t):
        return t + y

    return add_y(x.sin()).relu()


@program(inputs(randn(4, 8)))
def nonlocal_counter(x):
    calls = 0

    def step(t):
        nonlocal calls
        calls += 1
        return t * 0.5 + calls

    y = step(step(x))
    return y, calls


@program(inputs(randn(4, 8)))
def lambda_activation(x):
    act = lambda t: t * torch.sigmoid(t)  # noqa: E731
    return act(x) + act(2 * x)


@program(inputs(randn(4, 8)))
def lambda_with_default(x):
    scale = lambda t, s=3.0: t * s  # noqa: E731
    return scale(x), scale(x, s=0.5)


@program(inputs(randn(4, 8), randn(4, 8)))
def map_with_lambda(x, y):
    return list(map(lambda t: t.exp() - 1, [x, y]))


@program(inputs(randn(4, 8)))
def global_lambda(x):
    return swish(x) * 2


@program(inputs(randn(4, 8)))
def functools_partial(x):
    act = functools.partial(F.gelu, approximate="tanh")
    return act(x) + act(-x)


def _scaled_sum(a, b, scale=1.0, *, bias=0.0):
    return (a + b) * scale + bias


@program(inputs(randn(4, 8), randn(4, 8)))
def functools_partial_binds_a_tensor_and_keywords(x, y):
    f = functools.partial(_scaled_sum, x, bias=0.5)
    g = functools.partial(f, scale=2.0)  # (a partial of a partial)
    return f(y), g(y, bias=-1.0), g(x) if g else None


class ScaledGelu(torch.autograd.Function):
    """A custom autograd.Function with a context (the older style)."""

    @staticmethod
    def forward(ctx, x, scale):
        ctx.save_for_backward(x)
        ctx.scale = scale
        return F.gelu(x) * scale

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * ctx.scale * torch.ones_like(x), None


class ClampFrom(torch.autograd.Function):
    """The newer style: forward without a context, setup_context apart."""

    @staticmethod
    def forward(x, low):
        return x.clamp(min=low)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.mark_non_differentiable(output)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


@program(inputs(randn(4, 8)), no_grad=True)
def autograd_function_in_inference(x):
    return ScaledGelu.apply(x, 2.0) + ClampFrom.apply(x * 3, -0.5)


@program(inputs(randn(4, 8)))
def autograd_function_on_tensors_without_grad(x):
    return ScaledGelu.apply(x.sin(), 0.5)


class _Bag:
    def __init__(self):
        self.items = []

    def __len__(self):
        return len(self.items)


class _Flag:
    def __init__(self, on):
        self.on = on

    def __bool__(self):
        return self.on


class _Plain:
    pass


@program(inputs(randn(4)))
def truth_of_objects_made_in_the_trace(x):
    """``if cache:`` on an object made in forward (Whisper's DynamicCache): its own
    __bool__ or __len__, else true."""
    bag = _Bag()
    y = x * 2 if bag else x - 1
    bag.items.append(x)
    y = y + 1 if bag else y
    return (y if _Flag(True) else -y), (x if _Plain() else -x), (x if _Flag(False) else -x)


@program(inputs(randn(2, 3, 4)))
def repeat_interleave_by_an_int(x):
    """GPT-J's rotary embedding: repeats given as an int, so the size is known."""
    return torch.repeat_interleave(x, 2, 2).sin(), x.repeat_interleave(3, dim=1) * 2


_BY_TYPE = {int: lambda t, v: t + v, float: lambda t, v: t * v, Union: None}


@program(inputs(randn(4, 8)))
def dict_keyed_by_types(x):
    """A table keyed by classes and typing forms (huggingface_hub's type validators)."""
    add, scale = _BY_TYPE.get(int), _BY_TYPE[float]
    return add(x, 3), scale(x, 2.0), _BY_TYPE.get(str) is None, Union in _BY_TYPE


@program(inputs(randn(4, 8)))
def functools_partial_returned(x):
    act = functools.partial(torch.clamp, min=-0.5)
    return act(x, max=0.5), act


# -- tuples, lists, dicts, slicing ----------------------------------------------------------


@program(inputs(randn(4, 8), randn(4, 8)))
def tuple_unpack_and_swap(x, y):
    a, b = x, y
    a, b = b, a - b
    (c, (d, e)) = (a * 2, (b, a + b))
    return c, d, e


@program(inputs(randn(4, 8), randn(4, 8), randn(4, 8)))
def star_unpacking(x, y, z):
    first, *rest = [x, y, z]
    *init, last = (x, y, z)
    return first + sum(rest), len(init) * last


@program(inputs(randn(4, 8), randn(4, 8)))
def dict_build_and_return(x, y):
    d = {"sum": x + y, "diff": x - y}
    d["prod"] = d["sum"] * d["diff"]
    d.update(scaled=x * 2)
    return d


@program(inputs({"x_a": randn(4, 8), "x_b": randn(4, 8), "mask": randn(4, 8)}))
def dict_argument_items(batch):
    out = {}
    for key, value in batch.items():
        if key.startswith("x"):
            out[f"{key}_norm"] = value / (value.abs() + 1)
    return out, list(batch.keys())


@program(inputs(randn(4, 8)))
def list_build_and_extend(x):
    outs = []
    outs.append(x)
    outs.extend([x * 2, x * 3])
    outs += [x - 1]
    outs.insert(0, -x)
    return outs[::2], outs[-1], len(outs)


@program(inputs(randn(6, 8)))
def tensor_slicing(x):
    return x[:, 1:3], x[..., ::2], x[1], x[None, :, -1], x[-2:, :4] * 2


@program(inputs(randn(4, 8)))
def glu_halves(x):
    left, right = x[:, :4], x[:, 4:]
    return left * right.sigmoid()


@program(inputs(randn(4, 8), randn(4, 8), randn(4, 8)))
def list_slicing(x, y, z):
    ts = [x, y, z]
    head = ts[:2]
    rev = ts[::-1]
    return head[0] + rev[0], ts[1:][-1] * len(head)


# -- loops ----------------------------------------------------------------------------------


@program(inputs(randn(4, 8)))
def for_over_range(x):
    for i in range(3):
        x = x * 0.5 + i
    return x


@program(inputs(randn(4, 8)))
def for_over_range_with_step(x):
    acc = x
    for i in range(1, 8, 3):
        acc = acc + torch.sin(x * i)
    return acc


@program(inputs([randn(4, 8), randn(4, 8), randn(4, 8)]))
def for_over_list(xs):
    acc = xs[0] * 0
    for t in xs:
        acc = acc + t.abs()
    return acc


@program(inputs([randn(4, 8), randn(4, 8)], [0.3, 0.7]))
def zip_weighted_sum(xs, weights):
    out = 0
    for t, w in zip(xs, weights):
        out = out + w * t
    return out


@program(inputs([randn(4, 8), randn(4, 8), randn(4, 8)]))
def enumerate_loop(xs):
    out = torch.zeros_like(xs[0])
    for i, t in enumerate(xs):
        out = out + (i + 1) * t
    return out


@program(inputs([randn(4, 8), randn(4, 8)], [2.0, -1.0]))
def generator_expression_sum(xs, weights):
    return sum(w * t.tanh() for t, w in zip(xs, weights))


@program(inputs(randn(4, 8), 8))
def while_on_python_int(x, n):
    steps = 0
    while n > 1:
        x = x.tanh() * 2
        n //= 2
        steps += 1
    return x, steps


@program(inputs(randn(4, 16)))
def while_halving_shape(x):
    size = x.shape[-1]
    while size > 2:
        x = x[..., : size // 2] + x[..., size // 2 :]
        size = x.shape[-1]
    return x


# -- branches on Python values and tensor metadata -----------------------------------------


@program(inputs(randn(4, 8), mode="gelu"))
def branch_on_string_arg(x, mode="relu"):
    if mode == "relu":
        return F.relu(x)
    elif mode == "gelu":
        return F.gelu(x)
    return x


@program(inputs(randn(4, 8), True, 3))
def ternary_and_bool_ops(x, flag, limit):
    y = x if flag else -x
    if flag and limit > 2 or not flag:
        y = y * 2
    return y.clamp(-limit, limit)


@program(inputs(randn(4, 8), 3))
def chained_comparison(x, n):
    if 0 < n <= 4:
        return x * n
    return x


@program(inputs(randn(4, 8)))
def branch_on_shape(x):
    if x.shape[-1] % 2 == 0:
        even, odd = x[..., ::2], x[..., 1::2]
        return even * odd
    return x


@program(inputs(randn(2, 3, 8)))
def shape_unpack_and_view(x):
    b, n, d = x.shape
    heads = 2
    y = x.view(b, n, heads, d // heads).transpose(1, 2)
    return y * 2, y.shape


@program(inputs(randn(8)))
def branch_on_ndim(x):
    if x.ndim == 1:
        x = x.unsqueeze(0)
    if x.dim() == 2:
        x = x.unsqueeze(1)
    return x * 2


@program(inputs(randn(4, 8, dtype=torch.float16), ints(10, 4, 8)))
def branch_on_dtype(x, ids):
    if x.dtype == torch.float16 or x.dtype == torch.bfloat16:
        x = x.float()
    if not ids.dtype.is_floating_point:
        ids = ids.to(x.dtype)
    return x.sigmoid() + ids, x.dtype


@program(inputs(randn(4, 8)))
def branch_on_device(x):
    if x.is_cuda:
        y = x * 2
    else:
        y = x * 3
    if x.device.type == "cpu":
        y = y + 1
    return y + torch.ones(x.shape, device=x.device, dtype=x.dtype)


@program(inputs(randn(4, 8), randn(4, 8), 0.5))
def isinstance_dispatch(x, a, b):
    def combine(t, other):
        if isinstance(other, torch.Tensor):
            return t + other
        elif isinstance(other, (int, float)):
            return t * other
        return t

    return combine(x, a) + combine(x, b)


@program(inputs(randn(4, 8), mask=const([[True] * 4 + [False] * 4] * 4, torch.bool)))
def optional_mask(x, mask=None):
    if mask is not None:
        x = torch.where(mask, x, 0.0)
    return x.exp()


@program(inputs(randn(4, 8), " GELU "))
def string_methods(x, act):
    act = act.lower().strip()
    if act.startswith("gel"):
        return F.gelu(x, approximate="tanh")
    return x


@program(inputs(randn(4, 8), [1, 2, 3]))
def walrus_on_len(x, xs):
    if (n := len(xs)) > 2:
        return x * n
    return x


# -- builtins, math, f-strings, assert, comprehensions --------------------------------------


@program(inputs(randn(4, 8), Options()))
def getattr_hasattr_on_object(x, opts):
    scale = getattr(opts, "scale", 1.0)
    if hasattr(opts, "bias"):
        x = x + opts.bias
    if hasattr(opts, "missing"):
        x = x * 100
    act = getattr(torch, opts.act)
    return act(x * scale)


@program(inputs(randn(4, 8)))
def getattr_functional_by_name(x):
    outs = []
    for name in ("relu", "gelu", "silu"):
        outs.append(getattr(F, name)(x))
    return outs


@program(inputs(randn(4, 8), [1, 2, 3]))
def len_builtin(x, xs):
    return x * len(xs) + len(x)


@program(inputs(randn(6, 8), 4))
def min_max_abs(x, k):
    n = min(x.shape[0], k)
    m = max(abs(k - 10), 2)
    return x[:n] * m, max(x.shape) - min(x.shape)


@program(inputs(randn(4, 8)))
def math_on_python_numbers(x):
    d = x.shape[-1]
    scale = 1.0 / math.sqrt(d)
    shift = math.log(2.0) - math.pi * math.cos(0.5) + math.exp(-1)
    return x * scale + shift, math.floor(math.log2(d)) + math.ceil(2.5)


@program(inputs(randn(4, 8)))
def fstring_keys(x):
    out = {}
    for i in range(3):
        out[f"layer_{i}"] = x * (i + 1)
    name = f"{x.shape[0]}x{x.shape[1]}:{x.dtype}"
    return out, name


@program(inputs(randn(4, 8), randn(4, 8)))
def assert_statements(x, y):
    assert x.shape == y.shape, f"shape mismatch {x.shape} vs {y.shape}"
    assert x.ndim == 2
    assert x.dtype == torch.float32, "float32 only"
    return x * y


@program(inputs([randn(4, 8), randn(4, 8), randn(4, 8)]))
def list_comprehension(xs):
    return [t.sin() * i for i, t in enumerate(xs) if i != 1]


@program(inputs(randn(4, 8)))
def dict_comprehension(x):
    return {f"pow{p}": x**p for p in range(1, 4)}


@program(inputs([randn(4, 8), randn(4, 8)]))
def nested_comprehension(xs):
    return [[t * a for a in (1.0, 2.0)] for t in xs]


@program(inputs(randn(4, 8)))
def int_arithmetic_from_shape(x):
    n = x.shape[0]
    half = n // 2
    rem = n % 3
    return x * (half + rem) - 2**half + n * 1.5


@program(inputs(randn(4, 8)))
def size_and_numel(x):
    return x * x.numel() / x.size(0) + x.size(-1), x.shape[1:], tuple(x.size())


# -- context managers, try, constants -------------------------------------------------------


@program(inputs(randn(4, 8)))
def no_grad_block(x):
    with torch.no_grad():
        y = x.sigmoid()
        inside = torch.is_grad_enabled()
    return y * 2, inside, torch.is_grad_enabled()


@program(inputs(randn(4, 8)), no_grad=True)
def enable_grad_block(x):
    with torch.enable_grad():
        y = x * 2
        inside = torch.is_grad_enabled()
    return y.cos(), inside, y.requires_grad


@program(inputs(randn(4, 8)))
def try_that_does_not_raise(x):
    try:
        y = x.exp()
    except RuntimeError:
        y = x
    else:
        y = y - 1
    finally:
        scale = 2.0
    return y * scale


@program(inputs(randn(4, 8), {"scale": 3.0}))
def try_key_lookup(x, opts):
    try:
        s = opts["scale"]
    except KeyError:
        s = 1.0
    return x * s


@program(inputs(randn(4, 8)))
def dataclass_global_config(x):
    cfg = CONFIG
    if cfg.act == "gelu":
        x = F.gelu(x)
    if cfg.residual:
        x = x + x * cfg.scale
    return x / (cfg.hidden + cfg.eps)


@program(inputs(randn(4, 8), ModelConfig(act="silu", residual=False)))
def dataclass_argument(x, cfg):
    y = F.silu(x) if cfg.act == "silu" else F.gelu(x)
    if cfg.residual:
        y = y + x
    return y * cfg.scale


@program(inputs(randn(4, 8)))
def plain_object_global(x):
    return getattr(torch, OPTIONS.act)(x * OPTIONS.scale) + OPTIONS.bias


@program(inputs(randn(4, 8)))
def global_constants(x):
    return x * SCALE + EPS


# -- tensor code people write ---------------------------------------------------------------


@program(inputs(randn(4, 8)))
def softmax_by_hand(x):
    e = (x - x.amax(dim=-1, keepdim=True)).exp()
    return e / e.sum(dim=-1, keepdim=True), F.softmax(x, dim=-1)


@program(inputs(randn(4, 8)))
def normalize_rows(x):
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + EPS)


@program(inputs(randn(4, 8), randn(8, 8), randn(8)))
def linear_then_matmul(x, w, b):
    return F.linear(x, w, b).relu() @ w


@program(inputs(randn(4, 8)))
def factory_functions(x):
    positions = torch.arange(x.shape[-1], device=x.device)
    return x + torch.ones_like(x) * 2 + torch.zeros(x.shape[-1], device=x.device) + positions


@program(inputs(randn(2, 6, 4), randn(9, 4)))
def arange_positions_and_steps(x, table):
    """arange of ints: positions as values (an embedding of them, steps, a start, a
    reversed range, an empty one) and arange of floats (PyTorch's own call)."""
    t = x.shape[1]
    pos = torch.arange(0, t, dtype=torch.long, device=x.device)
    steps = torch.arange(3, 3 + 2 * t, 2, device=x.device)
    down = torch.arange(t, 0, -2, device=x.device)
    empty = torch.arange(4, 4, device=x.device)
    halves = torch.arange(0.0, t / 2, 0.5, device=x.device)
    return (F.embedding(pos, table) + x, steps * 2, down, empty + 1, halves + x[0, :, 0],
            pos.float().mean())


@program(inputs(randn(4, 8)))
def dtype_casts(x):
    y = x.to(torch.float16)
    return y.float() * 2, y.dtype, (x * 4).to(torch.int32)


@program(inputs(randn(2, 3, 4)))
def permute_view_chain(x):
    return x.permute(2, 0, 1).contiguous().view(4, 6).t() * 2


@program(inputs(randn(4, 8), 0.1))
def where_with_python_threshold(x, threshold):
    return torch.where(x > threshold, x, x * 0.1)
