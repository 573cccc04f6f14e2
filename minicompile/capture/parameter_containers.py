"""``nn.ParameterList`` and ``nn.ParameterDict`` read in a traced ``forward``.

Each item is read as the module attribute it is (``_parameters['0']``), so in-place edits
between calls are seen and gradients reach it; a list's length and a dict's keys are
guarded.  Indexing, slicing, ``len``, ``in`` and iteration are modelled; anything else is a
graph break.
"""

from __future__ import annotations

import dataclasses
import operator
from typing import Any

import torch

from minicompile.capture import kinds
from minicompile.capture.variables import ConstantVar, DictVar, NNModuleVar, Var
from minicompile.errors import Unsupported


class ParameterListVar(NNModuleVar):
    """An ``nn.ParameterList`` of the frame (its exact class: a subclass keeps its own
    ``__getitem__``), its length guarded where the trace reads it."""


class ParameterDictVar(NNModuleVar):
    """An ``nn.ParameterDict`` of the frame, its keys guarded where the trace reads them."""


# The module kinds of this file, by exact class (frame_values.object_var picks from it).
MODULE_KINDS: dict[type, type[NNModuleVar]] = {
    torch.nn.ParameterList: ParameterListVar, torch.nn.ParameterDict: ParameterDictVar,
}


@dataclasses.dataclass(eq=False)
class ParameterSliceVar(Var):
    """``plist[i:j]``: the items of the new ``ParameterList`` eager makes."""

    items: list[Var]
    phrase = "a slice of a ParameterList"


def _index(tx: kinds.Translator, index: Var) -> int | slice:
    key = tx.output.to_value(index)
    if isinstance(key, slice):
        return key
    try:
        return operator.index(key)
    except TypeError as e:
        raise Unsupported(f"ParameterList index of type {type(key).__name__} (eager raises)") from e


def _pick(items: list[Any], i: int | slice, what: str) -> Any:
    if isinstance(i, slice):
        return items[i]
    if not -len(items) <= i < len(items):
        raise Unsupported(f"{what} index {i} out of range (eager raises IndexError)")
    return items[i]


def _positions(tx: kinds.Translator, plist: ParameterListVar) -> list[str]:
    """The attribute names of the list's items, its length guarded."""
    if plist.source is None:
        raise Unsupported("a ParameterList reached without a source")
    tx.output.guards.sequence_match(plist.source, plist.value)
    return [str(i) for i in range(len(plist.value))]


@kinds.subscript.register(ParameterListVar)
def _list_subscript(tx: kinds.Translator, plist: ParameterListVar, index: Var) -> Var:
    picked = _pick(_positions(tx, plist), _index(tx, index), "ParameterList")
    if isinstance(picked, list):
        return ParameterSliceVar([tx.module_attr(plist, name) for name in picked])
    return tx.module_attr(plist, picked)


@kinds.subscript.register(ParameterSliceVar)
def _slice_subscript(tx: kinds.Translator, part: ParameterSliceVar, index: Var) -> Var:
    picked = _pick(part.items, _index(tx, index), "ParameterList")
    return ParameterSliceVar(picked) if isinstance(picked, list) else picked


def _keys(tx: kinds.Translator, pdict: ParameterDictVar) -> list[str]:
    """The dict's keys in order (its ``_keys``, a dict read with its keys guarded)."""
    keys = tx.realize(tx.module_attr(pdict, "_keys"))
    assert isinstance(keys, DictVar)
    return list(keys.items)


@kinds.subscript.register(ParameterDictVar)
def _dict_subscript(tx: kinds.Translator, pdict: ParameterDictVar, index: Var) -> Var:
    key = tx.output.to_value(index)
    if not isinstance(key, str) or key not in _keys(tx, pdict):
        raise Unsupported(f"ParameterDict has no key {key!r} (eager raises)")
    return tx.module_attr(pdict, key)


def _rebuild_slice(r: kinds.RebuildWriter, part: ParameterSliceVar) -> str:
    return f"{r.g.ref(torch.nn.ParameterList, 'ParameterList')}([{r.items(part.items)}])"


kinds.iter_items.register(ParameterListVar, lambda tx, plist: [
    tx.module_attr(plist, name) for name in _positions(tx, plist)])
kinds.length.register(ParameterListVar, lambda tx, plist: ConstantVar(len(_positions(tx, plist))))
kinds.iter_items.register(ParameterSliceVar, lambda tx, part: list(part.items))
kinds.length.register(ParameterSliceVar, lambda tx, part: ConstantVar(len(part.items)))
kinds.rebuild.register(ParameterSliceVar, _rebuild_slice)
kinds.iter_items.register(ParameterDictVar, lambda tx, pdict: [
    ConstantVar(k) for k in _keys(tx, pdict)])
kinds.length.register(ParameterDictVar, lambda tx, pdict: ConstantVar(len(_keys(tx, pdict))))
kinds.truthy.register(ParameterListVar, lambda tx, plist: len(_positions(tx, plist)) > 0)
kinds.truthy.register(ParameterSliceVar, lambda tx, part: len(part.items) > 0)
kinds.truthy.register(ParameterDictVar, lambda tx, pdict: len(_keys(tx, pdict)) > 0)
kinds.contains.register(ParameterDictVar, lambda tx, pdict, item: (
    tx.output.to_value(item) in _keys(tx, pdict)))
