"""Whether many dicts keep their version tags, in one C call.

A dict-version gate (runtime/dict_guards.py) compares hundreds of version tags per call (a
GPT-2-small decode step: 584, module dicts).  In Python, ``tuple(map(dict_version, dicts))
== versions``, that is 26 us a call on one core (45 ns a dict); the loop here reads each
dict's ``ma_version_tag`` in C, under 1 us.  It is a small library built once with the C++
compiler (cached on disk like a kernel) and called through ctypes with the GIL held; where
it cannot be built or loaded, or answers otherwise than :data:`compat.DICT_VERSION` on a
test at load, :func:`snapshot` and :func:`unchanged` fall back to the Python form.
"""

from __future__ import annotations

import array
import ctypes
import functools
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


def snapshot(dicts: tuple) -> Any:
    """The version tags of ``dicts`` now, in the form :func:`unchanged` compares."""
    versions = tuple(map(compat.DICT_VERSION, dicts))
    return versions if _native() is None else array.array("Q", versions).tobytes()


def unchanged(dicts: tuple, versions: Any) -> bool:
    """Whether each of ``dicts`` still has its tag in ``versions`` (a :func:`snapshot`)."""
    native = _native()
    if native is None:
        return tuple(map(compat.DICT_VERSION, dicts)) == versions
    return native(dicts, versions) == 1


@functools.cache
def _native() -> Callable[[Any, Any], int] | None:
    """The C loop, or None where it cannot be had (no dict versions, no compiler, no
    Python headers) or answers wrongly on a test."""
    if compat.DICT_VERSION is None:
        return None
    include = Path(sysconfig.get_paths()["include"]) / "Python.h"
    try:
        from minicompile.runtime import build

        if not include.is_file():
            return None
        path, _ = build.build_unit(_SOURCE.format(include=include), config.get(), "helpers")
        function = ctypes.PyDLL(str(path)).mc_dict_versions_equal
    except Exception:  # noqa: BLE001 - any failure leaves the Python form
        return None
    function.argtypes = [ctypes.py_object, ctypes.py_object]
    function.restype = ctypes.c_int
    return function if _answers_right(function) else None


def _answers_right(function: Callable[[Any, Any], int]) -> bool:
    """The C loop agrees with ``compat.DICT_VERSION`` on dicts before and after writes."""
    dicts = ({}, {"a": 1}, {})
    packed = array.array("Q", map(compat.DICT_VERSION, dicts)).tobytes()
    if function(dicts, packed) != 1 or function(list(dicts), packed) != 0:
        return False
    dicts[1]["a"] = 2
    return function(dicts, packed) == 0
