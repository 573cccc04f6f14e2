"""The one place where minicompile reads PyTorch's internals (private ``torch._C`` names,
fake tensors and symbolic shapes, ``torch._prims_common``, the custom-op registry, the shape
of ``torch.autograd.Function``, the fused attention kernels' backward ops and what their
autograd nodes save); nothing else imports a private module or tests a version.

Tested on 2.11 to 2.15 (``tests/test_compat.py`` checks every entry on the running version).
What differs: ``Function.apply`` is a C ``classmethod_descriptor`` from 2.14 (a new bound
method at each access, so guards check what a C method is bound to, not its identity);
CUDA entry points are None in CPU builds; ``_load_kernel`` returns one more value from 2.12;
``clamp``'s gradient at its bounds is 1 up to 2.13, 0 from 2.14.  The fake-tensor and shape
entries import torch._dynamo's machinery (most of a second) on first use only.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode  # imported by torch itself

__all__ = ["TorchDispatchMode"]

TORCH_VERSION: tuple[int, int] = tuple(  # type: ignore[assignment]
    int(part) for part in torch.__version__.split("+")[0].split(".")[:2])
# The releases something here tests (README: "Supported"); 2.12 and 2.15 by hand, 2026-11-27.
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


def is_function_node(node: Any) -> bool:
    """Whether ``node`` (a ``grad_fn``) is a Python autograd.Function's context, whose
    ``apply`` runs that Function's backward."""
    return isinstance(node, torch.autograd.function.BackwardCFunction)


def node_outputs(node: Any) -> int:
    """How many outputs the forward of ``node`` (a ``grad_fn``) had: the gradients its
    ``apply`` takes (one metadata record per output, private)."""
    return len(node._input_metadata)


_C_APPLY = torch._C._FunctionBase.__dict__["apply"]


def function_apply(cls: type) -> Callable:
    """``cls.apply`` (an autograd.Function without ``setup_context``) as the C
    ``_FunctionBase.apply`` where the release wraps that in Python (up to 2.13: the wrapper
    unwraps functorch's dead wrappers from every argument, half a microsecond each, 180 us a
    train step of a network's 360 inputs); the wrapper still runs while functorch
    transforms are active (its path for them).  From 2.14 ``cls.apply`` is the C one."""
    if _FUNCTION_APPLY is _C_APPLY:
        return cls.apply
    fast, wrapped = _C_APPLY.__get__(None, cls), cls.apply
    active = torch._C._are_functorch_transforms_active

    def apply(*args: Any) -> Any:
        return wrapped(*args) if active() else fast(*args)

    return apply


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


def static_address(t: torch.Tensor) -> bool:
    """Whether ``torch._dynamo.mark_static_address`` marked ``t``: its memory stays put
    for as long as it lives (transformers' static KV cache), so CUDA graphs read it in
    place and record again when a new one comes."""
    return getattr(t, "_dynamo_static_input_type", None) is not None


def storage_functions() -> tuple[Callable | None, Callable | None, Callable | None]:
    """What CUDA graphs use to guard and rebuild output storages: (set the error a freed
    storage's access raises, a storage from a data pointer, a storage's use count)."""
    return (getattr(torch._C, "_set_storage_data_ptr_access_error_msg", None),
            getattr(torch._C, "_construct_storage_from_data_pointer", None),
            getattr(torch._C, "_storage_Use_Count", None))



# -- the generated code's allocations and views on the CPU ---------------------------------
# Inductor's wrappers call these: without the dispatcher and keyword parsing, they cost
# about half of ``torch.empty_strided`` and ``Tensor.as_strided`` (0.55 against 1.15 and
# 0.95 us), and a train step's wrapper makes some 60 buffers and 90 views.
_GUARDS = getattr(torch._C, "_dynamo", None) and torch._C._dynamo.guards


def _empty_strided_cpu(size: tuple, stride: tuple, dtype: torch.dtype) -> torch.Tensor:
    return torch.empty_strided(size, stride, dtype=dtype)


def _reinterpret(t: torch.Tensor, size: tuple, stride: tuple, offset: int = 0) -> torch.Tensor:
    return t.as_strided(size, stride, t.storage_offset() + offset)


# ``empty_strided_cpu(size, stride, dtype)``: ``torch.empty_strided`` on the CPU.
empty_strided_cpu: Callable = getattr(_GUARDS, "_empty_strided_cpu", _empty_strided_cpu)
# ``reinterpret(t, size, stride, offset=0)``: ``t``'s memory in ``size`` and ``stride`` from
# ``offset`` elements past ``t``'s own offset, as a plain tensor: not an autograd view, no
# version counter shared with ``t`` (so only a library call's argument inside the generated
# code, never a returned value).
reinterpret: Callable = getattr(_GUARDS, "_reinterpret_tensor", _reinterpret)

