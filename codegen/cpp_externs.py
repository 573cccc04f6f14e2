"""Library calls ("extern kernels") as calls of ATen's C++ API, for exported libraries.

The C++ wrapper calls the ATen function named as the Python one (``at::conv2d`` for
``torch.nn.functional.conv2d``), its arguments bound to one of the operator's schemas and
written out in schema order, defaults included, as typed C++ values.  A value that fits no
schema is refused (:class:`Unsupported`, naming the call), never guessed.  Functions whose
Python argument order differs from ATen's (``F.batch_norm``) are decomposed before here.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable

import sympy
import torch

from minicompile.errors import Unsupported
from minicompile.ir import AliasOutput, BufferRef, ExternKernel

from minicompile.codegen.cpp import CPP
from minicompile.codegen.printers import cpp_index

# ATen's C++ names of dtypes.
ATEN_DTYPES: dict[torch.dtype, str] = {
    torch.float64: "at::kDouble",
    torch.float32: "at::kFloat",
    torch.float16: "at::kHalf",
    torch.bfloat16: "at::kBFloat16",
    torch.int64: "at::kLong",
    torch.int32: "at::kInt",
    torch.int16: "at::kShort",
    torch.int8: "at::kChar",
    torch.uint8: "at::kByte",
    torch.bool: "at::kBool",
    torch.complex64: "at::kComplexFloat",
    torch.complex128: "at::kComplexDouble",
}

# Where PyTorch's Python namespaces put their functions among ATen's operators.
_PREFIXES = (
    ("torch.nn.functional.", ""),
    ("torch.Tensor.", ""),
    ("torch.special.", "special_"),
    ("torch.linalg.", "linalg_"),
    ("torch.fft.", "fft_"),
    ("torch.", ""),
)


# ATen operators that are Tensor methods only (no at:: function).
_METHODS_ONLY = frozenset({"new_ones", "new_zeros", "new_empty", "new_full",
                           "new_empty_strided"})


class _NoFit(Exception):
    """A value does not fit the schema argument at hand (try the next overload)."""


@dataclasses.dataclass(frozen=True)
class ExternCall:
    expr: str  # the C++ expression computing the result
    header: str  # the ATen header declaring the function
    returns_tuple: bool  # std::tuple result: elements by std::get<k>


def aten_name(op: str) -> str | None:
    """The ATen operator behind a Python library function's dotted path, or None."""
    for prefix, aten_prefix in _PREFIXES:
        if op.startswith(prefix):
            name = aten_prefix + op[len(prefix):]
            return name if "." not in name else None
    return None


def extern_call(ext: ExternKernel, value: Callable[[object], str]) -> ExternCall:
    """``ext`` as a call of ATen's C++ API.  ``value(arg)`` is the C++ text of a tensor
    argument (a BufferRef, or an AliasOutput view)."""
    if ext.op == "torch.Tensor.__getitem__":
        return _index(ext, value)
    if ext.kwargs.get("return_indices") is False:  # (Python's flag: aten's max_poolNd has none)
        ext = dataclasses.replace(ext, kwargs={k: v for k, v in ext.kwargs.items()
                                               if k != "return_indices"})
    name = aten_name(ext.op)
    packet = getattr(torch.ops.aten, name, None) if name else None
    if packet is None or not hasattr(packet, "overloads"):
        raise Unsupported(f"export: the library call {ext.op} ({', '.join(ext.origins)}) has no "
                          f"ATen operator to call from C++")
    overloads = sorted(packet.overloads(), key=lambda o: o != "default")
    for overload in overloads:
        schema = getattr(packet, overload)._schema
        if not _callable_from_cpp(overload, schema):
            continue
        try:
            args = _bind(schema, ext.args, ext.kwargs, value)
        except _NoFit:
            continue
        returns_tuple = len(schema.returns) > 1
        call = (f"{args[0]}.{name}({', '.join(args[1:])})" if name in _METHODS_ONLY
                else f"at::{name}({', '.join(args)})")
        return ExternCall(call, f"ATen/ops/{name}.h", returns_tuple)
    raise Unsupported(
        f"export: the library call {ext.op} ({', '.join(ext.origins)}) with these arguments "
        f"fits no schema of aten::{name} that C++ can call")


def _index(ext: ExternKernel, value: Callable[[object], str]) -> ExternCall:
    """``x[i, j]`` by index tensors (advanced indexing, as eager's ``aten::index``)."""
    source, index = ext.args
    tensors = index if isinstance(index, (tuple, list)) else (index,)
    if ext.kwargs or not all(isinstance(t, (BufferRef, AliasOutput))
                             for t in (source, *tensors)):
        raise Unsupported(f"export: the library call {ext.op} ({', '.join(ext.origins)}) "
                          f"indexes by other than tensors, which C++ does not call")
    indices = ", ".join(f"std::optional<at::Tensor>({value(t)})" for t in tensors)
    return ExternCall(f"at::index({value(source)}, {{{indices}}})", "ATen/ops/index.h", False)


def _callable_from_cpp(overload: str, schema: torch.FunctionSchema) -> bool:
    """Functional overloads of at::: not TorchScript's prim_ ones, not out= or in-place."""
    if overload.startswith("prim_") or "out" in overload.split("_"):
        return False
    if any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments):
        return False
    return all(str(r.type) == "Tensor" for r in schema.returns) and len(schema.returns) >= 1


