"""The one place where minicompile reads PyTorch's internals: private ``torch._C`` names,
Dynamo's fake tensors and symbolic shapes, ``torch._prims_common``, the custom-op registry,
and the shape of ``torch.autograd.Function``.  The rest of the compiler asks this module and
never imports a private PyTorch module or tests a version itself.

Supported and tested: PyTorch 2.11 (the GPU machine's), 2.12 and 2.15 (by hand), 2.13 (CPU
build) and 2.14 (CI runs the suite on both; ``tests/test_compat.py`` checks every entry here
on the version it runs on).  What differs between them, and how each entry handles it
(2.15 reads as 2.14 does; its meta kernel of ``F.linear`` also refuses a bias that does not
broadcast, as eager does, so such a call raises while capturing, eager's error):

- ``torch.autograd.Function.apply``: up to 2.13 a Python ``classmethod`` of ``Function``
  (``Fn.apply.__func__`` is one function for every class); from 2.14 a C method of
  ``torch._C._FunctionBase`` (a ``classmethod_descriptor``: ``Fn.apply`` is a new builtin
  bound method at each access, without ``__func__``).  :func:`autograd_function_of` finds
  ``apply`` statically on the class, which is right for both; a guard on a C method bound
  to a class checks what it is bound to and its name, not its identity
  (capture/frame_values.py), or every call on 2.14 recompiled.
- The CUDA runtime's private entry points (``_StaticCudaLauncher``, the raw stream, the
  storage calls CUDA graphs use) exist only in CUDA builds: the CPU build of 2.13 lacks
  them, the CUDA build of 2.14 has them even on a machine without a GPU.  Each is None where
  missing (:data:`STATIC_CUDA_LAUNCHER`, :func:`cuda_stream_functions`,
  :func:`storage_functions`), and callers also ask ``torch.cuda.is_available()``.  The
  launcher's ``_load_kernel`` returns one more value (the module, first) from 2.12:
  :func:`load_cubin_function`.
- The gradient of ``clamp`` at its bounds: with number bounds, 1 up to 2.13 (``min <= x <=
  max`` passes it) and 0 from 2.14 (``min < x < max``); with tensor bounds, 2.14 also gives
  0.5 at a tie and passes it to a NaN input.  :func:`clamp_gradient_at_bounds` asks the
  running PyTorch (passes/decompose.py follows it for number bounds); a clamp by tensor
  bounds that takes a gradient is a library call (capture/torch_ops.py), eager's own
  backward on every release.
- ``torch._guards.Source.name``: a method in older releases, a cached property in 2.11 to
  2.14; :func:`source_class` makes a source whose name works either way.

Stable across 2.11-2.14, read here so that a change is made once: ``torch._prims_common``
(:func:`prims_common`), ``FakeTensorMode``, ``ShapeEnv`` and ``DimDynamic``
(:func:`fake_tensor_mode`, :func:`shape_env`, :func:`dynamic_dim`), the Python dispatcher
(:func:`python_dispatcher`), ``torch.utils._sympy.functions`` (:func:`sympy_functions`),
``TorchDispatchMode``, the custom-op registry (:func:`custom_op_has_fake_kernel`) and the C++
ABI flag (:func:`cxx11_abi`).  The fake-tensor and shape entries import torch._dynamo's
machinery (most of a second), so they import on first use, never at minicompile's import.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode  # imported by torch itself

__all__ = ["TorchDispatchMode"]

TORCH_VERSION: tuple[int, int] = tuple(  # type: ignore[assignment]
    int(part) for part in torch.__version__.split("+")[0].split(".")[:2])
# The releases something here tests (README: "Supported"): 2.11 on the GPU machine, 2.13
# and 2.14 in CI; by hand on 2026-11-27, 2.12 (capture, training, model and Dynamo tests)
# and 2.15 (the whole suite; what pip picks where no cap holds it at 2.14.1).
TESTED = ((2, 11), (2, 12), (2, 13), (2, 14), (2, 15))

# -- autograd.Function ---------------------------------------------------------------------

# ``apply`` as found on Function's class chain: a classmethod object (<= 2.13) or a
# classmethod_descriptor of torch._C._FunctionBase (2.14).
_FUNCTION_APPLY = inspect.getattr_static(torch.autograd.Function, "apply")


def autograd_function_of(value: Any) -> type | None:
    """The ``torch.autograd.Function`` subclass ``cls`` when ``value`` is ``cls.apply``
    (the inherited ``apply``, not one a class defines itself), else None."""
    owner = getattr(value, "__self__", None)
    if not (isinstance(owner, type) and issubclass(owner, torch.autograd.Function)):
        return None
    if getattr(value, "__name__", None) != "apply":
        return None
    try:
        found = inspect.getattr_static(owner, "apply")
    except AttributeError:
        return None
    return owner if found is _FUNCTION_APPLY else None


@functools.cache
def clamp_gradient_at_bounds() -> bool:
    """Whether ``x.clamp(min, max)`` with number bounds passes the gradient where ``x``
    equals a bound (up to 2.13) or not (2.14), asked of this PyTorch once."""
    x = torch.zeros(1, requires_grad=True)
    (grad,) = torch.autograd.grad(x.clamp(min=0.0).sum(), x)
    return bool(grad[0] == 1.0)


# -- CUDA runtime entry points (CUDA builds only) ---------------------------------------------

STATIC_CUDA_LAUNCHER: Any = getattr(torch._C, "_StaticCudaLauncher", None)


# Spin the current stream for a number of cycles (every build has it; it runs on a GPU):
# the profile (runtime/profile.py) keeps the GPU busy while the host queues a call.
GPU_SLEEP: Any = getattr(torch.cuda, "_sleep", None)


def load_cubin_function(cubin: Any, name: str, shared: int, device: int) -> int:
    """The CUDA function ``name`` of a cubin file, loaded by the static launcher:
    ``_load_kernel`` returns (function, registers, spills) in 2.11, and (module, function,
    registers, spills) from 2.12."""
    out = STATIC_CUDA_LAUNCHER._load_kernel(str(cubin), name, shared, device)
    return out[1] if len(out) == 4 else out[0]


def cuda_stream_functions() -> tuple[Callable | None, Callable | None]:
    """(the current raw CUDA stream of a device, the current device), or Nones."""
    return (getattr(torch._C, "_cuda_getCurrentRawStream", None),
            getattr(torch._C, "_cuda_getDevice", None))


def storage_functions() -> tuple[Callable | None, Callable | None, Callable | None]:
    """What CUDA graphs use to guard and rebuild output storages: (set the error a freed
    storage's access raises, a storage from a data pointer, a storage's use count)."""
    return (getattr(torch._C, "_set_storage_data_ptr_access_error_msg", None),
            getattr(torch._C, "_construct_storage_from_data_pointer", None),
            getattr(torch._C, "_storage_Use_Count", None))


def cxx11_abi() -> int:
    """The ``_GLIBCXX_USE_CXX11_ABI`` PyTorch's C++ library was built with."""
    return int(torch._C._GLIBCXX_USE_CXX11_ABI)


