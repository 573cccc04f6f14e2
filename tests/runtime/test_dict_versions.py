"""The version tags of many dicts compared in one C call (minicompile/runtime/
dict_versions.py): a write into any of them is seen, in the C form and the Python form,
and a model whose module dicts change after compiled calls still gets eager's values."""

from __future__ import annotations

import sysconfig
from collections import OrderedDict
from pathlib import Path

import pytest
import torch

import minicompile
from minicompile import compat
from minicompile.runtime import dict_guards, dict_versions

pytestmark = pytest.mark.skipif(compat.DICT_VERSION is None, reason="no dict version tags")


def _native() -> object:
    if dict_versions._native is None:
        dict_versions._load()
    if not dict_versions._native:
        if not (Path(sysconfig.get_paths()["include"]) / "Python.h").is_file():
            pytest.skip("no Python.h here: the C loop cannot be built (the Python form runs)")
        pytest.fail("the C loop could not be built here, though Python.h is present")
    return dict_versions._native


@pytest.fixture(params=["native", "python"])
def form(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "native":
        _native()
    else:
        monkeypatch.setattr(dict_versions, "_native", False)
    return request.param


def snapshot(dicts: tuple) -> object:
    return dict_versions.pack(dicts, tuple(map(compat.DICT_VERSION, dicts)))


def test_every_write_is_seen(form: str) -> None:
    class Obj:
        pass

    obj = Obj()
    obj.a = 1
    # Never empty: PyTorch's tags on CPython 3.12+ miss an update() into an empty dict
    # (the CLONED event), which DictGate answers by checking empty dicts for emptiness.
    dicts = tuple({"s": i} for i in range(50)) + (OrderedDict(x=1), obj.__dict__)
    writes = [lambda d: d.__setitem__("k", 1), lambda d: d.pop("k"),
              lambda d: d.update(x=2), lambda d: d.setdefault("y", 3),
              lambda d: d.__setitem__("y", object())]
    for i in (0, 17, 49, 50, 51):
        for write in writes:
            snap = snapshot(dicts)
            assert dict_versions.unchanged(dicts, snap)
            write(dicts[i])
            assert not dict_versions.unchanged(dicts, snap)
    snap = snapshot(dicts)
    obj.a = 2  # an attribute set: the instance dict
    assert not dict_versions.unchanged(dicts, snap)


def test_a_dict_cloned_into_an_empty_one_is_seen() -> None:
    """``update()`` of a small dict into an empty one clones its keys: PyTorch's tags on
    CPython 3.12 miss that (DictGate checks empty dicts for emptiness); the C loop's
    ``ma_version_tag`` does not."""
    _native()
    dicts = ({}, {"a": 1})
    snap = snapshot(dicts)
    dicts[0].update({"b": 2})
    assert not dict_versions.unchanged(dicts, snap)


def test_wrong_arguments_never_pass() -> None:
    native = _native()
    dicts = ({}, {})
    snap = snapshot(dicts)
    assert type(snap) is bytes and native(dicts, snap) == 1
    assert native(list(dicts), snap) == 0  # not a tuple
    assert native(dicts[:1], snap) == 0  # other lengths
    assert native(({}, [], {}), snap + snap[:8]) == 0  # not a dict
    assert native(dicts, bytearray(snap)) == 0  # not bytes


def test_module_changed_between_calls(form: str, backend: str,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dict_guards, "NATIVE_AFTER", 2)
    minicompile.reset()
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))
    compiled = minicompile.compile(net, backend=backend)
    for step in range(8):
        x = torch.randn(3, 8)
        if step == 4:  # a parameter replaced: the module's _parameters dict moves
            net[2].weight = torch.nn.Parameter(torch.randn(4, 8))
        if step == 6:  # a submodule swapped
            net[1] = torch.nn.Tanh()
        with torch.no_grad():
            torch.testing.assert_close(compiled(x), net(x))
        if step == 3:  # the versions compared in C after NATIVE_AFTER fast calls
            (entry,) = compiled.__dict__["_compiled"].entries
            gate = entry.capture.guards.check.__self__
            assert type(gate.packed) is (bytes if form == "native" else tuple), gate.packed