_ADDRESSES_EQUAL: Callable[[list, list, list], bool] | None = getattr(
    torch._C, "_tensors_data_ptrs_at_indices_equal", None)  # (CUDA builds: cudagraph trees')


def addresses_equal(values: list, addresses: list, indices: list[int]) -> bool:
    """Whether ``values[k].data_ptr() == addresses[k]`` for each ``k`` of ``indices``: in
    one C++ call where PyTorch has it (a CUDA build), not one Python call a tensor."""
    if _ADDRESSES_EQUAL is not None and type(values) is list:  # (it takes lists alone)
        return _ADDRESSES_EQUAL(values, addresses, indices)
    return all(values[k].data_ptr() == addresses[k] for k in indices)


_STORAGE_ID: Callable[[torch.Tensor], int] | None = getattr(torch._C, "_storage_id", None)


def storage_count(tensors: tuple) -> int:
    """How many different storages ``tensors`` have (a guard: inputs share no memory).
    ``torch._C._storage_id`` is ``untyped_storage()._cdata`` without making a storage
    object: half the time on a GPT-2-small decode step's 187 inputs (230 us -> 110 us on
    one core, caches cold after the step's kernels)."""
    if _STORAGE_ID is None:
        return len({t.untyped_storage()._cdata for t in tensors})
    return len(set(map(_STORAGE_ID, tensors)))


def cxx11_abi() -> int:
    """The ``_GLIBCXX_USE_CXX11_ABI`` PyTorch's C++ library was built with."""
    return int(torch._C._GLIBCXX_USE_CXX11_ABI)


# -- guards -------------------------------------------------------------------------------

_TENSOR_GUARDS: Any = getattr(getattr(torch._C, "_dynamo", None), "guards", None)
_TENSOR_GUARDS = getattr(_TENSOR_GUARDS, "TensorGuards", None)


def tensor_guards(tensors: Sequence[torch.Tensor]) -> Any:
    """A check in one C++ call that tensors are like ``tensors`` (``.check(*others)``): each
    of the same Python type, dispatch keys (so device type and layout), dtype, device
    index, requires_grad, sizes and strides, and no object twice.  None where this PyTorch
    has no ``TensorGuards``."""
    if _TENSOR_GUARDS is None:
        return None
    return _TENSOR_GUARDS(*tensors, dynamic_dims_sizes=None, dynamic_dims_strides=None)


# PEP 509's version tag of a dict, which every write into it changes (CPython 3.11 and 3.12
# keep it up to date; 3.13 deprecates it): None where this PyTorch or Python has none, and
# runtime/dict_guards.py then runs every guard on every call.
DICT_VERSION: Callable[[dict], int] | None = (
    getattr(getattr(getattr(torch._C, "_dynamo", None), "guards", None), "dict_version", None)
    if sys.version_info[:2] in ((3, 11), (3, 12)) else None)


# -- metadata rules, fake tensors, symbolic shapes ------------------------------------------


def prims_common() -> ModuleType:
    """``torch._prims_common``: type promotion, memory formats, layout predicates."""
    import torch._prims_common

    return torch._prims_common


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


def custom_op_of(value: Any) -> Any:
    """The operator (``torch.ops.ns.name``'s packet) that a function decorated with
    ``torch.library.custom_op`` calls, else None."""
    try:
        from torch._library.custom_ops import CustomOpDef
    except ImportError:
        return None
    if not isinstance(value, CustomOpDef):
        return None
    return value._opoverload.overloadpacket


def custom_op_autograd(op: Any) -> tuple[Any, Callable, Callable] | None:
    """(overload, backward, setup_context) of a ``torch.library.custom_op`` whose autograd
    formula ``register_autograd`` gave (with a ``setup_context``); None for other operators
    (an OpOverloadPacket or OpOverload ``op``)."""
    try:
        from torch._library.custom_ops import OPDEFS
    except ImportError:
        return None
    packet = getattr(op, "overloadpacket", op)
    opdef = OPDEFS.get(getattr(packet, "_qualified_op_name", None))
    backward = getattr(opdef, "_backward_fn", None)
    setup = getattr(opdef, "_setup_context_fn", None)
    if backward is None or setup is None or op is not packet and op != opdef._opoverload:
        return None
    return opdef._opoverload, backward, setup


