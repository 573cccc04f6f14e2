"""The state one capture builds, shared by the root translator and the inlined ones.

:class:`OutputGraph` owns the :class:`Graph`, the :class:`GuardBuilder` and the list of
inputs.  It turns frame values into trackers (:meth:`wrap`, which installs guards and makes
placeholders), makes call nodes (:meth:`op`, the :class:`~torch_ops.Emitter`), converts
between trackers and the plain values torch_ops works on (:meth:`to_value` /
:meth:`from_value`), and finally generates the per-call functions (:meth:`finish`).
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import sympy
import torch

from minicompile import ops
from minicompile.capture import torch_ops
from minicompile.capture.guards import GuardBuilder, Guards
from minicompile.capture.variables import (
    BuiltinVar,
    ConstantVar,
    DictVar,
    LazyVar,
    ListVar,
    ModuleVar,
    ObjectVar,
    OpaqueVar,
    SizeVar,
    Source,
    TensorVar,
    TorchFunctionVar,
    TupleVar,
    UserFunctionVar,
    Var,
    is_constant_value,
)
from minicompile.errors import Unsupported
from minicompile.graph import DTYPE_ABBR, Graph, Node, SourceLine, TensorMeta

if TYPE_CHECKING:
    from minicompile.capture.interpreter import InstructionTranslator

# Python modules whose attributes are read without guards (nobody patches them per call).
_TRUSTED_MODULES = ("torch", "math", "operator", "builtins")


def is_trusted_namespace(obj: Any) -> bool:
    if isinstance(obj, types.ModuleType):
        name = obj.__name__
    elif isinstance(obj, type):
        name = obj.__module__
    else:
        return False
    return name.split(".")[0] in _TRUSTED_MODULES


@dataclasses.dataclass
class Finished:
    graph: Graph
    input_sources: list[str]
    get_inputs: Callable[..., list[torch.Tensor]]
    get_inputs_source: str
    guards: Guards
    rebuild: Callable[..., Any]
    rebuild_source: str


class OutputGraph:
    def __init__(self, name: str, params: list[str]) -> None:
        self.graph = Graph(name)
        self.params = params
        self.guards = GuardBuilder(params)
        self.input_sources: list[str] = []
        self.input_exprs: list[str] = []
        self._wrapped: dict[str, Var] = {}
        self._idents: set[str] = set()
        self.tx: InstructionTranslator | None = None  # the translator running now

    def user_stack(self) -> tuple[SourceLine, ...]:
        return self.tx.user_stack() if self.tx is not None else ()

    # -- frame values to trackers ----------------------------------------------------------

    def wrap(self, value: Any, source: Source | None) -> Var:
        """The tracker for a value read from the frame at ``source`` (None for values derived
        from guarded ones), guarding what the trace will rely on.  Each source is wrapped
        once, so a global read twice is one placeholder and one set of guards."""
        if source is None:
            return self._wrap(value, None)
        if source.name not in self._wrapped:
            self._wrapped[source.name] = self._wrap(value, source)
        return self._wrapped[source.name]

    def _wrap(self, value: Any, source: Source | None) -> Var:
        guard = source is not None and not source.trusted
        g = self.guards
        if isinstance(value, torch.Tensor):
            return self._wrap_tensor(value, source)
        if is_constant_value(value):
            if guard:
                g.constant_match(source, value)
            return ConstantVar(value, source)
        if type(value) is torch.Size:
            if guard:
                g.constant_match(source, value)
            return SizeVar(tuple(ConstantVar(int(s)) for s in value), source)
        if type(value) in (tuple, list):
            if guard:
                g.sequence_match(source, value)
            items = [self._item(v, source, i) for i, v in enumerate(value)]
            if type(value) is tuple:
                return TupleVar(tuple(items), source)
            return ListVar(items, mutable=False, source=source)
        if type(value) is dict and all(type(k) is str for k in value):
            if guard:
                g.dict_keys_match(source, value)
            items = {k: self._item(v, source, k) for k, v in value.items()}
            return DictVar(items, mutable=False, source=source)
        if guard:
            g.identity_match(source, value)
        return self.object_var(value, source)

    def _item(self, value: Any, source: Source | None, key: int | str) -> Var:
        """Items of containers read from the frame are wrapped when first used."""
        return LazyVar(value, source.item(key)) if source else self._wrap(value, None)

    def realize(self, var: Var) -> Var:
        if isinstance(var, LazyVar):
            return self.wrap(var.value, var.source)
        return var

    def _wrap_tensor(self, t: torch.Tensor, source: Source | None) -> TensorVar:
        if source is None:
            raise Unsupported("a tensor reached without a source (e.g. a default value)")
        if type(t) not in (torch.Tensor, torch.nn.Parameter):
            raise Unsupported(f"tensor subclass {type(t).__name__} is not supported")
        if t.layout != torch.strided or t.dtype not in DTYPE_ABBR:
            raise Unsupported(f"{t.layout} tensors of dtype {t.dtype} are not supported")
        self.guards.tensor_match(source, t)
        # Placeholders describe the tensor from its data pointer: storage offsets are not
        # guarded, so they are not part of the metadata either.
        meta = dataclasses.replace(TensorMeta.of(t), storage_offset=sympy.Integer(0))
        node = self.graph.placeholder(self._ident(source.ident), meta)
        self.input_sources.append(source.name)
        self.input_exprs.append(source.expr)
        return TensorVar(node, type(t), source)

    def _ident(self, base: str) -> str:
        name, n = base, 0
        while name in self._idents:
            n += 1
            name = f"{base}_{n}"
        self._idents.add(name)
        return name

    def object_var(self, value: Any, source: Source | None) -> ObjectVar:
        """The kind of tracker for a non-constant object (no guards: callers guard)."""
        if isinstance(value, types.ModuleType):
            return ModuleVar(value, source)
        try:
            in_torch_table = value in torch_ops.FUNCTIONS
        except TypeError:  # unhashable
            in_torch_table = False
        if in_torch_table:
            return TorchFunctionVar(value, source)
        module = getattr(value, "__module__", None) or ""
        if callable(value) and not isinstance(value, type) and module.split(".")[0] == "torch":
            return TorchFunctionVar(value, source)  # unsupported torch callables
        if isinstance(value, types.FunctionType):
            return UserFunctionVar(value, source)
        if isinstance(value, (types.BuiltinFunctionType, type)) and module in ("builtins", "math"):
            return BuiltinVar(value, source)
        if isinstance(value, type) or callable(value):
            return ObjectVar(value, source)
        return OpaqueVar(value, source)

    # -- trackers <-> plain values ---------------------------------------------------------

    def to_value(self, var: Var) -> Any:
        """The plain value torch_ops and constant folding work on: TensorVars stay, constants
        and known objects become themselves, containers are rebuilt."""
        var = self.realize(var)
        if isinstance(var, TensorVar):
            return var
        if isinstance(var, (ConstantVar, ObjectVar)):
            return var.value
        if isinstance(var, SizeVar):
            return torch.Size([self.to_value(v) for v in var.items])
        if isinstance(var, TupleVar):
            return tuple(self.to_value(v) for v in var.items)
        if isinstance(var, ListVar):
            return [self.to_value(v) for v in var.items]
        if isinstance(var, DictVar):
            return {k: self.to_value(v) for k, v in var.items.items()}
        raise Unsupported(f"{var.describe()} cannot be used as a value here")

    def from_value(self, value: Any) -> Var:
        """The inverse of :meth:`to_value`, for results of folding and torch_ops."""
        if isinstance(value, Var):
            return value
        if isinstance(value, torch.Tensor):
            raise Unsupported("a real tensor appeared during tracing")
        if type(value) is torch.Size:
            return SizeVar(tuple(ConstantVar(int(s)) for s in value))
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

    def op(self, name: str, args: tuple, kwargs: dict[str, Any] | None = None) -> TensorVar:
        """Append ``name(*args, **kwargs)`` (args hold TensorVars) to the graph.  Anything
        eager would reject (bad shapes, dtypes, mixed devices) is Unsupported, so the
        frame runs eagerly and PyTorch raises its own error."""
        kwargs = kwargs or {}
        tensors = [v for v in _flatten((args, kwargs)) if isinstance(v, TensorVar)]
        devices = sorted({str(t.meta.device) for t in tensors})
        if len(devices) > 1:
            raise Unsupported(f"{name}: tensors on different devices ({', '.join(devices)})")
        if torch.is_grad_enabled() and any(t.meta.requires_grad for t in tensors):
            raise Unsupported(
                f"{name}: an input requires grad; autograd is not supported yet",
                hint="run under torch.no_grad() or detach the inputs",
            )
        node_args = _to_nodes(args)
        node_kwargs = _to_nodes(kwargs)
        try:
            meta = ops.infer_meta(name, node_args, node_kwargs, tensors[0].meta.device)
        except Exception as e:
            msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise Unsupported(f"{name}: eager PyTorch raises {type(e).__name__}: {msg}") from e
        node = self.graph.call(name, node_args, node_kwargs, meta=meta, stack=self.user_stack())
        return TensorVar(node)

    # -- the end of the trace --------------------------------------------------------------

    def finish(self, result: Var) -> Finished:
        """Close the graph on the value the frame returns and generate get_inputs and
        rebuild (flat Python, compiled once)."""
        self.guards.grad_mode()
        outputs: list[Node] = []
        index: dict[Node, int] = {}
        g = self.guards

        def expr(v: Var) -> str:
            v = self.realize(v)
            if isinstance(v, TensorVar):
                if v.node not in index:
                    index[v.node] = len(outputs)
                    outputs.append(v.node)
                return f"outs[{index[v.node]}]"
            if isinstance(v, SizeVar) or (isinstance(v, ConstantVar) and not _literal_ok(v.value)):
                return g.ref(self.to_value(v), "const")
            if isinstance(v, ConstantVar):
                return repr(v.value)
            if isinstance(v, TupleVar):
                inner = ", ".join(expr(i) for i in v.items)
                return f"({inner},)" if len(v.items) == 1 else f"({inner})"
            if isinstance(v, ListVar):
                return "[" + ", ".join(expr(i) for i in v.items) + "]"
            if isinstance(v, DictVar):
                return "{" + ", ".join(f"{k!r}: {expr(i)}" for k, i in v.items.items()) + "}"
            if isinstance(v, ObjectVar):
                return g.ref(v.value, getattr(v.value, "__name__", "obj"))
            raise Unsupported(f"returning {v.describe()} is not supported")

        body = expr(result)
        self.graph.output(outputs)
        rebuild_src = f"def rebuild(outs):\n    return {body}\n"
        inputs_src = (
            f"def get_inputs({', '.join(self.params)}):\n"
            f"    return [{', '.join(self.input_exprs)}]\n"
        )
        guards = g.build()  # the namespace is final now
        ns = guards.namespace
        exec(compile(rebuild_src, "<minicompile rebuild>", "exec"), ns)
        exec(compile(inputs_src, "<minicompile inputs>", "exec"), ns)
        return Finished(
            graph=self.graph,
            input_sources=list(self.input_sources),
            get_inputs=ns["get_inputs"],
            get_inputs_source=inputs_src,
            guards=guards,
            rebuild=ns["rebuild"],
            rebuild_source=rebuild_src,
        )


def _literal_ok(value: Any) -> bool:
    if type(value) is float:
        return value == value and value not in (float("inf"), float("-inf"))
    return type(value) in (bool, int, str, bytes, type(None))


def _flatten(value: Any) -> list[Any]:
    if isinstance(value, (tuple, list)):
        return [x for v in value for x in _flatten(v)]
    if isinstance(value, dict):
        return [x for v in value.values() for x in _flatten(v)]
    return [value]


def _to_nodes(value: Any) -> Any:
    if isinstance(value, TensorVar):
        return value.node
    if isinstance(value, (tuple, list)):
        return type(value)(_to_nodes(v) for v in value)
    if isinstance(value, dict):
        return {k: _to_nodes(v) for k, v in value.items()}
    return value
