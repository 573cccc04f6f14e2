"""The functions whose meaning depends on training mode: batch norm and dropout.

Training-mode batch norm is spelled out (``sum`` reductions, then the running statistics
updated functionally and written back, as ATen computes them); eval mode is one extern.
Dropout is its input without training or with ``p == 0``, else PyTorch's own op.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from minicompile import compat, ops
from minicompile.capture import mutation
from minicompile.capture.torch_ops import Emitter, parse, register, shape_of, tensor_arg
from minicompile.capture.variables import TensorVar
from minicompile.errors import Unsupported

_LOW_PRECISION = (torch.float16, torch.bfloat16)
_BN_NAMES = ("input", "running_mean", "running_var", "weight", "bias", "training", "momentum",
             "eps")


# -- batch norm ----------------------------------------------------------------------------


@register("F.batch_norm")
def _batch_norm(em: Emitter, fname: str, args: tuple, kwargs: dict) -> Any:
    x, mean, var, weight, bias, training, momentum, eps = parse(
        fname, args, kwargs, _BN_NAMES, weight=None, bias=None, training=False, momentum=0.1,
        eps=1e-5)
    return batch_norm(em, fname, x, mean, var, weight, bias, training, momentum, eps)


@register("torch.batch_norm")
def _torch_batch_norm(em: Emitter, fname: str, args: tuple, kwargs: dict) -> Any:
    """``torch.batch_norm(input, weight, bias, running_mean, running_var, training, momentum,
    eps, cudnn_enabled)``: F.batch_norm's arguments in another order."""
    x, weight, bias, mean, var, training, momentum, eps, _cudnn = parse(
        fname, args, kwargs, ("input", "weight", "bias", "running_mean", "running_var",
                              "training", "momentum", "eps", "cudnn_enabled"))
    return batch_norm(em, fname, x, mean, var, weight, bias, training, momentum, eps)


def batch_norm(em: Emitter, fname: str, x: Any, mean: Any, var: Any, weight: Any, bias: Any,
               training: Any, momentum: Any, eps: Any) -> TensorVar:
    x = tensor_arg(fname, x)
    if type(training) is not bool or type(eps) not in (int, float):
        raise Unsupported(f"{fname}(): training must be a bool and eps a number here")
    if not training:  # one library call, decomposed by the passes
        return em.extern(F.batch_norm, (x, mean, var, weight, bias, False, momentum, eps), {})
    if (mean is None) != (var is None):
        raise Unsupported(f"{fname}(): only one of running_mean / running_var is given")
    if x.meta.ndim < 2 or not x.meta.dtype.is_floating_point:
        raise Unsupported(f"{fname}() of a {x.meta.ndim}-d {x.meta.dtype} input (eager raises)")
    shape = shape_of(x)
    channels = shape[1]
    for name, t in (("running_mean", mean), ("running_var", var), ("weight", weight),
                    ("bias", bias)):
        _check_per_channel(fname, name, t, channels, x)
    dims = (0, *range(2, len(shape)))
    n = math.prod(shape[d] for d in dims)
    if type(n) is int and n <= 1:
        raise Unsupported(f"{fname}(): {n} value(s) per channel in training (eager raises)")
    if isinstance(momentum, TensorVar):
        if momentum.meta.ndim != 0:
            raise Unsupported(f"{fname}(momentum=...) must be a number or a 0-d tensor")
    elif type(momentum) not in (int, float) and mean is not None:
        raise Unsupported(f"{fname}(momentum={momentum!r}) is not supported")

    xf = em.op("to_dtype", (x,), {"dtype": torch.float32}) if x.meta.dtype in _LOW_PRECISION \
        else x
    batch_mean = em.op("truediv", (em.op("sum", (xf, dims, True)), n))
    centred = em.op("sub", (xf, batch_mean))
    # The variance reads the mean detached: its derivative there, -2 * mean(x - mean), is 0,
    # and spelled out it cost the backward a third pass over x (eager's kernel takes two).
    apart = em.op("sub", (xf, em.op("detach", (batch_mean,), track=False)))
    squares = em.op("sum", (em.op("mul", (apart, apart)), dims, True))
    biased = em.op("truediv", (squares, n))
    out = em.op("mul", (centred, em.op("rsqrt", (em.op("add", (biased, float(eps))),))))
    if weight is not None:
        out = em.op("mul", (out, _per_channel(em, weight, len(shape))))
    if bias is not None:
        out = em.op("add", (out, _per_channel(em, bias, len(shape))))
    if out.meta.dtype != x.meta.dtype:
        out = em.op("to_dtype", (out,), {"dtype": x.meta.dtype})
    dense = _cuda_dense_layout(x)
    if dense is not None and tuple(out.meta.stride) != tuple(x.meta.stride):
        out = em.op("to_eager_layout", (out, dense))  # CUDA's kernels write x's layout
    elif dense is None and not _keeps_layout(x) and not out.meta.fake().is_contiguous():
        out = em.op("contiguous", (out,))  # eager's kernels write it row-major
    if mean is not None:
        unbiased = em.op("truediv", (squares, n - 1))
        _update_running(em, fname, mean, batch_mean, momentum, channels)
        _update_running(em, fname, var, unbiased, momentum, channels)
    return out


def _cuda_dense_layout(x: TensorVar) -> tuple[int, ...] | None:
    """``x``'s strides where eager's CUDA batch norm gives its result that layout
    (``empty_like``: a CUDA input without gaps or overlaps, static sizes), else None."""
    if x.meta.device.type != "cuda" or x.meta.is_symbolic:
        return None
    fake = x.meta.fake()
    dense = compat.prims_common().is_non_overlapping_and_dense_or_false(fake)
    return tuple(fake.stride()) if dense else None