def _bind(schema: torch.FunctionSchema, args: tuple, kwargs: dict,
          value: Callable[[object], str]) -> list[str]:
    """The C++ arguments, in schema order (defaults written out), or _NoFit."""
    params = schema.arguments
    positional = [a for a in params if not a.kwarg_only]
    if len(args) > len(positional):
        raise _NoFit
    given: dict[str, object] = {a.name: v for a, v in zip(positional, args)}
    for key, v in kwargs.items():
        key = "self" if key == "input" and all(a.name != "input" for a in params) else key
        if key in given or all(a.name != key for a in params):
            raise _NoFit
        given[key] = v
    out = []
    for a in params:
        if a.name in given:
            out.append(_cpp_value(a, given[a.name], value))
        elif a.has_default_value():
            out.append(_cpp_value(a, a.default_value, value))
        else:
            raise _NoFit
    return out


def _cpp_value(arg: torch.Argument, v: object, value: Callable[[object], str]) -> str:
    """``v`` as a C++ value of the schema argument's type, or _NoFit."""
    typ = str(getattr(arg, "real_type", arg.type))
    optional = typ.startswith("Optional[")
    if optional:
        typ = typ[len("Optional["):-1]
        if v is None:
            return "std::nullopt"
    text = _plain_value(typ, arg, v, value)
    return f"{_OPTIONALS[typ]}({text})" if optional and typ in _OPTIONALS else text


def _plain_value(typ: str, arg: torch.Argument, v: object,
                 value: Callable[[object], str]) -> str:
    if typ == "Tensor":
        if not isinstance(v, (BufferRef, AliasOutput)):
            raise _NoFit
        return value(v)
    if typ == "List[Tensor]":
        if not isinstance(v, (tuple, list)) or not all(
                isinstance(x, (BufferRef, AliasOutput)) for x in v):
            raise _NoFit
        return f"std::vector<at::Tensor>{{{', '.join(value(x) for x in v)}}}"
    if typ == "List[int]":
        return f"std::vector<int64_t>{{{', '.join(_int_list(v, arg.N))}}}"
    if typ == "int":
        return _int(v)
    if typ == "float":
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise _NoFit
        return _double(float(v))
    if typ == "bool":
        if not isinstance(v, bool):
            raise _NoFit
        return "true" if v else "false"
    if typ == "number":
        if isinstance(v, bool):
            return f"at::Scalar({'true' if v else 'false'})"
        if isinstance(v, float):
            return f"at::Scalar({_double(v)})"
        return f"at::Scalar({_int(v)})"
    if typ == "str":
        if not isinstance(v, str):
            raise _NoFit
        return f"c10::string_view({json.dumps(v)})"
    if typ == "ScalarType":
        if not isinstance(v, torch.dtype) or v not in ATEN_DTYPES:
            raise _NoFit
        return ATEN_DTYPES[v]
    if typ in _OPTION_TYPES:
        return _option(typ, v)
    raise _NoFit  # generators, complex numbers, dimension names: not exported


_OPTION_TYPES = {"Device": "at::Device", "Layout": "at::Layout",
                 "MemoryFormat": "at::MemoryFormat"}
# The C++ type of an optional argument, where it is not the plain type's.
_OPTIONALS = {"List[int]": "at::OptionalIntArrayRef", "int": "std::optional<int64_t>",
              "float": "std::optional<double>", "bool": "std::optional<bool>",
              "ScalarType": "std::optional<at::ScalarType>",
              **{typ: f"std::optional<{c}>" for typ, c in _OPTION_TYPES.items()}}
_LAYOUTS = {torch.strided: "at::kStrided"}
_MEMORY_FORMATS = {
    torch.contiguous_format: "at::MemoryFormat::Contiguous",
    torch.channels_last: "at::MemoryFormat::ChannelsLast",
    torch.channels_last_3d: "at::MemoryFormat::ChannelsLast3d",
    torch.preserve_format: "at::MemoryFormat::Preserve",
}


def _option(typ: str, v: object) -> str:
    """A tensor option: a device (the library's, ``mc_device``), a layout, a memory format."""
    if typ == "Device":
        if isinstance(v, str):
            v = torch.device(v)
        if not isinstance(v, torch.device) or v.type not in ("cpu", "cuda"):
            raise _NoFit
        return "mc_device"
    table = _LAYOUTS if typ == "Layout" else _MEMORY_FORMATS
    if v not in table:  # type: ignore[operator]
        raise _NoFit
    return table[v]  # type: ignore[index]


def _int(v: object) -> str:
    if isinstance(v, bool) or not isinstance(v, (int, sympy.Expr)):
        raise _NoFit
    if isinstance(v, sympy.Expr) and not v.is_integer:
        raise _NoFit
    return f"int64_t{{{cpp_index(sympy.Integer(v) if isinstance(v, int) else v)}}}"


def _int_list(v: object, n: int | None) -> list[str]:
    if isinstance(v, (int, sympy.Expr)) and not isinstance(v, bool):
        return [_int(v)] * (n or 1)  # Python broadcasts one int to an int[N]
    if not isinstance(v, (tuple, list)):
        raise _NoFit
    return [_int(x) for x in v]


def _double(v: float) -> str:
    return repr(v) if math.isfinite(v) else CPP.special(v)
