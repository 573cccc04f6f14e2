"""One row per pointwise op: everything each layer needs to know about it, in one place.

A :class:`Row` (the ``Op.op`` of the loop IR, a graph node's target) holds as plain data what
each layer reads: family and eager function (``ops.OPS``), torch spellings
(capture/torch_ops.py), ``float_meta`` (meta_rules.FLOAT_POINTWISE), the derivative
(passes/derivatives.py), Triton and C++ templates (codegen/), the interpreter's stand-in for
a libdevice call (runtime/triton_interp.py) and variants for other operand dtypes
(codegen/emitter.py).  Like the IR modules it imports only the standard library and torch.
Adding an op: CONTRIBUTING.md (``atan`` is the worked example).

Templates format the operands' variable names; ``{t}`` is the computed type, ``mc_*`` the
backends' helpers.  ``grad(d, x, y, g)`` gives a unary op's operand gradient from ``g``, with
``x`` and ``y`` thunks of the forward operand and result; :data:`ZERO`: zero almost
everywhere.  Binary ops' rules (un-broadcasting) stay in passes/derivatives.py.
"""

from __future__ import annotations

import dataclasses
import math
import operator
import re
from collections.abc import Callable
from typing import Any

import torch

ZERO = "zero"  # a derivative zero almost everywhere: no gradient flows
IDENTITY = "identity"  # a variant that is the operand itself (floor of an integer)


@dataclasses.dataclass(frozen=True)
class Row:
    name: str
    family: str  # "unary" | "binary" | "ternary" | "variant" (an emitter's choice only)
    eager: Callable[..., Any] | None
    triton: str
    cpp: str
    spellings: tuple[str, ...] = ()  # torch functions and methods capture maps onto it
    float_meta: bool = False  # on floats, metadata by promotion and broadcasting alone
    grad: Callable[..., Any] | str | None = None  # unary: the derivative (above)
    interp: str | None = None  # "tl" (tl.math has it) or numpy's function, for libdevice
    simd: bool = False  # glibc's libmvec has a vector version of std::<name>
    symbol: str | None = None  # the Python operator (BINARY_OP, COMPARE_OP) that spells it
    # The op an operand dtype uses instead: "int" (also bool's, unless "bool" says),
    # "bool", "f32" (computed in float32), "f64".
    variants: dict[str, str] = dataclasses.field(default_factory=dict)

    @property
    def libdevice(self) -> str | None:
        """The libdevice function the Triton template calls (what ``interp`` stands in for)."""
        found = re.search(r"libdevice\.(\w+)\(", self.triton)
        return found[1] if found else None


def _div_floor(a: Any, b: Any) -> Any:
    return operator.floordiv(a, b)


def _t(name: str, *more: str) -> tuple[str, ...]:
    """``torch.<name>`` and ``Tensor.<name>``, then ``more``."""
    return (f"torch.{name}", f"Tensor.{name}", *more)


_ERF_SCALE = 2.0 / math.sqrt(math.pi)

