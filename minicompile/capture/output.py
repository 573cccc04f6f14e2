"""The state one capture builds, shared by the root translator and the inlined ones.

:class:`OutputGraph` owns the :class:`Graph`, the :class:`GuardBuilder` and the inputs; it
wraps frame values (:mod:`frame_values`), makes call nodes (:meth:`op`), converts trackers
to and from plain values (:meth:`to_value` / :meth:`from_value`) and generates the per-call
functions (:meth:`finish`).
"""

from __future__ import annotations

import dataclasses
import enum
import types
from collections.abc import Callable
from typing import Any

import sympy
import torch

from minicompile import compat, ops
from minicompile.capture import externs, kinds, mutation
from minicompile.capture.autocast import AutocastState
from minicompile.capture.dynamic import STATIC, DynamicPolicy
from minicompile.capture.frame_values import FrameValuesMixin, python_size
from minicompile.capture.guard_builder import GuardBuilder
from minicompile.capture.segments import has_catching_handlers
from minicompile.capture.side_effects import SideEffects, generate_rebuild
from minicompile.capture.variables import (
    ConstantVar, DictVar, ListVar, ObjectVar, SizeVar, StructSeqVar, TensorVar, TupleVar,
    UserObjectVar, Var, is_constant_value, leaves, map_leaves,
)
from minicompile.errors import ShapeError, SourceLine, Unsupported
from minicompile.graph import Graph, Node, TensorMeta
from minicompile.runtime.guard_render import inputs_source
from minicompile.runtime.guards import Guards


# Graph view ops and how a view made by one is described (see mutation.ViewStep).
_VIEW_OPS = frozenset({"permute", "expand", "unsqueeze", "squeeze"})
# Ops whose results never require grad, whatever their inputs (eager's autograd agrees).
NON_DIFFERENTIABLE = frozenset({
    "detach", "torch.Tensor.detach", "torch.detach", "torch.argmax", "torch.argmin",
    "torch.Tensor.argmax", "torch.Tensor.argmin", "torch.zeros_like", "torch.ones_like",
    "torch.empty_like",
    "torch.Tensor.new_zeros", "torch.Tensor.new_ones", "torch.Tensor.new_empty",
    "torch.rand_like", "torch.randn_like", "torch.randint_like", "torch.full_like",
    "torch.Tensor.new_full"})
MAX_INSTRUCTIONS = 100_000


@dataclasses.dataclass
class Capture:
    graph: Graph  # placeholders in input order, named after their sources ("L_x", "G_w")
    input_sources: list[str]  # readable source per placeholder: "L['x']", "G['w']"
    get_inputs: Callable[..., list[torch.Tensor]]  # get_inputs(*layout) -> placeholder tensors
    guards: Guards
    rebuild: Callable[..., Any]  # rebuild(graph outputs, *layout) -> return value
    ops: int  # number of call nodes
    get_inputs_source: str = ""
    rebuild_source: str = ""
    instructions: int = 0  # bytecode instructions interpreted to make it
    compiled: Any = None  # (run, call) when the API built it already (dynamic shapes)
    # (graph output, placeholder) index pairs that rebuild copies back (mutated inputs).
    writebacks: tuple[tuple[int, int], ...] = ()
    # Every code object the trace interpreted (the frame's and the functions it inlined):
    # what a warm entry on disk is keyed by (minicompile/runtime/entries.py).
    codes: frozenset[types.CodeType] = frozenset()
    # Whether a try / except / finally / with in those codes may catch an exception the
    # graph raises (which it raises outside those blocks: the API then runs the code for
    # real, where they see it).
    handlers: bool = False

    def __str__(self) -> str:
        return "\n".join(
            [str(self.graph), "", str(self.guards), self.get_inputs_source, self.rebuild_source])


