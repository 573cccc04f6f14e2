"""Stand-ins for ``triton``, ``tl`` and ``libdevice`` in generated modules of GPU kernels,
so that importing one does not import Triton (a tenth of a second or more).
``@triton.jit`` keeps the function as a :class:`LazyKernel`, which imports Triton and makes
its module real only when it must go through Triton (``XBLOCK: tl.constexpr`` is never
evaluated: generated modules use ``from __future__ import annotations``).
"""

from __future__ import annotations

import types
from typing import Any, Callable


class LazyKernel:
    """A ``@triton.jit`` function of a generated module, before Triton is imported."""

    def __init__(self, fn: Callable) -> None:
        self.fn = fn
        code = fn.__code__
        self.arg_names = list(code.co_varnames[:code.co_argcount])
        self._real: Any = None

    @property
    def __name__(self) -> str:  # noqa: A003
        return self.fn.__name__

    def real(self) -> Any:
        """The ``triton.jit`` function (Triton imported, and its module made real)."""
        if self._real is None:
            materialize(self.fn.__globals__)
        return self._real

    def __getitem__(self, grid: Any) -> Any:
        return self.real()[grid]


def materialize(namespace: dict) -> None:
    """Import Triton into the generated module ``namespace``, its LazyKernels made real."""
    import triton
    import triton.language as tl
    from triton.language.extra import libdevice

    namespace.update(triton=triton, tl=tl, libdevice=libdevice)
    for name, value in list(namespace.items()):
        if isinstance(value, LazyKernel):
            if value._real is None:
                value._real = triton.jit(value.fn)
            namespace[name] = value._real


class _Unloaded:
    """``tl`` or ``libdevice`` before Triton is imported: read only inside kernels."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        raise AttributeError(f"minicompile: {self._name}.{attr} read before Triton was imported "
                           "(a generated kernel module used outside its kernels)")


# ``triton`` before it is imported: a bare ``@triton.jit`` (what codegen writes) is all a
# generated module uses of it at module level.
triton = types.SimpleNamespace(jit=LazyKernel)
tl = _Unloaded("tl")
libdevice = _Unloaded("libdevice")

