"""Operators and containers on trackers, for the interpreter (a mixin of
InstructionTranslator): the ``binary``, ``unary``, ``contains``, ``subscript``,
``contents`` and ``keywords`` hooks.  On tensors an operator becomes a node, lists and
tuples concatenate as trackers, other Python values are folded.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from minicompile.capture import autocast, kinds, mutation, records, torch_ops
from minicompile.capture.bytecode import Inst
from minicompile.capture.variables import (
    DictVar, ListVar, NNModuleVar, RecordVar, TensorVar, TupleVar, Var,
)
from minicompile.errors import Unsupported

if TYPE_CHECKING:
    from minicompile.capture.interpreter import InstructionTranslator


class OperatorsMixin:
    def binary(self: InstructionTranslator, symbol: str, fn: Callable, a: Var, b: Var,
               inplace: bool = False) -> Var:
        for side in (a, b):  # an operand's kind may own the operator (a NumPy array does)
            result = kinds.binary(self, self.realize(side), symbol, a, b, inplace)
            if result is not None:
                return result
        if isinstance(a, TensorVar) or isinstance(b, TensorVar):
            av, bv = self.output.to_value(a), self.output.to_value(b)
            result = autocast.call(self.output, fn, (av, bv), {}, lambda p, k: (
                torch_ops.binary_operator(self.output, symbol, *p)), inplace=inplace)
            if inplace and isinstance(a, TensorVar):  # x += y is x.__iadd__(y): in place
                return mutation.mutate(self.output, a, result, f"operator {symbol}=")
            return self.output.from_value(result)
        if inplace and isinstance(a, ListVar) and symbol == "+":
            self.list_method(a, "extend", [b], {})
            return a
        a, b = self.realize(a), self.realize(b)
        if symbol == "+" and type(a) is type(b) and type(a) in (ListVar, TupleVar):
            items = [*a.items, *b.items]  # may hold tensors: no folding
            return ListVar(items) if isinstance(a, ListVar) else TupleVar(tuple(items))
        if inplace and isinstance(a, (ListVar, DictVar)):
            raise Unsupported(f"in-place operator {symbol}= on a list/dict (mutation)")
        return self.fold(fn, a, b, what=f"operator {symbol}")

    def contains(self: InstructionTranslator, container: Var, item: Var) -> bool:
        return kinds.contains(self, self.realize(container), item)

    def unary(self: InstructionTranslator, x: Var, symbol: str, fn: Callable) -> Var:
        return kinds.unary(self, x, symbol, fn)

    @kinds.unary.register(TensorVar)
    def tensor_unary(self: InstructionTranslator, x: TensorVar, symbol: str, fn: Callable):
        result = autocast.call(self.output, fn, (x,), {}, lambda p, k: (
            torch_ops.unary_operator(self.output, symbol, *p)))
        return self.output.from_value(result)

    @kinds.contains.register(Var)
    def value_contains(self: InstructionTranslator, container: Var, item: Var) -> bool:
        if self.has_python_method(container, "__contains__"):
            return self.user_contains(container, item)
        return self.fold(lambda x, c: x in c, item, container, what="`in`").value

    @kinds.contains.register(NNModuleVar)
    def module_contains(self: InstructionTranslator, container: NNModuleVar, item: Var) -> bool:
        if not isinstance(container.value, torch.nn.ModuleDict):
            return self.value_contains(container, item)
        return self.output.to_value(item) in [k.value for k in self.iter_items(container)]

    # -- containers ----------------------------------------------------------------------

    def contents(self: InstructionTranslator, var: Var, what: str) -> list | dict:
        """The items of a list or dict built in the trace, to add to."""
        if not isinstance(var, (ListVar, DictVar)) or not var.mutable:
            raise Unsupported(f"{what} on {var.describe()} from outside the trace (mutation)")
        return var.items

    def keywords(self: InstructionTranslator, kwargs: Var | None) -> dict[str, Var]:
        if kwargs is None:
            return {}
        if not isinstance(kwargs, DictVar):
            raise Unsupported(f"f(**{kwargs.describe()}) is not supported")
        return {k: self.realize(v) for k, v in kwargs.items.items()}

    def DICT_MERGE(self: InstructionTranslator, inst: Inst) -> None:
        update = self.pop()
        target = self.contents(self.stack[-inst.arg], "dict merge")
        if not isinstance(update, DictVar):
            raise Unsupported(f"**{update.describe()} is not supported")
        if inst.opname == "DICT_MERGE" and target.keys() & update.items.keys():
            raise Unsupported("duplicate keyword argument (eager raises TypeError)")
        target.update(update.items)

    DICT_UPDATE = DICT_MERGE

    def subscript(self: InstructionTranslator, container: Var, index: Var) -> Var:
        return kinds.subscript(self, self.realize(container), index)

    @kinds.subscript.register(TensorVar)
    def tensor_subscript(self: InstructionTranslator, container: TensorVar, index: Var) -> Var:
        key = self.output.to_value(index)
        keys = key if isinstance(key, tuple) else (key,)
        if any(isinstance(k, TensorVar) and k.meta.dtype == torch.bool for k in keys):
            raise Unsupported("indexing with a bool mask has a data-dependent shape")
        return self.output.extern(torch.Tensor.__getitem__, (container, key), {})

    @kinds.subscript.register(Var)
    def value_subscript(self: InstructionTranslator, container: Var, index: Var) -> Var:
        if self.has_python_method(container, "__getitem__"):  # a user mapping or sequence
            return self.call_function(self.load_attr(container, "__getitem__"), [index], {})
        if isinstance(index, TensorVar):
            raise Unsupported("indexing with a tensor is not supported")
        if isinstance(container, (TupleVar, ListVar)):
            i = self.output.to_value(index)
            try:
                picked = container.items[i]
            except (IndexError, TypeError) as e:
                raise Unsupported(f"indexing raised {type(e).__name__}: {e}") from e
            if not isinstance(i, slice):
                return self.realize(picked)
            cls = type(container)  # (a slice of a torch.Size is one)
            return ListVar(list(picked)) if cls is ListVar else cls(tuple(picked))
        if isinstance(container, DictVar):
            key = self.output.to_value(index)
            if key not in container.items:
                raise Unsupported(f"key {key!r} not found (eager raises KeyError)")
            return self.realize(container.items[key])
        return self.fold(lambda c, i: c[i], container, index, what="indexing")


kinds.contains.register(RecordVar, lambda tx, record, item: (
    tx.output.to_value(item) in records.keys_of(record)))
kinds.contains.register(DictVar, lambda tx, d, item: tx.output.to_value(item) in d.items)
kinds.unary.register(Var, lambda tx, x, symbol, fn: tx.fold(fn, x, what=f"unary {symbol}"))
kinds.binary.register(Var, lambda tx, var, *_: None)  # (None: binary goes on, tensors first)
kinds.subscript.register(NNModuleVar, lambda tx, m, index: tx.module_subscript(
    m, tx.output.to_value(index)))