def custom_op_has_fake_kernel(overload: Any) -> bool:
    """False for a ``torch.library.custom_op`` without a fake kernel (its meta kernel only
    raises); operators of other kinds have theirs, or fail on meta tensors as eager would."""
    try:
        from torch._library.custom_ops import OPDEFS
    except ImportError:
        return True
    opdef = OPDEFS.get(overload.name())
    return opdef is None or getattr(opdef, "_abstract_fn", True) is not None


@functools.cache
def onednn_convolution() -> tuple[Callable, Callable] | None:
    """oneDNN's 2-d convolution on a packed weight, where this build has oneDNN: (pack:
    ``mkldnn._reorder_convolution_weight``, a dense weight, padding, stride, dilation, groups
    and input size to that weight reordered for the kernel, as a ``torch._mkldnn`` tensor;
    convolve: ``mkldnn._convolution_pointwise``, Inductor's freezing's call).  None without
    oneDNN."""
    if not torch.backends.mkldnn.is_available():
        return None
    try:
        return (torch.ops.mkldnn._reorder_convolution_weight,
                torch.ops.mkldnn._convolution_pointwise)
    except (AttributeError, RuntimeError):
        return None


# -- attention's fused kernels' backward ops -----------------------------------------------


_ATEN = torch.ops.aten


def _saved_of(node: Any, *names: str) -> Any:
    """The node's saved value of the first of ``names`` it has (they differ by version)."""
    return getattr(node, next((name for name in names if hasattr(node, name)), names[0]))


def _sdpa_efficient(n: Any, g: torch.Tensor, needed: list[bool]) -> tuple:
    return _ATEN._scaled_dot_product_efficient_attention_backward(
        g, n._saved_query, n._saved_key, n._saved_value, n._saved_attn_bias, n._saved_output,
        n._saved_log_sumexp, n._saved_philox_seed, n._saved_philox_offset, n._saved_dropout_p,
        [*needed, False], n._saved_is_causal, scale=n._saved_scale)[:3]


def _sdpa_flash(n: Any, g: torch.Tensor, needed: list[bool]) -> tuple:
    return _ATEN._scaled_dot_product_flash_attention_backward(
        g, n._saved_query, n._saved_key, n._saved_value, n._saved_output, n._saved_logsumexp,
        n._saved_cum_seq_q, n._saved_cum_seq_k, n._saved_max_q, n._saved_max_k, n._saved_dropout_p,
        n._saved_is_causal, _saved_of(n, "_saved_philox_seed", "_saved_rng_state"),
        _saved_of(n, "_saved_philox_offset", "_saved_unused"), scale=n._saved_scale)


def _sdpa_cudnn(n: Any, g: torch.Tensor, needed: list[bool]) -> tuple:
    return _ATEN._scaled_dot_product_cudnn_attention_backward(
        g, n._saved_query, n._saved_key, n._saved_value, n._saved_output, n._saved_logsumexp,
        n._saved_philox_seed, n._saved_philox_offset, n._saved_attn_bias, n._saved_cum_seq_q,
        n._saved_cum_seq_k, n._saved_max_q, n._saved_max_k, n._saved_dropout_p,
        n._saved_is_causal, scale=n._saved_scale)


def _sdpa_flash_cpu(n: Any, g: torch.Tensor, needed: list[bool]) -> tuple:
    return _ATEN._scaled_dot_product_flash_attention_for_cpu_backward(
        g, n._saved_query, n._saved_key, n._saved_value, n._saved_output, n._saved_logsumexp,
        n._saved_dropout_p, n._saved_is_causal, attn_mask=n._saved_attn_mask,
        scale=n._saved_scale)


# By the name of the node autograd records for the kernel: its backward op called on what the
# node saved (AttributeError for a name this version does not save; runtime/attention_grads).
ATTENTION_BACKWARDS: dict[str, Callable[[Any, torch.Tensor, list[bool]], tuple]] = {
    "ScaledDotProductEfficientAttentionBackward0": _sdpa_efficient,
    "ScaledDotProductFlashAttentionBackward0": _sdpa_flash,
    "ScaledDotProductCudnnAttentionBackward0": _sdpa_cudnn,
    "ScaledDotProductFlashAttentionForCpuBackward0": _sdpa_flash_cpu,
}


def aoti() -> ModuleType:
    """``torch._C._aoti``: tensor handles passed to and taken from an exported library."""
    return torch._C._aoti