class OutputGraph(FrameValuesMixin):
    def __init__(self, name: str, params: list[str], dynamic: DynamicPolicy = STATIC) -> None:
        self.graph = Graph(name)
        self.dynamic = dynamic
        self.params = params
        self.guards = GuardBuilder(params)
        self.codes: set[types.CodeType] = set()  # the code objects interpreted
        self.input_sources: list[str] = []
        self.input_exprs: list[str] = []
        self._wrapped: dict[str, Var] = {}
        self._idents: set[str] = set()
        self.tx: kinds.Translator | None = None  # the translator running now
        # Mutable objects read from the frame, by identity: a second source for the same
        # object gives the same tracker plus an `is` guard (aliased inputs, tied weights).
        self._by_id: dict[int, Var] = {}
        self._values: list[Any] = []  # keeps the objects behind _by_id alive
        self.input_values: list[torch.Tensor] = []  # the traced tensor per placeholder
        self.input_vars: list[TensorVar] = []
        self.input_nodes: dict[int, Node] = {}  # id(input tracker) -> its placeholder
        # id(input tracker) -> the NumPy array it reads (capture/numpy_arrays.py)
        self.array_inputs: dict[int, Any] = {}
        self.mutated_inputs: dict[int, TensorVar] = {}  # roots to write back, in order
        self.views: dict[int, list[TensorVar]] = {}  # id(root) -> live views of it
        self.side_effects = SideEffects()
        self.at_break = False  # finish() makes the values live at a graph break
        self.initial_grad = self.grad_enabled = torch.is_grad_enabled()
        self.autocast = AutocastState()  # the traced torch.autocast state (capture/autocast.py)
        self.instructions = 0

    def user_stack(self) -> tuple[SourceLine, ...]:
        return self.tx.user_stack() if self.tx is not None else ()

    # -- trackers <-> plain values ---------------------------------------------------------

    def to_value(self, var: Var) -> Any:
        """The plain value torch_ops and constant folding work on: TensorVars stay, constants
        and known objects become themselves, containers are rebuilt."""
        return kinds.to_value(self, self.realize(var))

    def to_values(self, args: Any, kwargs: dict) -> tuple[tuple, dict]:
        """The plain values of a call's arguments."""
        return tuple(map(self.to_value, args)), {k: self.to_value(v) for k, v in kwargs.items()}

    def require_pinned(self, operands: Any, what: str) -> None:
        """Unsupported (a graph break) when an operand, or an item of one, is an object the
        guards know only by its type: computing with it while tracing would bake this
        call's contents into the segment for later calls that pass ``type(v) is C``.
        Enum members are immutable: an identity guard pins them."""
        for var in operands:
            kinds.require_pinned(self, self.realize(var), what)

    @kinds.require_pinned.register(UserObjectVar)
    def _pin_object(self, var: UserObjectVar, what: str) -> None:
        if not isinstance(var.value, enum.Enum):
            raise Unsupported(f"{what} on {type(var.value).__module__}.{type(var.value).__name__}: "
                              "its contents are not guarded, so the trace cannot compute with them",
                              hint="the operation runs for real (graph break)")
        if var.source is not None and not var.source.trusted:
            self.guards.identity_match(var.source, var.value)

    def from_value(self, value: Any) -> Var:
        """The inverse of :meth:`to_value`, for results of folding and torch_ops."""
        if isinstance(value, Var):
            return value
        if isinstance(value, torch.Tensor):
            raise Unsupported("a real tensor appeared during tracing")
        if type(value) is torch.Size:
            return SizeVar(tuple(ConstantVar(python_size(s)) for s in value))
        if type(value) is tuple:
            return TupleVar(tuple(self.from_value(v) for v in value))
        if type(value) is list:
            return ListVar([self.from_value(v) for v in value])
        if type(value) is dict:
            return DictVar({k: self.from_value(v) for k, v in value.items()})
        if is_constant_value(value):
            return ConstantVar(value)
        return self.object_var(value, None)

    # -- graph nodes -----------------------------------------------------------------------

    def op(
        self, name: str, args: tuple, kwargs: dict[str, Any] | None = None, track: bool = True
    ) -> TensorVar:
        """Append ``name(*args, **kwargs)`` (args hold TensorVars) to the graph.  Anything
        eager would reject (bad shapes, dtypes, mixed devices) is Unsupported, so the
        frame runs eagerly and PyTorch raises its own error."""
        kwargs = kwargs or {}
        tensors = [v for v in leaves((args, kwargs)) if isinstance(v, TensorVar)]
        devices = sorted({str(t.meta.device) for t in tensors})
        if len(devices) > 1:
            raise Unsupported(f"{name}: tensors on different devices ({', '.join(devices)})")
        for v in leaves((args, kwargs)):
            if not isinstance(v, TensorVar) and not _graph_constant(v):
                raise Unsupported(f"{name}: argument of type {type(v).__name__} is not supported")
        node_args, node_kwargs = map_leaves(args, _to_node), map_leaves(kwargs, _to_node)
        if self.graph.shapes is not None:
            node_args, node_kwargs = self.sizes_to_sympy((node_args, node_kwargs))
        try:
            if tensors:
                meta = ops.infer_meta(
                    name, node_args, node_kwargs, tensors[0].meta.device, self.graph.shapes)
            elif self.graph.shapes is not None and ops.has_symbols((node_args, node_kwargs)):
                # A factory with symbolic sizes (torch.arange(n)): on fake tensors, placed
                # on the device it names.
                device = torch.device(node_kwargs.get("device") or torch.get_default_device())
                meta = ops.infer_meta(name, node_args, node_kwargs, device, self.graph.shapes)
            else:
                meta = _factory_meta(ops.OPS[name].eager, node_args, node_kwargs)
        except Unsupported:
            raise
        except Exception as e:
            msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            if self.graph.shapes is not None:  # maybe only PyTorch's symbolic rules fail:
                raise ShapeError(f"{name}: {type(e).__name__}: {msg}") from e  # retry static
            raise Unsupported(f"{name}: eager PyTorch raises {type(e).__name__}: {msg}",
                              raises=True) from e
        meta = self._with_grad(name, meta, tensors)
        stack = self.user_stack()
        node = self.graph.call(name, node_args, node_kwargs, meta=meta, stack=stack)
        if isinstance(meta, tuple):
            items = tuple(TensorVar(self.graph.call("getitem", (node, i), {}, meta=m, stack=stack))
                          for i, m in enumerate(meta))
            return TupleVar(items)  # type: ignore[return-value]
        result = TensorVar(node)
        if track and name in _VIEW_OPS:
            mutation.register_view(self, result, args[0], (mutation.ViewStep(name, args[1:]),))
        return result

    def _with_grad(self, name: str, meta: Any, tensors: list) -> Any:
        """``meta`` marked as requiring grad where eager's result would: grad mode on, an
        input requiring grad, a differentiable op and a floating-point result.  The
        autograd pass (passes/autograd.py) differentiates exactly the nodes marked."""
        grad = (self.grad_enabled and name not in NON_DIFFERENTIABLE
                and any(t.meta.requires_grad for t in tensors))
        if isinstance(meta, tuple):
            return tuple(self._with_grad(name, m, tensors) for m in meta)
        grad = grad and (meta.dtype.is_floating_point or meta.dtype.is_complex)
        return dataclasses.replace(meta, requires_grad=grad) if grad != meta.requires_grad else meta

    def extern(self, fn: Any, args: tuple, kwargs: dict, track: bool = True) -> Any:
        """``fn(*args, **kwargs)`` as one extern node (args hold TensorVars).  A result
        that is a view of an argument (found on meta tensors) is recorded as one, unless
        ``track`` is False (replays of views made by capture itself)."""
        fname = externs.public_name(fn)
        if fname is None:
            raise Unsupported(f"{externs._describe(fn)} is not supported")
        try:
            name = ops.extern_op(fn)
        except ValueError as e:
            raise Unsupported(f"{fname}: {e}") from e
        if kwargs.get("requires_grad"):
            raise Unsupported(f"{fname}(requires_grad=True): autograd is not supported yet")
        result = self.op(name, args, kwargs, track=False)
        short = fname.rpartition(".")[2]
        # (an operator's results are plain tuples, never views: its schema was checked)
        operator = isinstance(fn, externs.OPERATORS)
        if isinstance(result, TupleVar) and not operator:
            cls = getattr(torch.return_types, short, None)
            fields = getattr(cls, "__match_args__", None)
            if fields:
                result = StructSeqVar(result.items, fields=tuple(fields), cls=cls)
        if track and short in externs.MAYBE_VIEW and not operator:
            self._track_views(fn, short, args, kwargs, result)
        return result

    def _track_views(self, fn: Any, short: str, args: tuple, kwargs: dict, result: Any) -> None:
        sources = [a for a in leaves((args, kwargs)) if isinstance(a, TensorVar)]
        if not sources:
            return
        shapes = self.graph.shapes  # symbolic sizes stay symbolic (no guard on their hints)
        fakes = {id(v): shapes.fake(v.meta.shape, v.meta.stride, v.meta.dtype, device=v.meta.device)
                 if shapes is not None else v.meta.fake()
                 for v in sources}
        try:
            fake_args, fake_kwargs = map_leaves(
                (args, kwargs), lambda v: fakes[id(v)] if isinstance(v, TensorVar) else v)
            res = (shapes.run(fn, *fake_args, **fake_kwargs) if shapes is not None
                   else fn(*fake_args, **fake_kwargs))
        except Exception:
            return
        by_fake = {id(f): v for v in sources for f in [fakes[id(v)]]}
        outs = list(result.items) if isinstance(result, TupleVar) else [result]
        reals = list(res) if isinstance(res, (tuple, list)) else [res]
        for k, (var, r) in enumerate(zip(outs, reals)):
            if not isinstance(r, torch.Tensor):
                continue
            src = by_fake.get(id(r)) or by_fake.get(id(r._base))
            if src is None:
                continue
            index = k if isinstance(result, TupleVar) else None
            steps = externs.view_steps(fn, short, fakes[id(src)], r, args, kwargs, index)
            mutation.register_view(self, var, src, steps)

    def note_mutation(self, root: TensorVar) -> None:
        """``root`` was rebound by an in-place op; inputs are written back after the graph."""
        if id(root) in self.input_nodes and id(root) not in self.mutated_inputs:
            self.mutated_inputs[id(root)] = root

    # -- the end of the trace --------------------------------------------------------------

    def finish(self, result: Var) -> Capture:
        """Close the graph on the value the frame returns and generate get_inputs and
        rebuild (flat Python, compiled once)."""
        if self.grad_enabled != self.initial_grad:
            raise Unsupported("grad mode changed outside a `with` block (set_grad_enabled)")
        g = self.guards
        g.grad_mode()
        if self.graph.shapes is not None:
            g.shape_relations(self.graph.shapes)
        outputs, rebuild_src = generate_rebuild(self, result)
        if self.mutated_inputs:
            self._check_no_shared_storage()
            if self.array_inputs:
                from minicompile.capture import numpy_arrays

                numpy_arrays.check_mutated_inputs(self)
        self.graph.output(outputs)
        scalars = []  # Python ints that are size symbols: passed after the tensors
        if self.graph.shapes is not None:
            shapes = self.graph.shapes
            scalars = [shapes.sources[s].expr for s in shapes.scalar_symbols()]
        items = self.input_exprs + scalars
        inputs_src = inputs_source(self.params, items)
        guards = g.build()  # the namespace is final now
        ns = guards.namespace
        exec(compile(rebuild_src, "<minicompile rebuild>", "exec"), ns)
        exec(compile(inputs_src, "<minicompile inputs>", "exec"), ns)
        get_inputs = guards.reading(ns["get_inputs"], items)
        return Capture(
            graph=self.graph, input_sources=list(self.input_sources), get_inputs=get_inputs,
            guards=guards, rebuild=ns["rebuild"], ops=sum(1 for _ in self.graph.calls()),
            get_inputs_source=inputs_src, rebuild_source=rebuild_src,
            instructions=self.instructions, writebacks=self._writebacks(outputs, rebuild_src),
            codes=frozenset(self.codes), handlers=any(map(has_catching_handlers, self.codes)))

    def _writebacks(self, outputs: list[Node], rebuild_src: str) -> tuple[tuple[int, int], ...]:
        """Which graph output rebuild copies into which input (by placeholder position) and
        uses for nothing else (not returned, not stored): a backend may store those
        outputs in place."""
        position = {node: k for k, node in enumerate(self.graph.placeholders)}
        out_index = {node: k for k, node in enumerate(outputs)}
        return tuple((out_index[var.node], position[self.input_nodes[id(var)]])
                     for var in self.mutated_inputs.values()
                     if var.node is not self.input_nodes[id(var)] and var.node in out_index
                     and rebuild_src.count(f"outs[{out_index[var.node]}]") == 1)

    def _check_no_shared_storage(self) -> None:
        """Mutated inputs must not share memory with other inputs (``f(x, x[0])``): the
        graph treats inputs as independent.  Refused now, guarded for later calls."""
        tensors = [(t, e) for t, e, v in zip(self.input_values, self.input_exprs, self.input_vars)
                   if id(v) not in self.array_inputs]  # arrays: numpy_arrays checks them
        if compat.storage_count(tuple(t for t, _ in tensors)) != len(tensors):
            raise Unsupported("an input mutated in place shares memory with another input")
        self.guards.distinct_storages([e for _, e in tensors])


