"""Side effects on Python state, and the generated glue that replays them.

Tracing never mutates user objects.  Writes to objects that existed before the call
(attribute writes, ``STORE_GLOBAL``, ``nonlocal`` writes to closure cells, ``append`` /
``__setitem__`` / ... on lists and dicts read from the frame) are logged in
:class:`SideEffects`; later reads in the same trace see the logged values.  After the graph
runs, the generated ``rebuild(outs, *frame)`` function:

1. evaluates the return value and every value to be stored (graph outputs, constants,
   frame objects), before anything changes, as eager computed them before the writes;
2. copies the new contents of mutated input tensors into the caller's tensors;
3. replays the writes: the final value of each attribute, global and cell, and the final
   contents of each mutated container (``lst[:] = ...`` keeps the caller's list object);
4. returns the value, built from the caller's own objects where the frame returned them
   (``return x.add_(1)`` returns the caller's ``x``, as eager does).
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from minicompile.capture import concrete, records
from minicompile.runtime import values
from minicompile.runtime.values import write_back
from minicompile.capture.variables import (
    ArrayVar,
    BoundMethodVar,
    CellVar,
    ConstantVar,
    DictVar,
    ListVar,
    MethodVar,
    SYMBOLIC_TYPES,
    NullVar,
    NewObjectVar,
    ObjectVar,
    PartialVar,
    RecordVar,
    SizeVar,
    StructSeqVar,
    TensorVar,
    TupleVar,
    Var,
)
from minicompile.errors import Unsupported
from minicompile.graph import Node

if TYPE_CHECKING:
    from minicompile.capture.output import OutputGraph


class SideEffects:
    def __init__(self) -> None:
        self.attrs: dict[int, tuple[Var, dict[str, Var]]] = {}  # id(obj) -> (tracker, writes)
        self.globals: dict[tuple[int, str], tuple[str, Var]] = {}  # -> (dict expr, value)
        self.containers: dict[int, Var] = {}  # pre-existing lists/dicts that were mutated
        self.cells: dict[int, CellVar] = {}

    def __bool__(self) -> bool:
        return bool(self.attrs or self.globals or self.containers or self.cells)

    def store_attr(self, obj: ObjectVar, name: str, value: Var) -> None:
        if obj.source is None:
            raise Unsupported(f"attribute write on {obj.describe()} reached without a source")
        self.attrs.setdefault(id(obj.value), (obj, {}))[1][name] = value

    def load_attr(self, obj: ObjectVar, name: str) -> Var | None:
        entry = self.attrs.get(id(obj.value))
        return entry[1].get(name) if entry else None

    def store_global(self, f_globals: dict, dict_expr: str, name: str, value: Var) -> None:
        self.globals[(id(f_globals), name)] = (dict_expr, value)

    def load_global(self, f_globals: dict, name: str) -> Var | None:
        entry = self.globals.get((id(f_globals), name))
        return entry[1] if entry else None

    def mutate_container(self, var: ListVar | DictVar, what: str) -> None:
        """``var`` is about to be mutated in place."""
        if var.mutable:
            return  # built by this trace: nothing outside sees it
        if var.source is None:
            raise Unsupported(f"{what} on {var.describe()} reached without a source (mutation)")
        self.containers[id(var)] = var

    def store_cell(self, cell: CellVar, value: Var) -> None:
        cell.contents = value
        if not cell.local:
            if cell.source is None:
                raise Unsupported("assignment to a closure variable without a source")
            self.cells[id(cell)] = cell


def generate_rebuild(out: OutputGraph, result: Var) -> tuple[list[Node], str]:
    """The graph outputs and the source of ``rebuild(outs, *frame)`` (see the module doc)."""
    g = out.guards
    outputs: list[Node] = []
    index: dict[Node, int] = {}

    def output(node: Node) -> str:
        if node not in index:
            index[node] = len(outputs)
            outputs.append(node)
        return f"outs[{index[node]}]"

    def value_text(value: Any) -> str:
        """A Python value of the trace as source: symbolic sizes as expressions of the
        frame's tensors' shapes, sequences item by item."""
        if isinstance(value, SYMBOLIC_TYPES):
            return out.graph.shapes.python_source(value)
        if type(value) in (tuple, list):
            inner = ", ".join(value_text(v) for v in value)
            if type(value) is list:
                return f"[{inner}]"
            return f"({inner},)" if value else "()"  # "(,)" is not Python
        return repr(value)

    def expr(v: Var) -> str:
        v = out.realize(v)
        if isinstance(v, ArrayVar):
            return array(v)
        if isinstance(v, TensorVar):
            if v.source is not None:
                return v.source.expr
            return view_of_root(v) or output(v.node)
        if isinstance(v, ConstantVar) and isinstance(v.value, SYMBOLIC_TYPES):
            # A size of a dynamic capture: recomputed from the frame's tensors on each call.
            return out.graph.shapes.python_source(v.value)
        if isinstance(v, SizeVar) and any(isinstance(i, ConstantVar) and isinstance(
                i.value, SYMBOLIC_TYPES) for i in v.items):
            inner = ", ".join(expr(i) for i in v.items)
            return f"{g.ref(torch.Size, 'Size')}(({inner},))"
        if isinstance(v, SizeVar) or (isinstance(v, ConstantVar) and not _literal_ok(v.value)):
            return g.ref(out.to_value(v), "const")
        if isinstance(v, ConstantVar):
            return repr(v.value)
        if isinstance(v, StructSeqVar) and v.cls is not None:
            inner = ", ".join(expr(i) for i in v.items)
            return f"{g.ref(v.cls, v.cls.__name__)}(({inner},))"
        if isinstance(v, TupleVar):
            inner = ", ".join(expr(i) for i in v.items)
            return f"({inner},)" if len(v.items) == 1 else f"({inner})"
        if isinstance(v, NewObjectVar):
            return new_object(v)
        if isinstance(v, RecordVar):
            init = ", ".join(f"{k!r}: {expr(i)}" for k, i in v.init.items())
            writes = "".join(f"({kind!r}, {name!r}, {expr(i)}), " for kind, name, i in v.writes)
            build = g.ref(records.build_record, "build_record")
            return f"{build}({g.ref(v.cls, v.cls.__name__)}, {{{init}}}, ({writes}))"
        if isinstance(v, (ListVar, DictVar)) and not v.mutable and v.source is not None:
            return v.source.expr  # the caller's own object (mutations are replayed on it)
        if isinstance(v, ListVar):
            return "[" + ", ".join(expr(i) for i in v.items) + "]"
        if isinstance(v, DictVar):
            items = ", ".join(f"{key(k)}: {expr(i)}" for k, i in v.items.items())
            return "{" + items + "}"
        if isinstance(v, ObjectVar):
            if v.source is not None:
                return v.source.expr
            return g.ref(v.value, getattr(v.value, "__name__", "obj"))
        # What a value stack holds at a graph break (see segments.py).
        if isinstance(v, NullVar):
            return g.ref(concrete.NULL, "NULL")
        if isinstance(v, MethodVar):
            return f"getattr({expr(v.obj)}, {v.name!r})"
        if isinstance(v, PartialVar):
            if v.source is not None:
                return v.source.expr
            args = "".join(f", {expr(a)}" for a in v.args)
            kwargs = ", ".join(f"{k!r}: {expr(i)}" for k, i in v.kwargs.items())
            return (f"{g.ref(functools.partial, 'partial')}({expr(v.func)}{args}"
                    f"{f', **{{{kwargs}}}' if kwargs else ''})")
        if isinstance(v, BoundMethodVar):
            return f"{g.ref(types.MethodType, 'MethodType')}({g.ref(v.func, 'fn')}, {expr(v.self_var)})"
        raise Unsupported(f"{v.describe()} cannot leave the compiled region (returned/stored)")

    def key(k: Any) -> str:
        return repr(k) if _literal_ok(k) else g.ref(k, "key")

    lines: list[str] = []
    replays: list[str] = []
    fx = out.side_effects
    n = 0

    def temp(value_expr: str) -> str:
        nonlocal n
        name = f"_v{n}"
        n += 1
        lines.append(f"    {name} = {value_expr}")
        return name

    made: dict[int, str] = {}  # objects of the trace, made once each (they may share)

    def new_object(v: NewObjectVar) -> str:
        if id(v) not in made:
            made[id(v)] = name = temp(f"{g.ref(records.new_object, 'new_object')}("
                                      f"{g.ref(v.cls, v.cls.__name__)}, {{}})")
            attrs = ", ".join(f"{k!r}: {expr(i)}" for k, i in v.attrs.items())
            lines.append(f"    {name}.__dict__.update({{{attrs}}})")
        return made[id(v)]

    def view_of_root(v: TensorVar, alias_ok: bool = False) -> str | None:
        """``v`` as a real view of its root's value here, as eager has it: a view of an
        input is one of the caller's tensor (or of the caller's NumPy array, through
        ``torch.from_numpy``), a view of a tensor the graph made is one of that output,
        so an in-place op after a graph break reaches the root.  None when the steps
        cannot be written down, or only alias when not ``alias_ok`` (``detach`` is another
        tensor; an array of ``t.numpy()`` is not)."""
        root = v.base
        if root is None:
            return None
        if id(root) in out.array_inputs:
            if root.meta.device.type != "cpu":  # a copy on the GPU: no shared memory
                return None
            base = f"{g.ref(values.to_tensor, 'to_tensor')}({root.source.expr})"
        elif root.source is not None:
            base = root.source.expr
        elif all(step.kind == "alias" for step in v.view) and not alias_ok:
            return None
        else:
            base = expr(root)
        return view_expr(base, v.view, value_text)

    def array(v: ArrayVar) -> str:
        """A NumPy array or scalar of the trace, made once (``a is b`` stays true), over
        the memory NumPy's would share (a view of an input array is a view of it)."""
        if v.source is not None:
            return v.source.expr
        if id(v) not in made:
            convert = values.to_scalar if v.scalar else values.to_numpy
            tensor = view_of_root(v.tensor, alias_ok=True)
            if tensor is None and v.tensor.base is not None and out.at_break:
                raise Unsupported("a view of a NumPy array that leaves the graph as a copy "
                                  "(a[::-1], or on a GPU) is live at a graph break")
            tensor = tensor or output(v.tensor.node)
            made[id(v)] = temp(f"{g.ref(convert, convert.__name__)}({tensor})")
        return made[id(v)]

    lines.append(f"    ret = {expr(result)}")

    for var in fx.containers.values():
        assert var.source is not None
        if isinstance(var, ListVar):
            items = temp("[" + ", ".join(expr(i) for i in var.items) + "]")
            replays.append(f"    {var.source.expr}[:] = {items}")
        else:
            assert isinstance(var, DictVar)
            body = ", ".join(f"{key(k)}: {expr(i)}" for k, i in var.items.items())
            items = temp("{" + body + "}")
            replays.append(f"    {var.source.expr}.clear()")
            replays.append(f"    {var.source.expr}.update({items})")
    for obj, writes in fx.attrs.values():
        assert obj.source is not None
        for name, value in writes.items():
            replays.append(f"    {obj.source.expr}.{name} = {temp(expr(value))}")
    for (_, name), (dict_expr, value) in fx.globals.items():
        replays.append(f"    {dict_expr}[{name!r}] = {temp(expr(value))}")
    for cell in fx.cells.values():
        assert cell.source is not None and cell.contents is not None
        replays.append(f"    {cell.source.expr} = {temp(expr(cell.contents))}")

    writebacks: list[str] = []
    needs_no_grad = False
    for var in out.mutated_inputs.values():
        if var.node is out.input_nodes[id(var)]:
            continue  # written, but with its own value
        assert var.source is not None
        writebacks.append(f"{g.ref(write_back, 'write_back')}({var.source.expr}, "
                          f"{output(var.node)})")
        needs_no_grad = needs_no_grad or var.meta.requires_grad
    if needs_no_grad:
        lines.append(f"    with {g.ref(torch.no_grad, 'no_grad')}():")
        lines.extend(f"        {w}" for w in writebacks)
    else:
        lines.extend(f"    {w}" for w in writebacks)
    lines.extend(replays)
    lines.append("    return ret")
    params = ", ".join(["outs", *out.params])
    return outputs, f"def rebuild({params}):\n" + "\n".join(lines) + "\n"


