"""Whether many dicts keep their version tags, in one C call.

A dict-version gate (runtime/dict_guards.py) compares hundreds of version tags per call (a
GPT-2-small decode step: 584, module dicts).  In Python, ``tuple(map(dict_version, dicts))
== versions``, that is 26 us a call on one core (45 ns a dict); the loop here reads each
dict's ``ma_version_tag`` in C, under 1 us.  It is a small library built once with the C++
compiler (cached on disk like a kernel) and called through ctypes with the GIL held; where
it cannot be built or loaded, or answers otherwise than :data:`compat.DICT_VERSION` on a
test at load, :func:`pack` and :func:`unchanged` keep the Python form.  A gate asks for it
after ``NATIVE_AFTER`` fast calls (dict_guards.py): a function called a few times never
builds it.
"""

from __future__ import annotations

import array
import ctypes
import sys
import sysconfig
from collections.abc import Callable
from pathlib import Path
from typing import Any

from minicompile import compat, config

_SOURCE = """\
#include "{include}"
#include <cstdint>
#include <cstring>
// 1 when each dict of the tuple `dicts` has the version tag at its place in `versions`
// (bytes: a uint64 a dict); 0 when one differs or the arguments are not of that form.
extern "C" int mc_dict_versions_equal(PyObject* dicts, PyObject* versions) {{
    if (!PyTuple_CheckExact(dicts) || !PyBytes_CheckExact(versions)) return 0;
    Py_ssize_t n = PyTuple_GET_SIZE(dicts);
    if (PyBytes_GET_SIZE(versions) != n * (Py_ssize_t)sizeof(uint64_t)) return 0;
    const char* tags = PyBytes_AS_STRING(versions);
    for (Py_ssize_t i = 0; i < n; i++) {{
        PyObject* d = PyTuple_GET_ITEM(dicts, i);
        uint64_t tag;
        memcpy(&tag, tags + i * sizeof(uint64_t), sizeof(tag));
        if (!PyDict_Check(d) || ((PyDictObject*)d)->ma_version_tag != tag) return 0;
    }}
    return 1;
}}
"""


def pack(versions: tuple, build: bool = False) -> Any:
    """``versions`` (the tags of dicts, in order) in the form :func:`unchanged` compares:
    bytes for the C loop where this process has it (``build``: build or load it now, which
    takes a compile the first time in a cache directory), else the tuple itself."""
    if _native is None and build:
        _load()
    return versions if not _native else array.array("Q", versions).tobytes()


def unchanged(dicts: tuple, packed: Any) -> bool:
    """Whether each of ``dicts`` still has its tag in ``packed`` (from :func:`pack`)."""
    if type(packed) is bytes:
        return _native(dicts, packed) == 1  # type: ignore[misc]
    return tuple(map(compat.DICT_VERSION, dicts)) == packed


_native: Any = None  # the C loop; None: not tried yet; False: cannot be had here


def _load() -> None:
    """Build (or find in the cache) and load the C loop; False where it cannot be had (no
    dict versions, no compiler, no Python headers) or answers wrongly on a test."""
    global _native
    _native = False
    include = Path(sysconfig.get_paths()["include"]) / "Python.h"
    if (compat.DICT_VERSION is None or not include.is_file() or sys.version_info >= (3, 12)
            or not config.get().dict_versions_c):
        return  # (3.12+: PyTorch's tags are a dict watcher's counts, not ``ma_version_tag``)
    try:
        from minicompile.runtime import build

        path, _ = build.build_unit(_SOURCE.format(include=include), config.get(), "helpers")
        function = ctypes.PyDLL(str(path)).mc_dict_versions_equal
    except Exception:  # noqa: BLE001 - any failure leaves the Python form
        return
    function.argtypes = [ctypes.py_object, ctypes.py_object]
    function.restype = ctypes.c_int
    if _answers_right(function):
        _native = function


def _answers_right(function: Callable[[Any, Any], int]) -> bool:
    """The C loop agrees with ``compat.DICT_VERSION`` on dicts before and after writes."""
    dicts = ({}, {"a": 1}, {})
    packed = array.array("Q", map(compat.DICT_VERSION, dicts)).tobytes()
    if function(dicts, packed) != 1 or function(list(dicts), packed) != 0:
        return False
    dicts[1]["a"] = 2
    return function(dicts, packed) == 0
