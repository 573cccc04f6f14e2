"""Side effects on Python state, and the generated glue that replays them.

Tracing never mutates user objects: writes to objects that existed before the call are
logged in :class:`SideEffects`.  The generated ``rebuild(outs, *frame)`` evaluates every
value first, then copies mutated input tensors, replays the final state of attributes,
globals, cells and containers, and returns the value (built from the caller's objects).
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable
from typing import Any

import torch

from minicompile.capture import concrete, kinds, records
from minicompile.runtime import values
from minicompile.runtime.values import write_back, write_backs
from minicompile.capture.variables import (
    BoundMethodVar, CellVar, ConstantVar, DictVar, ListVar, MethodVar, SYMBOLIC_TYPES, NullVar,
    NewObjectVar, ObjectVar, PartialVar, RecordVar, SizeVar, StructSeqVar, TensorVar, TupleVar, Var,
)
from minicompile.errors import Unsupported
from minicompile.graph import Node


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


class Rebuild:
    """The writer of ``rebuild``: ``expr(v)`` spells a tracker as source (each kind by its
    ``kinds.rebuild`` rule), reading graph outputs (``outs[i]``) and making each object of
    the trace once, in statements before the return value (``lines``)."""

    def __init__(self, out: kinds.Output) -> None:
        self.out, self.g = out, out.guards
        self.outputs: list[Node] = []
        self._index: dict[Node, int] = {}
        self.lines: list[str] = []
        self.made: dict[int, str] = {}  # objects of the trace, made once each (they may share)
        self._temps = 0

    def expr(self, v: Var) -> str:
        return kinds.rebuild(self, self.out.realize(v))

    def output(self, node: Node) -> str:
        if node not in self._index:
            self._index[node] = len(self.outputs)
            self.outputs.append(node)
        return f"outs[{self._index[node]}]"

    def temp(self, value_expr: str) -> str:
        name = f"_v{self._temps}"
        self._temps += 1
        self.lines.append(f"    {name} = {value_expr}")
        return name

    def key(self, k: Any) -> str:
        return repr(k) if _literal_ok(k) else self.g.ref(k, "key")

    def items(self, items: Any) -> str:
        return ", ".join(self.expr(i) for i in items)

    def mapping(self, items: dict) -> str:
        """A dict display of ``items``: keys spelled by :meth:`key`, values by :meth:`expr`."""
        return "{" + ", ".join(f"{self.key(k)}: {self.expr(i)}" for k, i in items.items()) + "}"

    def value_text(self, value: Any) -> str:
        """A Python value of the trace as source: symbolic sizes as expressions of the
        frame's tensors' shapes, sequences item by item."""
        if isinstance(value, SYMBOLIC_TYPES):
            return self.out.graph.shapes.python_source(value)
        if type(value) in (tuple, list):
            inner = ", ".join(self.value_text(v) for v in value)
            if type(value) is list:
                return f"[{inner}]"
            return f"({inner},)" if value else "()"  # "(,)" is not Python
        return repr(value)

    def view_of_root(self, v: TensorVar, alias_ok: bool = False) -> str | None:
        """``v`` as a real view of its root here (of the caller's tensor or array for an
        input, of the graph's output otherwise), so an in-place op after a graph break
        reaches the root.  None when the steps cannot be written down, or only alias when
        not ``alias_ok`` (``detach`` is another tensor; an array of ``t.numpy()`` is not)."""
        root = v.base
        if root is None:
            return None
        if id(root) in self.out.array_inputs:
            if root.meta.device.type != "cpu":  # a copy on the GPU: no shared memory
                return None
            base = f"{self.g.ref(values.to_tensor, 'to_tensor')}({root.source.expr})"
        elif root.source is not None:
            base = root.source.expr
        elif all(step.kind == "alias" for step in v.view) and not alias_ok:
            return None
        else:
            base = self.expr(root)
        return view_expr(base, v.view, self.value_text)


def generate_rebuild(out: kinds.Output, result: Var) -> tuple[list[Node], str]:
    """The graph outputs and the source of ``rebuild(outs, *frame)`` (see the module doc)."""
    r = Rebuild(out)
    r.lines.append(f"    ret = {r.expr(result)}")
    replays = _replays(r, out.side_effects)
    pairs: list[tuple[str, str]] = []
    needs_no_grad = False
    for var in out.mutated_inputs.values():
        if var.node is out.input_nodes[id(var)]:
            continue  # written, but with its own value
        assert var.source is not None
        pairs.append((var.source.expr, r.output(var.node)))
        needs_no_grad = needs_no_grad or var.meta.requires_grad
    writebacks = [f"{r.g.ref(write_back, 'write_back')}({', '.join(p)})" for p in pairs]
    if len(pairs) > 1:  # one call: the copies batched (values.write_backs)
        dsts, srcs = ("".join(f"{x}, " for x in xs) for xs in zip(*pairs))
        writebacks = [f"{r.g.ref(write_backs, 'write_backs')}(({dsts}), ({srcs}))"]
    if needs_no_grad:
        r.lines.append(f"    with {r.g.ref(torch.no_grad, 'no_grad')}():")
        r.lines.extend(f"        {w}" for w in writebacks)
    else:
        r.lines.extend(f"    {w}" for w in writebacks)
    r.lines.extend(replays)
    r.lines.append("    return ret")
    params = ", ".join(["outs", *out.params])
    return r.outputs, f"def rebuild({params}):\n" + "\n".join(r.lines) + "\n"


def _replays(r: Rebuild, fx: SideEffects) -> list[str]:
    """The logged writes, their values computed first (into temporaries)."""
    replays: list[str] = []
    for var in fx.containers.values():
        assert var.source is not None
        if isinstance(var, ListVar):
            items = r.temp(f"[{r.items(var.items)}]")
            replays.append(f"    {var.source.expr}[:] = {items}")
        else:
            assert isinstance(var, DictVar)
            items = r.temp(r.mapping(var.items))
            replays.append(f"    {var.source.expr}.clear()")
            replays.append(f"    {var.source.expr}.update({items})")
    for obj, writes in fx.attrs.values():
        assert obj.source is not None
        for name, value in writes.items():
            replays.append(f"    {obj.source.expr}.{name} = {r.temp(r.expr(value))}")
    for (_, name), (dict_expr, value) in fx.globals.items():
        replays.append(f"    {dict_expr}[{name!r}] = {r.temp(r.expr(value))}")
    for cell in fx.cells.values():
        assert cell.source is not None and cell.contents is not None
        replays.append(f"    {cell.source.expr} = {r.temp(r.expr(cell.contents))}")
    return replays


# -- each kind's spelling in rebuild ---------------------------------------------------------


@kinds.rebuild.register(TensorVar)
def _tensor(r: Rebuild, v: TensorVar) -> str:
    if v.source is not None:
        return v.source.expr
    return r.view_of_root(v) or r.output(v.node)


@kinds.rebuild.register(ConstantVar)
def _constant(r: Rebuild, v: ConstantVar) -> str:
    if isinstance(v.value, SYMBOLIC_TYPES):
        # A size of a dynamic capture: recomputed from the frame's tensors on each call.
        return r.out.graph.shapes.python_source(v.value)
    return repr(v.value) if _literal_ok(v.value) else r.g.ref(v.value, "const")


@kinds.rebuild.register(SizeVar)
def _size(r: Rebuild, v: SizeVar) -> str:
    if any(isinstance(i, ConstantVar) and isinstance(i.value, SYMBOLIC_TYPES) for i in v.items):
        return f"{r.g.ref(torch.Size, 'Size')}(({r.items(v.items)},))"
    return r.g.ref(r.out.to_value(v), "const")


@kinds.rebuild.register(StructSeqVar)
def _struct_seq(r: Rebuild, v: StructSeqVar) -> str:
    if v.cls is None:
        return _tuple(r, v)
    return f"{r.g.ref(v.cls, v.cls.__name__)}(({r.items(v.items)},))"


@kinds.rebuild.register(TupleVar)
def _tuple(r: Rebuild, v: TupleVar) -> str:
    return f"({r.items(v.items)},)" if len(v.items) == 1 else f"({r.items(v.items)})"


@kinds.rebuild.register(NewObjectVar)
def _new_object(r: Rebuild, v: NewObjectVar) -> str:
    if id(v) not in r.made:
        r.made[id(v)] = name = r.temp(f"{r.g.ref(values.new_object, 'new_object')}("
                                      f"{r.g.ref(v.cls, v.cls.__name__)}, {{}})")
        r.lines.append(f"    {name}.__dict__.update({r.mapping(v.attrs)})")
    return r.made[id(v)]


@kinds.rebuild.register(RecordVar)
def _record(r: Rebuild, v: RecordVar) -> str:
    if records.plain_model_output(v):
        build = r.g.ref(values.model_output, "model_output")
        return (f"{build}({r.g.ref(v.cls, v.cls.__name__)}, {r.mapping(v.fields)}, "
                f"{tuple(v.keys)!r})")
    init = r.mapping(v.init)
    writes = "".join(f"({kind!r}, {name!r}, {r.expr(i)}), " for kind, name, i in v.writes)
    build = r.g.ref(values.build_record, "build_record")
    return f"{build}({r.g.ref(v.cls, v.cls.__name__)}, {init}, ({writes}))"


@kinds.rebuild.register(ListVar)
@kinds.rebuild.register(DictVar)
def _container(r: Rebuild, v: ListVar | DictVar) -> str:
    if not v.mutable and v.source is not None:
        return v.source.expr  # the caller's own object (mutations are replayed on it)
    if isinstance(v, ListVar):
        return f"[{r.items(v.items)}]"
    return r.mapping(v.items)


@kinds.rebuild.register(ObjectVar)
def _object(r: Rebuild, v: ObjectVar) -> str:
    if v.source is not None:
        return v.source.expr
    return r.g.ref(v.value, getattr(v.value, "__name__", "obj"))


# What a value stack holds at a graph break (see segments.py).
kinds.rebuild.register(NullVar, lambda r, v: r.g.ref(concrete.NULL, "NULL"))
kinds.rebuild.register(MethodVar, lambda r, v: f"getattr({r.expr(v.obj)}, {v.name!r})")


@kinds.rebuild.register(PartialVar)
def _partial(r: Rebuild, v: PartialVar) -> str:
    if v.source is not None:
        return v.source.expr
    args = "".join(f", {r.expr(a)}" for a in v.args)
    kwargs = f", **{r.mapping(v.kwargs)}" if v.kwargs else ""
    return f"{r.g.ref(functools.partial, 'partial')}({r.expr(v.func)}{args}{kwargs})"


@kinds.rebuild.register(BoundMethodVar)
def _bound_method(r: Rebuild, v: BoundMethodVar) -> str:
    method = r.g.ref(types.MethodType, "MethodType")
    return f"{method}({r.g.ref(v.func, 'fn')}, {r.expr(v.self_var)})"


def view_expr(base: str, steps: tuple, fmt: Callable[[Any], str] = repr) -> str | None:
    """``base`` seen through view ``steps`` as a Python expression on the real tensor
    (None when a step cannot be written down).  ``fmt`` writes the steps' arguments
    (sizes of a dynamic capture as expressions of the frame's tensors' shapes)."""
    text = base
    for step in steps:
        k, a = step.kind, step.args
        if k in ("select", "unsqueeze", "squeeze", "diagonal", "as_strided"):
            text = f"{text}.{k}({', '.join(fmt(x) for x in a)})"
        elif k == "slice":
            dim, start, stop, stride = a
            key = ", ".join([":"] * dim + [f"{fmt(start)}:{fmt(stop)}:{fmt(stride)}"])
            text = f"{text}[{key}]"
        elif k in ("permute", "expand", "reshape"):
            method = "view" if k == "reshape" else k
            text = f"{text}.{method}({fmt(tuple(a[0]))})"
        elif k != "alias":
            return None
    return text


def _literal_ok(value: Any) -> bool:
    if type(value) is float:
        return value == value and value not in (float("inf"), float("-inf"))
    return type(value) in (bool, int, str, bytes, type(None))