def view_expr(base: str, steps: tuple, fmt: Callable[[Any], str] = repr) -> str | None:
    """``base`` seen through view ``steps`` as a Python expression on the real tensor
    (None when a step cannot be written down).  ``fmt`` writes the steps' arguments
    (sizes of a dynamic capture as expressions of the frame's tensors' shapes)."""
    text = base
    for step in steps:
        k, a = step.kind, step.args
        if k == "select":
            text = f"{text}.select({fmt(a[0])}, {fmt(a[1])})"
        elif k == "slice":
            dim, start, stop, stride = a
            key = ", ".join([":"] * dim + [f"{fmt(start)}:{fmt(stop)}:{fmt(stride)}"])
            text = f"{text}[{key}]"
        elif k in ("unsqueeze", "squeeze"):
            text = f"{text}.{k}({fmt(a[0])})"
        elif k in ("permute", "expand", "reshape"):
            method = "view" if k == "reshape" else k
            text = f"{text}.{method}({fmt(tuple(a[0]))})"
        elif k == "diagonal":
            text = f"{text}.diagonal({fmt(a[0])}, {fmt(a[1])}, {fmt(a[2])})"
        elif k == "as_strided":
            text = f"{text}.as_strided({fmt(a[0])}, {fmt(a[1])}, {fmt(a[2])})"
        elif k != "alias":
            return None
    return text


def _literal_ok(value: Any) -> bool:
    if type(value) is float:
        return value == value and value not in (float("inf"), float("-inf"))
    return type(value) in (bool, int, str, bytes, type(None))
