"""Containers for the interpreter (a mixin of InstructionTranslator): building tuples, lists,
dicts and slices, ``*``/``**`` unpacking, ``a, *b = ...`` and subscripts.  Lists and dicts
built in the trace are mutable trackers; stores and ``del`` are in :mod:`control`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from minicompile.capture import kinds
from minicompile.capture.bytecode import Inst
from minicompile.capture.variables import DictVar, ListVar, NNModuleVar, TensorVar, TupleVar, Var
from minicompile.errors import Unsupported

if TYPE_CHECKING:
    from minicompile.capture.interpreter import InstructionTranslator


class ContainersMixin:
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

    def UNPACK_SEQUENCE(self: InstructionTranslator, inst: Inst) -> None:
        items = self.iter_items(self.pop())
        if len(items) != inst.arg:
            raise Unsupported(f"unpacking {len(items)} values into {inst.arg} (eager raises)")
        self.stack.extend(reversed(items))

    def UNPACK_EX(self: InstructionTranslator, inst: Inst) -> None:
        items = self.iter_items(self.pop())
        before, after = inst.arg & 0xFF, inst.arg >> 8
        if len(items) < before + after:
            raise Unsupported("not enough values to unpack (eager raises)")
        rest = ListVar(items[before : len(items) - after])
        self.stack.extend(reversed([*items[:before], rest, *items[len(items) - after :]]))

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


kinds.subscript.register(NNModuleVar, lambda tx, m, index: tx.module_subscript(
    m, tx.output.to_value(index)))