def _keeps_layout(x: TensorVar) -> bool:
    """Whether eager's batch norm lays its result out as ``x`` (channels-last inputs; every
    other layout gives a row-major result)."""
    fake = x.meta.fake()
    formats = {4: torch.channels_last, 5: torch.channels_last_3d}
    return x.meta.ndim in formats and fake.is_contiguous(memory_format=formats[x.meta.ndim])


def _check_per_channel(fname: str, name: str, t: Any, channels: Any, x: TensorVar) -> None:
    if t is None:
        return
    t = tensor_arg(fname, t)
    if t.meta.ndim != 1 or shape_of(t)[0] != channels:
        raise Unsupported(f"{fname}(): {name} should have {channels} elements (eager raises)")
    if not t.meta.dtype.is_floating_point:
        raise Unsupported(f"{fname}(): {name} of dtype {t.meta.dtype} (eager raises)")
    mixed = x.meta.dtype in _LOW_PRECISION and t.meta.dtype == torch.float32
    if t.meta.dtype != x.meta.dtype and not mixed:
        raise Unsupported(f"{fname}(): {name} of dtype {t.meta.dtype} with a {x.meta.dtype} "
                          "input is not supported")


def _per_channel(em: Emitter, t: TensorVar, ndim: int) -> TensorVar:
    """A [C] tensor as [C, 1, ...], to broadcast over dim 1 of an ``ndim``-d input."""
    for _ in range(ndim - 2):
        t = em.op("unsqueeze", (t, t.meta.ndim), track=False)
    return t


def _update_running(em: Emitter, fname: str, running: TensorVar, stat: TensorVar,
                    momentum: Any, channels: Any) -> None:
    """``running = (1 - momentum) * running + momentum * stat``, written back in place.
    No gradient flows into the update (eager's kernel makes it under no_grad): a
    differentiable one made the backward take, and autograd zero-fill, a gradient per
    running statistic, and fold it into the batch statistics' gradients."""
    stat = em.op("detach", (em.op("reshape", (stat, (channels,)), track=False),), track=False)
    current = running
    if running.meta.dtype in _LOW_PRECISION:  # computed in float32, rounded once
        current = em.op("to_dtype", (running,), {"dtype": torch.float32})
    if isinstance(momentum, TensorVar):
        keep = em.op("sub", (1.0, momentum))
    else:
        keep = 1.0 - float(momentum)
        momentum = float(momentum)
    new = em.op("add", (em.op("mul", (current, keep)), em.op("mul", (stat, momentum))))
    what = f"{fname}(training=True) updating running statistics"
    mutation.mutate(em, running, new, what)  # type: ignore[arg-type]


def _cumulative_batch_norm_forward(self: Any, input: Any) -> Any:
    """``_BatchNorm.forward`` in training with ``momentum=None`` and running statistics:
    the cumulative-average factor ``1 / num_batches_tracked`` stays a tensor."""
    assert self.momentum is None and self.track_running_stats  # read, so guarded
    self._check_input_dim(input)
    self.num_batches_tracked.add_(1)
    factor = 1.0 / self.num_batches_tracked
    return F.batch_norm(input, self.running_mean, self.running_var, self.weight, self.bias,
                        True, factor, self.eps)


_BATCH_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)


def module_forward(m: Any) -> Any:
    """The forward to trace for module ``m`` in place of its class's, or None.  Its
    ``training``, ``momentum`` and buffers are guarded like every module attribute read
    (:meth:`GuardBuilder.module_match`)."""
    if (type(m) in _BATCH_NORMS and m.training and m.momentum is None
            and m.track_running_stats and m.num_batches_tracked is not None):
        return _cumulative_batch_norm_forward
    return None


# -- dropout -------------------------------------------------------------------------------

_DROPOUTS = ("dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout",
             "feature_alpha_dropout", "feature_dropout")


def _dropout(em: Emitter, fname: str, args: tuple, kwargs: dict) -> Any:
    functional = fname.startswith("torch.nn.functional")
    if functional:  # F.alpha_dropout and F.feature_alpha_dropout default to training=False
        training_default = "alpha" not in fname
        x, p, training, inplace = parse(fname, args, kwargs, ("input", "p", "training", "inplace"),
                                        p=0.5, training=training_default, inplace=False)
    else:  # torch.dropout(input, p, train)
        x, p, training = parse(fname, args, kwargs, ("input", "p", "train"))
        inplace = False
    x = tensor_arg(fname, x)
    if type(p) not in (int, float) or not 0 <= p <= 1:
        raise Unsupported(f"{fname}(p={p!r}): eager raises")
    if type(training) is not bool or type(inplace) is not bool:
        raise Unsupported(f"{fname}(): training and inplace must be bools here")
    if not training or p == 0:
        return x  # eager returns its input itself
    fn = getattr(F if functional else torch, fname.rpartition(".")[2])
    call_args = (x, float(p), True, False) if functional else (x, float(p), True)
    if inplace:  # the in-place kernel's draws (ops.dropout_in_place_draws)
        draws = (x, float(p), fname.rpartition(".")[2])
        result = em.op(ops.extern_op(ops.dropout_in_place_draws), draws, {}, track=False)
        return mutation.mutate(em, x, result, f"{fname}(inplace=True)")  # type: ignore[arg-type]
    return em.extern(fn, call_args, {})


for _name in _DROPOUTS:
    register(f"F.{_name}", f"torch.{_name}")(_dropout)

# Functions that take inplace=True themselves (calls.py makes the others functional).
OWN_IN_PLACE = frozenset(getattr(F, n) for n in _DROPOUTS if hasattr(F, n))
