"""Random programs: a hypothesis strategy that writes small PyTorch functions from the ops
minicompile supports, and the check that a compiled run matches eager.

A :class:`Program` is Python source (``def f(x0, x1): ...``) plus how to make its inputs,
so a failure prints as a script anyone can paste and run (:meth:`Program.repro`).  Each
statement is chosen from the values made so far and checked at once on meta tensors (the
same expression text runs there), so every program is valid and hypothesis's shrinking
keeps it valid: an op that does not fit its operand becomes a plain ``sin``/``neg``.

Inputs cover ranks 0 to 3, sizes 0, 1 and more, float32/float64/float16/bfloat16, int32,
int64 and bool, and strides that are not contiguous (transposed, every other row, expanded
from a size-1 dim).  Ops: pointwise (unary, binary with broadcasting and Python scalars,
where, comparisons, casts), reductions (with and without dims, keepdim), views (permute,
transpose, reshape, slicing, select, narrow, unsqueeze, squeeze, expand, split/chunk),
index ops (index_select, gather, embedding with in-range indices), cat/stack, library calls
(matmul, flip, cumsum) and in-place ops on the program's own values and on inputs.

Floating-point results are exact only up to rounding, so ops whose output jumps on a tiny
change of their input (floor, comparisons, argmax, casts to integers) only take *exact*
operands: inputs, integers, and values made from them by exact ops (views, neg, abs, cat,
indexing, max/min).  Otherwise a difference in the last bit would show as a wrong answer.
"""

from __future__ import annotations

import dataclasses
import math
import textwrap
import warnings
from typing import Any

import torch
import torch.nn.functional as F
from hypothesis import strategies as st

FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
INTS = (torch.int32, torch.int64)
DTYPES = FLOATS + INTS + (torch.bool,)
SIZES = (0, 1, 2, 3, 5)
TOLERANCE = {  # rtol, atol: eager and compiled round at different points of a reduction
    torch.float16: (2e-3, 2e-3),
    torch.bfloat16: (1.6e-2, 1e-2),
    torch.float32: (1.3e-5, 1e-5),
    torch.float64: (1e-7, 1e-7),
}


@dataclasses.dataclass(frozen=True)
class Input:
    name: str
    base_shape: tuple[int, ...]  # the shape made, before the layout suffix
    dtype: torch.dtype
    layout: str  # source appended to the made tensor: "", ".transpose(-1, -2)", "[::2]"...
    bound: int = 0  # > 0: an index tensor with values in [0, bound)

    def make(self, generator: str, device: str = "cpu") -> str:
        """Source making this input (``generator``: the torch.Generator's name)."""
        shape = tuple(self.base_shape)
        dt = f"torch.{str(self.dtype).split('.')[1]}"
        if device == "meta":
            return f"torch.empty({shape}, dtype={dt}, device='meta'){self.layout}"
        if self.bound:
            made = f"torch.randint(0, {self.bound}, {shape}, generator={generator})"
        elif self.dtype.is_floating_point:
            made = f"torch.randn({shape}, generator={generator}).to({dt})"
        elif self.dtype == torch.bool:
            made = f"(torch.randn({shape}, generator={generator}) > 0)"
        else:
            made = f"torch.randint(-5, 6, {shape}, generator={generator}, dtype={dt})"
        return made + self.layout


@dataclasses.dataclass
class Program:
    inputs: list[Input]
    body: list[str]  # statements, `vN = <expr>`
    outputs: list[str]
    # The tolerance of the least precise dtype any value has: a float32 result computed
    # from a float16 one differs from eager's by that one's rounding (a product of three
    # float16 values, multiplied in another order, rounds to the neighbouring float16).
    tolerance: tuple[float, float] = (0.0, 0.0)

    @property
    def source(self) -> str:
        args = ", ".join(i.name for i in self.inputs)
        lines = [f"def f({args}):"] + [f"    {s}" for s in self.body]
        lines.append(f"    return ({', '.join(self.outputs)},)")
        return "\n".join(lines) + "\n"

    def function(self) -> Any:
        namespace = {"torch": torch, "F": F}
        exec(compile(self.source, "<random program>", "exec"), namespace)
        return namespace["f"]

    def make_inputs(self, seed: int) -> list[torch.Tensor]:
        g = torch.Generator().manual_seed(seed)
        return [eval(i.make("g"), {"torch": torch, "g": g}) for i in self.inputs]

    def repro(self, backend: str, problem: str) -> str:
        """A script that shows the failure on its own."""
        made = "\n".join(f"{i.name} = {i.make('g')}" for i in self.inputs)
        names = ", ".join(i.name for i in self.inputs)
        return textwrap.dedent("""\
            # {problem}
            import torch, minicompile
            import torch.nn.functional as F
            {source}
            g = torch.Generator().manual_seed(0)
            {made}
            args = [{names}]
            expected = f(*[a.clone() for a in args])
            actual = minicompile.compile(f, backend={backend!r})(*[a.clone() for a in args])
            for e, a in zip(expected, actual):
                torch.testing.assert_close(a, e, equal_nan=True)
            """).format(problem=problem.replace("\n", "\n# "), source=self.source.rstrip(),
                        made=made, names=names, backend=backend)