ROWS: tuple[Row, ...] = (
    # -- unary ------------------------------------------------------------------------------
    Row("neg", "unary", torch.neg, "-{0}", "static_cast<{t}>(-{0})",
        _t("neg", "torch.negative", "Tensor.negative"), True,
        lambda d, x, y, g: d("neg", g)),
    Row("abs", "unary", torch.abs, "tl.abs({0})", "static_cast<{t}>(std::abs({0}))",
        _t("abs", "torch.absolute", "Tensor.absolute"), True,
        lambda d, x, y, g: d("mul", g, d("sign", x()))),
    Row("sin", "unary", torch.sin, "libdevice.sin({0})", "std::sin({0})", _t("sin"), True,
        lambda d, x, y, g: d("mul", g, d("cos", x())), interp="tl", simd=True),
    Row("cos", "unary", torch.cos, "libdevice.cos({0})", "std::cos({0})", _t("cos"), True,
        lambda d, x, y, g: d("mul", g, d("neg", d("sin", x()))), interp="tl", simd=True),
    Row("tan", "unary", torch.tan, "libdevice.tan({0})", "std::tan({0})", _t("tan"), True,
        lambda d, x, y, g: d("mul", g, d("add", d("mul", y(), y()), 1.0)), interp="tan",
        simd=True),
    Row("exp", "unary", torch.exp, "libdevice.exp({0})", "std::exp({0})",
        _t("exp", "torch.special.exp"), True, lambda d, x, y, g: d("mul", g, y()),
        interp="tl", simd=True),
    Row("exp2", "unary", torch.exp2, "libdevice.exp2({0})", "std::exp2({0})",
        _t("exp2", "torch.special.exp2"), True,
        lambda d, x, y, g: d("mul", g, d("mul", y(), math.log(2.0))), interp="tl", simd=True),
    Row("expm1", "unary", torch.expm1, "libdevice.expm1({0})", "std::expm1({0})",
        _t("expm1", "torch.special.expm1"), True,
        lambda d, x, y, g: d("mul", g, d("add", y(), 1.0)), interp="expm1", simd=True),
    Row("log", "unary", torch.log, "libdevice.log({0})", "std::log({0})", _t("log"), True,
        lambda d, x, y, g: d("truediv", g, x()), interp="tl", simd=True),
    Row("log2", "unary", torch.log2, "libdevice.log2({0})", "std::log2({0})", _t("log2"), True,
        lambda d, x, y, g: d("truediv", g, d("mul", x(), math.log(2.0))), interp="tl",
        simd=True),
    Row("log1p", "unary", torch.log1p, "libdevice.log1p({0})", "std::log1p({0})",
        _t("log1p", "torch.special.log1p"), True,
        lambda d, x, y, g: d("truediv", g, d("add", x(), 1.0)), interp="log1p", simd=True),
    Row("sqrt", "unary", torch.sqrt, "libdevice.sqrt({0})", "std::sqrt({0})", _t("sqrt"), True,
        lambda d, x, y, g: d("truediv", g, d("mul", y(), 2.0)), interp="sqrt"),
    # d/dx x^-1/2 = -1/2 x^-3/2 = -1/2 y^3, as PyTorch's rsqrt_backward.
    Row("rsqrt", "unary", torch.rsqrt, "libdevice.rsqrt({0})",
        "static_cast<{t}>(1) / std::sqrt({0})", _t("rsqrt"), True,
        lambda d, x, y, g: d("mul", g, d("mul", d("mul", d("mul", y(), y()), y()), -0.5)),
        interp="tl"),
    Row("reciprocal", "unary", torch.reciprocal, "tl.math.div_rn(1.0, {0})",
        "static_cast<{t}>(1) / {0}", _t("reciprocal"), True,
        lambda d, x, y, g: d("mul", g, d("neg", d("mul", y(), y()))),
        variants={"f64": "reciprocal_f64"}),
    Row("tanh", "unary", torch.tanh, "libdevice.tanh({0})", "std::tanh({0})",
        _t("tanh", "F.tanh"), True,
        lambda d, x, y, g: d("mul", g, d("sub", 1.0, d("mul", y(), y()))), interp="tanh",
        simd=True),
    Row("sigmoid", "unary", torch.sigmoid, "1.0 / (1.0 + libdevice.exp(-{0}))",
        "static_cast<{t}>(1) / (static_cast<{t}>(1) + std::exp(-{0}))",
        _t("sigmoid", "F.sigmoid", "torch.special.expit"), True,
        lambda d, x, y, g: d("mul", g, d("mul", y(), d("sub", 1.0, y())))),
    Row("erf", "unary", torch.erf, "libdevice.erf({0})", "mc_erf({0})",
        _t("erf", "torch.special.erf"), True,
        lambda d, x, y, g: d("mul", g, d("mul", d("exp", d("neg", d("mul", x(), x()))),
                                         _ERF_SCALE)), interp="tl", simd=True),
    # (the worked example of adding an op: this row, and tests/backends/test_structure.py)
    Row("atan", "unary", torch.atan, "libdevice.atan({0})", "std::atan({0})",
        _t("atan", "torch.arctan", "Tensor.arctan"), True,
        lambda d, x, y, g: d("truediv", g, d("add", d("mul", x(), x()), 1.0)), interp="arctan"),
    Row("floor", "unary", torch.floor, "libdevice.floor({0})", "std::floor({0})", _t("floor"),
        grad=ZERO, interp="tl", variants={"int": IDENTITY}),
    Row("ceil", "unary", torch.ceil, "libdevice.ceil({0})", "std::ceil({0})", _t("ceil"),
        grad=ZERO, interp="tl", variants={"int": IDENTITY}),
    Row("trunc", "unary", torch.trunc, "libdevice.trunc({0})", "std::trunc({0})",
        _t("trunc", "torch.fix", "Tensor.fix"), grad=ZERO, interp="trunc",
        variants={"int": IDENTITY}),
    # (spelled by capture's own handler, which refuses decimals=)
    Row("round", "unary", torch.round, "libdevice.nearbyint({0})", "std::nearbyint({0})",
        grad=ZERO, interp="rint", variants={"int": IDENTITY}),
    Row("sign", "unary", torch.sign, "({0} > 0).to({t}) - ({0} < 0).to({t})",
        "static_cast<{t}>(({0} > 0) - ({0} < 0))", _t("sign"), grad=ZERO),
    Row("logical_not", "unary", torch.logical_not, "{0} == 0", "!{0}", _t("logical_not")),
    Row("bitwise_not", "unary", torch.bitwise_not, "~{0}", "static_cast<{t}>(~{0})",
        _t("bitwise_not"), variants={"bool": "bitwise_not_bool"}),
    # -- binary (Python operators give PyTorch's rules for a scalar on either side) ----------
    # torch's bool + and * are logical or and and (Triton's int1 arithmetic wraps); torch.add
    # and torch.sub are spelled by capture's own handlers (alpha=)
    Row("add", "binary", operator.add, "{0} + {1}", "{0} + {1}", (), True,
        variants={"bool": "logical_or"}, symbol="+"),
    Row("sub", "binary", operator.sub, "{0} - {1}", "{0} - {1}", (), True, symbol="-"),
    Row("mul", "binary", operator.mul, "{0} * {1}", "{0} * {1}",
        _t("mul", "torch.multiply", "Tensor.multiply"), True, variants={"bool": "logical_and"},
        symbol="*"),
    Row("truediv", "binary", operator.truediv, "{0} / {1}", "{0} / {1}", _t("true_divide"), True,
        variants={"f32": "truediv_f32"}, symbol="/"),
    Row("floordiv", "binary", _div_floor, "mc_floordiv({0}, {1})", "mc_floordiv({0}, {1})",
        _t("floor_divide"), variants={"int": "floordiv_int"}, symbol="//"),
    Row("remainder", "binary", operator.mod, "mc_remainder({0}, {1})",
        "mc_remainder({0}, {1})", _t("remainder"), variants={"int": "remainder_int"}, symbol="%"),
    # (torch.pow: capture's handler, whose second argument is ``exponent``)
    Row("pow", "binary", operator.pow, "libdevice.pow({0}, {1})", "std::pow({0}, {1})",
        interp="power", variants={"int": "pow_int"}, symbol="**"),
    Row("maximum", "binary", torch.maximum, "mc_maximum({0}, {1})", "mc_maximum({0}, {1})",
        _t("maximum"), True),
    Row("minimum", "binary", torch.minimum, "mc_minimum({0}, {1})", "mc_minimum({0}, {1})",
        _t("minimum"), True),
    Row("eq", "binary", operator.eq, "{0} == {1}", "{0} == {1}", _t("eq"), True, symbol="=="),
    Row("ne", "binary", operator.ne, "{0} != {1}", "{0} != {1}",
        _t("ne", "torch.not_equal", "Tensor.not_equal"), True, symbol="!="),
    Row("lt", "binary", operator.lt, "{0} < {1}", "{0} < {1}",
        _t("lt", "torch.less", "Tensor.less"), True, symbol="<"),
    Row("le", "binary", operator.le, "{0} <= {1}", "{0} <= {1}",
        _t("le", "torch.less_equal", "Tensor.less_equal"), True, symbol="<="),
    Row("gt", "binary", operator.gt, "{0} > {1}", "{0} > {1}",
        _t("gt", "torch.greater", "Tensor.greater"), True, symbol=">"),
    Row("ge", "binary", operator.ge, "{0} >= {1}", "{0} >= {1}",
        _t("ge", "torch.greater_equal", "Tensor.greater_equal"), True, symbol=">="),
    Row("logical_and", "binary", torch.logical_and, "{0} & {1}", "{0} && {1}",
        _t("logical_and")),
    Row("logical_or", "binary", torch.logical_or, "{0} | {1}", "{0} || {1}", _t("logical_or")),
    Row("logical_xor", "binary", torch.logical_xor, "{0} ^ {1}", "{0} != {1}",
        _t("logical_xor")),
    Row("bitwise_and", "binary", operator.and_, "{0} & {1}", "static_cast<{t}>({0} & {1})",
        _t("bitwise_and"), symbol="&"),
    Row("bitwise_or", "binary", operator.or_, "{0} | {1}", "static_cast<{t}>({0} | {1})",
        _t("bitwise_or"), symbol="|"),
    Row("bitwise_xor", "binary", operator.xor, "{0} ^ {1}", "static_cast<{t}>({0} ^ {1})",
        _t("bitwise_xor"), symbol="^"),
    Row("where", "ternary", torch.where, "tl.where({0}, {1}, {2})", "{0} ? {1} : {2}"),
    # -- variants: what the emitter spells an op as for some operand dtypes -----------------
    # IEEE division: Triton's "/" is approximate in float32.
    Row("truediv_f32", "variant", None, "tl.math.div_rn({0}, {1})", "{0} / {1}"),
    Row("reciprocal_f64", "variant", None, "1.0 / {0}", "static_cast<{t}>(1) / {0}"),
    Row("floordiv_int", "variant", None, "mc_floordiv_int({0}, {1})",
        "mc_floordiv_int({0}, {1})"),
    Row("remainder_int", "variant", None, "mc_remainder_int({0}, {1})",
        "mc_remainder_int({0}, {1})"),
    Row("pow_int", "variant", None, "mc_pow_int({0}, {1})", "mc_pow_int({0}, {1})"),
    Row("bitwise_not_bool", "variant", None, "{0} == 0", "!{0}"),
    # x ** 2 and x ** 3 of a float as PyTorch's pow kernels compute them (the correctly
    # rounded square; (x * x) * x), not through a general pow: an RMS norm's square, GPT-2's
    # tanh GELU (a general pow made its kernel 3x slower on an H200).
    Row("square", "variant", None, "{0} * {0}", "{0} * {0}"),
    Row("cube", "variant", None, "{0} * {0} * {0}", "{0} * {0} * {0}"),
)

BY_NAME: dict[str, Row] = {row.name: row for row in ROWS}
COMPARISONS = frozenset({"eq", "ne", "lt", "le", "gt", "ge"})
LOGICAL = frozenset({"logical_and", "logical_or", "logical_xor", "logical_not"})