# -- metadata rules, fake tensors, symbolic shapes ------------------------------------------


def prims_common() -> ModuleType:
    """``torch._prims_common``: type promotion, memory formats, layout predicates."""
    import torch._prims_common as module

    return module


def fake_tensor_mode(**kwargs: Any) -> Any:
    """A new ``FakeTensorMode`` (imports Dynamo's machinery on first use)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    return FakeTensorMode(**kwargs)


def shape_env(**kwargs: Any) -> Any:
    """A new ``ShapeEnv``."""
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    return ShapeEnv(**kwargs)


def dynamic_dim() -> Any:
    """``DimDynamic.DYNAMIC``: a size that gets a symbol of its own (no duck sizing)."""
    from torch.fx.experimental.symbolic_shapes import DimDynamic

    return DimDynamic.DYNAMIC


def python_dispatcher() -> Any:
    """A context manager under which composite operators run their Python decompositions,
    as Dynamo traces (written for symbolic sizes)."""
    from torch._dispatch.python import enable_python_dispatcher

    return enable_python_dispatcher()


def sympy_functions() -> ModuleType:
    """``torch.utils._sympy.functions``: PyTorch's sympy functions (FloorDiv, Mod, ...)."""
    import torch.utils._sympy.functions as module

    return module


class _Name(str):
    """A source name that also works called (older ShapeEnvs call ``source.name()``)."""

    def __call__(self) -> str:
        return str(self)


@functools.cache
def source_class() -> type:
    """A ``torch._guards.Source`` made from a name alone (``source_class()(text)``), for
    the symbols minicompile creates in a ShapeEnv."""
    from torch._guards import GuardSource, Source

    @dataclasses.dataclass(frozen=True)
    class _Source(Source):  # type: ignore[misc]
        text: str

        @property
        def name(self) -> str:  # type: ignore[override]
            return _Name(self.text)

        def guard_source(self) -> Any:
            return GuardSource.LOCAL

        def reconstruct(self, codegen: Any) -> None:
            raise NotImplementedError

    return _Source


# -- operators ------------------------------------------------------------------------------


def custom_op_has_fake_kernel(overload: Any) -> bool:
    """False for a ``torch.library.custom_op`` without a fake kernel (its meta kernel only
    raises); operators of other kinds have theirs, or fail on meta tensors as eager would."""
    try:
        from torch._library.custom_ops import OPDEFS
    except ImportError:
        return True
    opdef = OPDEFS.get(overload.name())
    return opdef is None or getattr(opdef, "_abstract_fn", True) is not None


def aoti() -> ModuleType:
    """``torch._C._aoti``: tensor handles passed to and taken from an exported library."""
    return torch._C._aoti