@dataclasses.dataclass
class Value:
    name: str
    meta: torch.Tensor  # on the meta device
    exact: bool  # no rounding error can have reached it
    owner: str  # "input" or "fresh": whose memory it views (in-place ops on "fresh" only)
    expanded: bool = False  # elements share memory (an in-place op would be an error)


# -- op templates: (text with {a} [{b}] [{d}...], accepts-dtype, result exact?) ------------

def _float(v: Value) -> bool:
    return v.meta.dtype.is_floating_point


UNARY_FLOAT = [
    "torch.sin({a})", "torch.cos({a})", "torch.exp({a}.clamp(-4, 4))", "torch.tanh({a})",
    "torch.sigmoid({a})", "torch.sqrt({a}.abs())", "torch.log1p({a}.abs())", "F.gelu({a})",
    "F.silu({a})", "torch.erf({a})", "{a} * 2.5", "{a} + 1", "{a} ** 2",
    "torch.rsqrt({a}.abs() + 1)", "torch.reciprocal({a}.abs() + 1)", "{a}.to(torch.float64)",
    "{a}.to(torch.float32)", "{a}.to(torch.bfloat16)", "torch.clamp({a}, -0.5, 0.5)",
    "F.softplus({a})", "torch.expm1({a}.clamp(-4, 4))", "torch.atan({a})",
]
UNARY_EXACT = [  # exact on exact operands of any dtype but bool
    "-{a}", "{a}.abs()", "torch.relu({a})", "{a} * 3", "{a} + 1", "{a} - 2",
]
UNARY_JUMPS = [  # discontinuous: only on exact operands
    "torch.floor({a} * 0.5)", "{a} > 0", "{a} == {a}.flip(-1)", "torch.sign({a})",
    "{a}.to(torch.int32)", "({a} * 4).round()", "torch.where({a} > 0, {a}, -{a})",
]
UNARY_INT = ["{a} // 2", "{a} % 3", "{a}.to(torch.float32)", "~{a}", "{a} * {a}"]
UNARY_BOOL = ["~{a}", "{a}.to(torch.int64)", "{a}.float()", "{a} & ~{a}"]
BINARY = [
    "{a} + {b}", "{a} - {b}", "{a} * {b}", "{a} / ({b}.abs() + 1)", "torch.maximum({a}, {b})",
    "torch.minimum({a}, {b})", "torch.where({a} > {b}, {a}, {b})", "{a} > {b}",
    "{a} == {b}", "torch.lerp({a}.float(), {b}.float(), 0.25)",
]
BINARY_EXACT_OK = {"torch.maximum({a}, {b})", "torch.minimum({a}, {b})"}
BINARY_JUMPS = {"torch.where({a} > {b}, {a}, {b})", "{a} > {b}", "{a} == {b}"}
REDUCE_FLOAT = [
    "{a}.sum({d})", "{a}.sum()", "{a}.mean({d}, keepdim=True)", "{a}.mean()", "{a}.var({d})",
    "{a}.std()", "torch.logsumexp({a}, {d})", "torch.softmax({a}, {d})",
    "torch.log_softmax({a}, {d})", "{a}.norm()", "{a}.prod({d})", "torch.cumsum({a}, {d})",
]
REDUCE_EXACT = [
    "{a}.amax({d})", "{a}.amin({d}, keepdim=True)", "{a}.max({d}).values", "{a}.min({d})[1]",
    "{a}.argmax({d})", "{a}.argmin()", "{a}.max()",
]
REDUCE_INT = ["{a}.sum({d})", "{a}.sum()", "{a}.prod({d})"]
REDUCE_BOOL = ["{a}.any({d})", "{a}.all()", "{a}.sum({d})"]
VIEWS = [
    "{a}.transpose({d}, {e})", "{a}.unsqueeze({d})", "{a}.squeeze()", "{a}.reshape(-1)",
    "{a}.flatten()", "{a}[1:]", "{a}[::2]", "{a}[..., :2]", "{a}.select({d}, 0)",
    "{a}.narrow({d}, 1, 1)", "{a}.chunk(2, {d})[0]", "{a}.split(2, {d})[-1]", "{a}.t()",
    "{a}.permute({perm})", "{a}.unsqueeze(0).expand(2, *{a}.shape)", "{a}.view({shape})",
    "{a}.reshape({shape})", "{a}.unbind({d})[0]", "{a}.contiguous()",
]
LIBRARY = ["{a} @ {a}.transpose(-1, -2)", "torch.flip({a}, [{d}])", "{a}.transpose(-1, -2) @ {a}"]
IN_PLACE = ["{a}.mul_(2)", "{a}.add_(1)", "{a}.clamp_(-1, 1)", "{a}.neg_()", "{a}.zero_()"]