def _graph_constant(value: Any) -> bool:
    return type(value) is torch.Size or value is None or (
        is_constant_value(value) and not isinstance(value, types.CodeType))


def _factory_meta(fn: Any, args: tuple, kwargs: dict) -> TensorMeta:
    """Metadata of a tensor built from Python values (``torch.ones(3)``), made on the meta
    device so nothing is allocated."""
    kw = dict(kwargs)
    device = torch.device(kw.pop("device", None) or torch.get_default_device())
    result = fn(*args, **kw, device="meta")
    if not isinstance(result, torch.Tensor):
        raise Unsupported(f"{fn.__name__} did not produce a tensor")
    meta = TensorMeta.of(result)
    return dataclasses.replace(meta, device=device, storage_offset=sympy.Integer(0))


def _to_node(value: Any) -> Any:
    return value.node if isinstance(value, TensorVar) else value


kinds.to_value.register(TensorVar, lambda out, var: var)
kinds.to_value.register(ConstantVar, lambda out, var: var.value)
kinds.to_value.register(ObjectVar, lambda out, var: var.value)
kinds.to_value.register(SizeVar, lambda out, var: torch.Size([out.to_value(v) for v in var.items]))
kinds.to_value.register(TupleVar, lambda out, var: tuple(out.to_value(v) for v in var.items))
kinds.to_value.register(ListVar, lambda out, var: [out.to_value(v) for v in var.items])
kinds.to_value.register(DictVar, lambda out, var: {
    k: out.to_value(v) for k, v in var.items.items()})
kinds.require_pinned.register(Var, lambda out, var, what: None)  # (pinned: guarded or made)
for _kind in (TupleVar, ListVar):
    kinds.require_pinned.register(_kind, lambda out, var, what: out.require_pinned(var.items, what))
kinds.require_pinned.register(DictVar, lambda out, var, what: out.require_pinned(
    var.items.values(), what))
