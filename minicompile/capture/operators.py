"""Operators for the interpreter (a mixin of InstructionTranslator): ``BINARY_OP``,
``COMPARE_OP``, ``IS_OP``, ``CONTAINS_OP``, the unary operators and 3.12's
``CALL_INTRINSIC_1``.  On tensors an operator becomes a node (``x += y`` an in-place op),
lists and tuples concatenate as trackers, other Python values are folded.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from minicompile.capture import autocast, kinds, mutation, records, torch_ops
from minicompile.capture.variables import (
    ArrayVar, DictVar, ListVar, NNModuleVar, RecordVar, TensorVar, TupleVar, Var,
)
from minicompile.errors import Unsupported

if TYPE_CHECKING:
    from minicompile.capture.interpreter import InstructionTranslator


class OperatorsMixin:
    def binary(self: InstructionTranslator, symbol: str, fn: Callable, a: Var, b: Var,
               inplace: bool = False) -> Var:
        if isinstance(self.realize(a), ArrayVar) or isinstance(self.realize(b), ArrayVar):
            from minicompile.capture import numpy_kind

            return numpy_kind.binary(self, symbol, a, b, inplace)
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


kinds.contains.register(RecordVar, lambda tx, record, item: (
    tx.output.to_value(item) in records.keys_of(record)))
kinds.contains.register(DictVar, lambda tx, d, item: tx.output.to_value(item) in d.items)
kinds.unary.register(Var, lambda tx, x, symbol, fn: tx.fold(fn, x, what=f"unary {symbol}"))