def _meta_eval(expr: str, values: dict[str, Value]) -> torch.Tensor | None:
    env = {"torch": torch, "F": F, **{k: v.meta for k, v in values.items()}}
    try:
        out = eval(expr, env)
    except Exception:
        return None
    return out if isinstance(out, torch.Tensor) else None


def _fill(draw: Any, template: str, a: Value, b: Value | None) -> str:
    """The template with its operands, a dim, and shapes that fit ``a``."""
    rank = a.meta.dim()
    dims = list(range(-rank, rank)) if rank else [0]
    d = draw(st.sampled_from(dims))
    e = draw(st.sampled_from(dims))
    perm = list(range(rank))
    perm = draw(st.permutations(perm)) if rank else []
    numel = a.meta.numel()
    shapes = [(numel,), (-1,), (1, numel)]
    for k in (2, 3):
        if numel and numel % k == 0:
            shapes.append((k, numel // k))
            shapes.append((numel // k, 1, k))
    if numel == 0:
        shapes.append((0, 4))
    shape = draw(st.sampled_from(shapes))
    return template.format(a=a.name, b=b.name if b else "", d=d, e=e, perm=tuple(perm),
                           shape=shape)


def _broadcast_partner(draw: Any, a: Value, values: list[Value]) -> Value | None:
    fits = []
    for v in values:
        try:
            torch.broadcast_shapes(a.meta.shape, v.meta.shape)
        except RuntimeError:
            continue
        fits.append(v)
    return draw(st.sampled_from(fits)) if fits else None


def _choose(draw: Any, a: Value, values: list[Value]) -> tuple[str, Value | None, bool, bool]:
    """A template over ``a`` and maybe another value ``b``: (text, b, exact, in place)."""
    dtype = a.meta.dtype
    kind = draw(st.sampled_from(
        ["unary", "unary", "binary", "binary", "reduce", "view", "view", "index", "cat",
         "library", "in_place"]))
    b = None
    exact = False
    in_place = False
    if kind == "unary":
        if dtype == torch.bool:
            pool = UNARY_BOOL + (UNARY_JUMPS[:1] if a.exact else [])
        elif not dtype.is_floating_point:
            pool = UNARY_INT + UNARY_EXACT + UNARY_JUMPS
        else:
            pool = UNARY_FLOAT + UNARY_EXACT + (UNARY_JUMPS if a.exact else [])
        template = draw(st.sampled_from(pool))
        exact = a.exact and (template in UNARY_EXACT or template in UNARY_JUMPS
                             or not dtype.is_floating_point) and "float" not in template
    elif kind == "binary":
        b = _broadcast_partner(draw, a, values)
        template = draw(st.sampled_from(BINARY))
        both_exact = a.exact and b is not None and b.exact
        if template in BINARY_JUMPS and not both_exact:
            template = "{a} + {b}"
        if dtype == torch.bool and b is not None and b.meta.dtype == torch.bool and (
            template in ("{a} - {b}",)
        ):
            template = "{a} & {b}"
        exact = both_exact and (template in BINARY_EXACT_OK or template in BINARY_JUMPS)
    elif kind == "reduce":
        if dtype == torch.bool:
            pool = REDUCE_BOOL
        elif not dtype.is_floating_point:
            pool = REDUCE_INT + REDUCE_EXACT
        else:
            pool = REDUCE_FLOAT + (REDUCE_EXACT if a.exact else [])
        template = draw(st.sampled_from(pool))
        exact = a.exact and (template in REDUCE_EXACT or not dtype.is_floating_point)
    elif kind == "view":
        template = draw(st.sampled_from(VIEWS))
        exact = a.exact
    elif kind == "index":
        template = "index"
        exact = a.exact
    elif kind == "cat":
        b = draw(st.sampled_from([v for v in values if v.meta.dim() == a.meta.dim()]))
        template = draw(st.sampled_from(["torch.cat([{a}, {b}], {d})",
                                         "torch.stack([{a}, {b}], {d})"]))
        exact = a.exact and b.exact
    elif kind == "library":
        template = draw(st.sampled_from(LIBRARY))
        exact = a.exact and "flip" in template
    else:
        template = draw(st.sampled_from(IN_PLACE))
        in_place = True
        exact = a.exact and template in ("{a}.neg_()", "{a}.zero_()")
    return template, b, exact, in_place


@st.composite
def inputs(draw: Any, name: str) -> Input:
    rank = draw(st.integers(0, 3))
    shape = tuple(draw(st.sampled_from(SIZES)) for _ in range(rank))
    dtype = draw(st.sampled_from(DTYPES))
    layouts = ["", ""]
    if rank >= 2:
        layouts.append(".transpose(-1, -2)")
    if rank >= 1:
        layouts.append("[::2]")
        layouts.append(".expand")
    layout = draw(st.sampled_from(layouts))
    base = shape
    if layout == ".transpose(-1, -2)":
        base = shape[:-2] + (shape[-1], shape[-2])
    elif layout == "[::2]":
        base = (shape[0] * 2,) + shape[1:]
    elif layout == ".expand":
        d = draw(st.integers(0, rank - 1))
        base = shape[:d] + (1,) + shape[d + 1:]
        layout = f".expand{shape}"
    return Input(name, base, dtype, layout)


@st.composite
def programs(draw: Any, max_ops: int = 5) -> Program:
    """A random program of 1 to ``max_ops`` statements over 1 to 3 inputs."""
    n_inputs = draw(st.integers(1, 3))
    ins = [draw(inputs(f"x{k}")) for k in range(n_inputs)]
    values: dict[str, Value] = {}
    for i in ins:
        meta = eval(i.make("g", device="meta"), {"torch": torch})
        values[i.name] = Value(i.name, meta, True, "input", ".expand" in i.layout)
    body: list[str] = []
    for k in range(draw(st.integers(1, max_ops))):
        a = draw(st.sampled_from(list(values.values())))
        template, b, exact, in_place = _choose(draw, a, list(values.values()))
        if in_place and a.expanded:
            in_place, template = False, "-{a}"
        name = f"v{k}"
        if template == "index":
            expr = _index_expr(draw, a, ins, values)
        else:
            expr = _fill(draw, template, a, b) if b is not None or "{b}" not in template else None
        meta = _meta_eval(expr, values) if expr else None
        if meta is None:  # does not fit: an op every tensor takes
            expr = f"-{a.name}" if a.meta.dtype != torch.bool else f"~{a.name}"
            meta, exact, in_place = _meta_eval(expr, values), a.exact, False
        expanded = a.expanded and meta._base is not None
        owner = a.owner if (in_place or meta._base is not None) else "fresh"
        values[name] = Value(name, meta, exact, owner, expanded)
        body.append(f"{name} = {expr}")
    made = [n for n in values if n.startswith("v")]
    extra = draw(st.sampled_from(made))
    outputs = [made[-1]] + ([extra] if extra != made[-1] else [])
    tolerances = [TOLERANCE.get(v.meta.dtype, (0.0, 0.0)) for v in values.values()]
    return Program(ins, body, outputs, max(tolerances))


def _index_expr(draw: Any, a: Value, ins: list[Input], values: dict[str, Value]) -> str | None:
    """index_select / gather / embedding of ``a`` with a new int64 input in range."""
    kind = draw(st.sampled_from(["index_select", "gather", "embedding"]))
    rank = a.meta.dim()
    if rank == 0:
        return None
    d = draw(st.integers(0, rank - 1))
    size = a.meta.shape[d]
    if size == 0:
        return None
    name = f"x{len(ins)}"
    n = draw(st.sampled_from(SIZES))
    if kind == "index_select":
        idx = Input(name, (n,), torch.int64, "", bound=size)
        expr = f"{a.name}.index_select({d}, {name})"
    elif kind == "gather":
        shape = tuple(min(s, draw(st.sampled_from(SIZES))) if j != d else n
                      for j, s in enumerate(a.meta.shape))
        idx = Input(name, shape, torch.int64, "", bound=size)
        expr = f"torch.gather({a.name}, {d}, {name})"
    else:
        if rank != 2 or not a.meta.dtype.is_floating_point or a.meta.shape[0] == 0:
            return None
        idx = Input(name, (n, 2), torch.int64, "", bound=a.meta.shape[0])
        expr = f"F.embedding({name}, {a.name})"
    ins.append(idx)
    values[name] = Value(name, eval(idx.make("g", "meta"), {"torch": torch}), True, "input")
    return expr


# -- comparing with eager ------------------------------------------------------------------

def _close(actual: torch.Tensor, expected: torch.Tensor, least: tuple[float, float]
           ) -> str | None:
    if actual.dtype != expected.dtype or actual.shape != expected.shape:
        return (f"got {actual.dtype}{list(actual.shape)}, eager gives "
                f"{expected.dtype}{list(expected.shape)}")
    rtol, atol = TOLERANCE.get(expected.dtype, (0.0, 0.0))
    if expected.dtype.is_floating_point:  # no closer than the least precise value allows
        rtol, atol = max(rtol, least[0]), max(atol, least[1])
    # A reduction of n values carries up to about n roundings of its terms.
    scale = max(1.0, math.sqrt(max(1, expected.numel())))
    try:
        torch.testing.assert_close(actual, expected, rtol=rtol * scale, atol=atol * scale,
                                   equal_nan=True)
    except AssertionError as e:
        return str(e).strip().splitlines()[0] + " " + " ".join(str(e).split("\n")[1:4])
    return None


def compare(program: Program, compiled: Any, seed: int) -> tuple[str | None, bool]:
    """Whether the compiled function matches eager on inputs from ``seed`` (outputs and
    every input after the call): (what differs or None, whether eager raised)."""
    fn = program.function()
    args = program.make_inputs(seed)
    eager_args = [a.clone() for a in args]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # PyTorch's own (var() of one value...)
            expected = fn(*eager_args)
    except Exception as e:  # the program raises in eager: compiled must raise the same
        try:
            compiled(*args)
        except type(e):
            return None, True
        except Exception as c:
            return f"eager raises {type(e).__name__}: {e}; compiled {type(c).__name__}: {c}", True
        return f"eager raises {type(e).__name__}: {e}; compiled returns", True
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            actual = compiled(*args)
    except Exception as e:
        return f"compiled raises {type(e).__name__}: {e}", False
    ours = [str(w.message) for w in caught if str(w.message).startswith("minicompile")]
    if ours:  # a fallback to eager warns: a finding too
        return f"warning: {ours[0]}", False
    for k, (a, e) in enumerate(zip(actual, expected)):
        problem = _close(a, e, program.tolerance)
        if problem:
            return f"output {k}: {problem}", False
    for k, (a, e) in enumerate(zip(args, eager_args)):
        problem = _close(a, e, program.tolerance)
        if problem:
            return f"input {program.inputs[k].name} after the call: {problem}", False
    return None, False


def check_program(program: Program, backend: str) -> str | None:
    """Compile ``program`` for ``backend`` and compare it with eager on two sets of values;
    None when they agree and it compiled as one graph (unless eager raises), else what
    went wrong."""
    import minicompile

    minicompile.reset()
    compiled = minicompile.compile(program.function(), backend=backend)
    raised = False
    for seed in (0, 1):
        problem, eager_raised = compare(program, compiled, seed)
        raised = raised or eager_raised
        if problem is not None:
            return f"values from seed {seed}: {problem}"
    counts = minicompile.stats()
    one_graph = not counts["eager_fallbacks"] and not counts["graph_breaks"] and (
        counts["graphs"] == 1)
    if not raised and not one_graph:
        return f"not compiled as one graph: {counts}"
    return None
