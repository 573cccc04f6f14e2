"""Whether many dicts keep their version tags, in one C call.

A dict-version gate (runtime/dict_guards.py) compares hundreds of version tags per call (a
GPT-2-small decode step: 584, module dicts).  In Python, ``tuple(map(dict_version, dicts))
== versions``, that is 26 us a call on one core (45 ns a dict); the loop here reads each
dict's ``ma_version_tag`` in C, under 1 us.  It is a small library built once with the C++
compiler (cached on disk like a kernel) and called through ctypes with the GIL held, which
also reads the tags it compares (:func:`pack`): on CPython 3.12 PyTorch's
:data:`compat.DICT_VERSION` is a dict watcher's count, not ``ma_version_tag``.  Where it
cannot be built or loaded, or misses a write on a test at load, :func:`pack` and
:func:`unchanged` keep the Python form.  A gate asks for it
after ``NATIVE_AFTER`` fast calls (dict_guards.py): a function called a few times never
builds it.
"""

from __future__ import annotations

import ctypes
import sysconfig
from collections.abc import Callable
from pathlib import Path
from typing import Any

from minicompile import compat, config

_SOURCE = """\
#include "{include}"
#include <cstdint>
#include <cstring>
// The version tags of the dicts of the tuple `dicts` (bytes: a uint64 a dict), or None
// when it is not a tuple of dicts.
extern "C" PyObject* mc_dict_versions(PyObject* dicts) {{
    if (!PyTuple_CheckExact(dicts)) Py_RETURN_NONE;
    Py_ssize_t n = PyTuple_GET_SIZE(dicts);
    PyObject* out = PyBytes_FromStringAndSize(NULL, n * (Py_ssize_t)sizeof(uint64_t));
    if (out == NULL) return NULL;
    char* tags = PyBytes_AS_STRING(out);
    for (Py_ssize_t i = 0; i < n; i++) {{
        PyObject* d = PyTuple_GET_ITEM(dicts, i);
        if (!PyDict_Check(d)) {{ Py_DECREF(out); Py_RETURN_NONE; }}
        uint64_t tag = ((PyDictObject*)d)->ma_version_tag;
        memcpy(tags + i * sizeof(uint64_t), &tag, sizeof(tag));
    }}
    return out;
}}
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


def pack(dicts: tuple, versions: tuple, build: bool = False) -> Any:
    """The tags of ``dicts`` (``versions``: as :data:`compat.DICT_VERSION` reads them now) in
    the form :func:`unchanged` compares: bytes of their ``ma_version_tag`` read in C where this
    process has the loop (``build``: build or load it now, which takes a compile the first time
    in a cache directory), else ``versions`` itself."""
    if _native is None and build:
        _load()
    return versions if not _native else _read(dicts)


def unchanged(dicts: tuple, packed: Any) -> bool:
    """Whether each of ``dicts`` still has its tag in ``packed`` (from :func:`pack`)."""
    if type(packed) is bytes:
        return _native(dicts, packed) == 1  # type: ignore[misc]
    return tuple(map(compat.DICT_VERSION, dicts)) == packed


_native: Any = None  # the C loop; None: not tried yet; False: cannot be had here
_read: Any = None  # the C reader of the tags (with _native)


def _load() -> None:
    """Build (or find in the cache) and load the C loop; False where it cannot be had (no
    dict versions, no compiler, no Python headers) or answers wrongly on a test."""
    global _native, _read
    _native = False
    include = Path(sysconfig.get_paths()["include"]) / "Python.h"
    if (compat.DICT_VERSION is None or not include.is_file()
            or not config.get().dict_versions_c):
        return  # (CPython 3.11 and 3.12 have ``ma_version_tag``; compat says which)
    try:
        from minicompile.runtime import build

        path, _ = build.build_unit(_SOURCE.format(include=include), config.get(), "helpers")
        library = ctypes.PyDLL(str(path))
        function, read = library.mc_dict_versions_equal, library.mc_dict_versions
    except Exception:  # noqa: BLE001 - any failure leaves the Python form
        return
    function.argtypes = [ctypes.py_object, ctypes.py_object]
    function.restype = ctypes.c_int
    read.argtypes, read.restype = [ctypes.py_object], ctypes.py_object
    if _answers_right(function, read):
        _native, _read = function, read


def _answers_right(function: Callable[[Any, Any], int], read: Callable[[Any], Any]) -> bool:
    """The C loop sees a write, and a dict cloned into an empty one (``update()`` of another
    dict: on CPython 3.12 PyTorch's tags miss that one, ``ma_version_tag`` does not)."""
    dicts = ({}, {"a": 1}, {})
    packed = read(dicts)
    if type(packed) is not bytes or read(list(dicts)) is not None:
        return False
    if function(dicts, packed) != 1 or function(list(dicts), packed) != 0:
        return False
    dicts[1]["a"] = 2
    if function(dicts, packed) != 0:
        return False
    packed = read(dicts)
    dicts[2].update({"b": 1})
    return function(dicts, packed) == 0
