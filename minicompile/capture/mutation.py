"""In-place tensor ops and views, functionalized while tracing.

An in-place op becomes its out-of-place form and the tracker is rebound to the new node.
Each view records its root and :class:`ViewStep` chain: mutating a view scatters into the
root, then replays every live view.  Mutated graph inputs are written back after the graph
runs; mutating a view that cannot be inverted (``expand``, ``unfold``) is Unsupported.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from minicompile.capture.kinds import Output
from minicompile.capture.variables import TensorVar
from minicompile.errors import Unsupported


@dataclasses.dataclass(frozen=True)
class ViewStep:
    """One view op from a tensor to its view.  ``kind`` is one of select, slice,
    unsqueeze, squeeze, permute, reshape, diagonal, alias, as_strided, expand, opaque.
    ``as_strided`` (size, stride, storage offset) relates an input to another input whose
    storage it shares (``f(a, a[0])``); its base is contiguous from offset 0."""

    kind: str
    args: tuple = ()
    fn: Any = None  # opaque: the extern callable, called as fn(x, *args, **kwargs)
    kwargs: tuple = ()  # opaque: sorted (name, value) pairs

    def apply(self, out: Output, x: TensorVar) -> TensorVar:
        """This view of ``x`` (a new tracker, not registered as a view)."""
        k, a = self.kind, self.args
        if k in _VIEW_FNS:
            return out.extern(_VIEW_FNS[k], (x, *a), {}, track=False)
        if k == "slice":
            dim, start, stop, step = a
            key = (slice(None),) * dim + (slice(start, stop, step),)
            return out.extern(torch.Tensor.__getitem__, (x, key), {}, track=False)
        if k in ("unsqueeze", "squeeze", "permute", "expand"):
            return out.op(k, (x, *a), track=False)
        if k == "alias":
            return TensorVar(x.node)
        if getattr(self.fn, "__name__", None) is None:  # externs._Unreplayable raises
            self.fn()
        return out.extern(self.fn, (x, *a), dict(self.kwargs), track=False)

    def scatter(self, out: Output, base: TensorVar, src: TensorVar) -> TensorVar:
        """The value of ``base`` after its view (this step of it) became ``src``."""
        k, a = self.kind, self.args
        if k in _SCATTER_FNS:
            return out.extern(_SCATTER_FNS[k], (base, src, *a), {}, track=False)
        if k == "unsqueeze":
            return out.op("squeeze", (src, a[0]), track=False)
        if k == "squeeze":
            if int(base.meta.shape[a[0]]) != 1:
                return src
            return out.op("unsqueeze", (src, a[0]), track=False)
        if k == "permute":
            inverse = tuple(sorted(range(len(a[0])), key=lambda i: a[0][i]))
            return out.op("permute", (src, inverse), track=False)
        if k == "reshape":
            return out.extern(torch.reshape, (src, base.meta.concrete_shape()), {}, track=False)
        if k == "alias":
            return src
        if k == "expand":
            # Eager refuses to write a view whose elements share memory; an empty one, or one
            # expanded only to size 1 (as many elements as its base), it writes.
            numel, base_numel = src.meta.numel(), base.meta.numel()
            if numel.is_Integer and base_numel.is_Integer and int(numel) == 0:
                return base  # nothing written
            if numel.is_Integer and base_numel.is_Integer and numel == base_numel:
                return out.extern(torch.reshape, (src, base.meta.concrete_shape()), {}, track=False)
        what = "an expanded (broadcast) view" if k == "expand" else f"a view made by {self.fn}"
        raise Unsupported(f"in-place op on {what} is not supported")


# The view steps that are one extern call, and their inverses.
_VIEW_FNS = {"select": torch.select, "reshape": torch.reshape, "diagonal": torch.diagonal,
             "as_strided": torch.as_strided}
_SCATTER_FNS = {"select": torch.select_scatter, "slice": torch.slice_scatter,
                "diagonal": torch.diagonal_scatter, "as_strided": torch.as_strided_scatter}


def register_view(out: Output, view: TensorVar, of: TensorVar, steps: tuple) -> None:
    """Record that ``view`` is ``of`` seen through ``steps``."""
    if view is of:
        return
    if of.base is not None:
        root, steps = of.base, (*of.view, *steps)
    else:
        root = of
    view.base, view.view = root, steps
    out.views.setdefault(id(root), []).append(view)


def slice_bounds(k: slice, size: Any) -> tuple[Any, Any, int]:
    """``k.indices(size)`` (with ``stop >= start``) that keeps a symbolic ``size`` symbolic:
    ``slice.indices`` would turn it into its traced number (an equality guard)."""
    step = 1 if k.step is None else k.step
    if step <= 0:
        raise Unsupported("negative slice steps on tensors (eager raises)")

    def bound(i: Any, default: Any) -> Any:
        if i is None:
            return default
        if i < 0:
            i = i + size
            return 0 if i < 0 else i
        return size if i > size else i

    start, stop = bound(k.start, 0), bound(k.stop, size)
    return start, (stop if stop >= start else start), step


def index_steps(key: Any, shape: tuple[int, ...]) -> list[ViewStep] | None:
    """``x[key]`` as view steps for basic keys (ints, slices, None, Ellipsis); None when the
    key has tensors or lists (advanced indexing, a copy)."""
    key = key if isinstance(key, tuple) else (key,)
    if any(not isinstance(k, (int, slice)) and k is not None and k is not Ellipsis for k in key):
        return None
    if any(type(k) is bool for k in key):
        raise Unsupported("indexing a tensor with True/False is not supported")
    if sum(k is Ellipsis for k in key) > 1:
        raise Unsupported("an index can only have a single ellipsis (eager raises)")
    consumed = sum(isinstance(k, (int, slice)) for k in key)
    ndim = len(shape)
    if consumed > ndim:
        raise Unsupported(f"too many indices for a {ndim}-d tensor (eager raises)")
    steps: list[ViewStep] = []
    od = d = 0  # dim of the original tensor / of the current intermediate
    for k in key:
        if k is None:
            steps.append(ViewStep("unsqueeze", (d,)))
            d += 1
        elif k is Ellipsis:
            od += ndim - consumed
            d += ndim - consumed
        elif isinstance(k, slice):
            start, stop, step = slice_bounds(k, shape[od])
            steps.append(ViewStep("slice", (d, start, stop, step)))
            od += 1
            d += 1
        else:
            size = shape[od]
            if not -size <= k < size:
                raise Unsupported(f"index {k} is out of bounds for size {size} (eager raises)")
            steps.append(ViewStep("select", (d, k % size)))
            od += 1
    return steps


def scatter_through(out: Output, root: TensorVar, steps: tuple | list, new: TensorVar) -> TensorVar:
    """The value of ``root`` after its view through ``steps`` became ``new``."""
    values = [root]
    for step in steps[:-1]:
        values.append(step.apply(out, values[-1]))
    for step, base in zip(reversed(steps), reversed(values)):
        new = step.scatter(out, base, new)
    return new


def _strides_that_matter(meta: Any) -> tuple:
    return tuple(st for size, st in zip(meta.shape, meta.stride) if size != 1)


def rebind(out: Output, root: TensorVar, new: TensorVar) -> None:
    """``root`` now holds ``new``'s value; recompute the views of ``root``.  An in-place op
    keeps the tensor's strides (an input read every other row stays so): the new value is
    given them, so later views of it are views exactly where eager's are."""
    if (not root.meta.is_symbolic and not new.meta.is_symbolic
            and _strides_that_matter(new.meta) != _strides_that_matter(root.meta)):
        moved = out.op("contiguous", (new,), track=False)
        moved.node.meta = dataclasses.replace(moved.node.meta, stride=root.meta.stride)
        new = moved
    root.node = new.node
    out.note_mutation(root)
    for view in list(out.views.get(id(root), ())):
        value = root
        for step in view.view:
            value = step.apply(out, value)
        view.node = value.node


def conform(out: Output, target: TensorVar, value: Any, what: str) -> TensorVar:
    """``value`` (a tensor or a Python number) as the new contents of ``target``: cast to its
    dtype and broadcast to its shape, as in-place ops and ``copy_`` do.  Sizes are SymInts
    where symbolic: comparing them records the relations relied on as guards."""
    shape = target.meta.sizes()
    if not isinstance(value, TensorVar):
        if type(value) not in (bool, int, float):
            raise Unsupported(f"{what}: value of type {type(value).__name__} is not supported")
        return out.extern(torch.full_like, (target, value), {}, track=False)
    if value.meta.device != target.meta.device:
        raise Unsupported(f"{what}: copying between devices is not supported")
    if value.meta.dtype != target.meta.dtype:
        value = out.op("to_dtype", (value,), {"dtype": target.meta.dtype})
    vshape = value.meta.sizes()
    while len(vshape) > len(shape) and vshape[0] == 1:  # eager drops leading 1s
        value = out.op("squeeze", (value, 0), track=False)
        vshape = vshape[1:]
    if vshape != shape:
        try:
            torch.broadcast_shapes(vshape, shape)
        except RuntimeError as e:
            raise Unsupported(f"{what}: shape {vshape} does not broadcast to {shape}") from e
        if len(vshape) > len(shape) or torch.broadcast_shapes(vshape, shape) != shape:
            raise Unsupported(f"{what}: shape {vshape} does not broadcast to {shape}")
        value = out.op("expand", (value, shape), track=False)
    return value


def refuse_grad_input(out: Output, target: TensorVar, what: str) -> None:
    """An in-place op on an input that requires grad (or a view of one) is refused: on a
    leaf eager raises, and on a non-leaf autograd would have to see the caller's tensor
    change.  Intermediates are functionalized, so the backward differentiates the new
    value, exactly as autograd differentiates eager's in-place op."""
    root = target.base or target
    if out.grad_enabled and root.meta.requires_grad and id(root) in out.input_nodes:
        raise Unsupported(f"{what}: in-place op on an input that requires grad",
                          hint="run under torch.no_grad(), or write to a copy")


def mutate(out: Output, target: TensorVar, new: TensorVar, what: str) -> TensorVar:
    """``target`` now holds ``new`` (the functional result of an in-place op on it), cast
    to ``target``'s dtype as eager does.  Returns ``target``, as in-place ops do."""
    refuse_grad_input(out, target, what)
    if not isinstance(new, TensorVar):
        raise Unsupported(f"{what}: the result is not a tensor")
    # Symbolic sizes compare as SymInts: a size is equal only where the shape environment
    # proves it (a relation the op's own meta check recorded, kept as a guard), never by
    # its traced value alone.
    if new.meta.sizes() != target.meta.sizes():
        raise Unsupported(f"{what}: result shape {new.meta} differs from the "
                          f"tensor's {target.meta} (eager raises)")
    if new.meta.dtype != target.meta.dtype:
        if not torch.can_cast(new.meta.dtype, target.meta.dtype):
            raise Unsupported(f"{what}: result type {new.meta.dtype} can't be cast to "
                              f"{target.meta.dtype} (eager raises)")
        new = out.op("to_dtype", (new,), {"dtype": target.meta.dtype})
    if target.base is None:
        rebind(out, target, new)
    else:
        rebind(out, target.base, scatter_through(out, target.base, target.view, new))
    return target


def setitem(out: Output, x: TensorVar, key: Any, value: Any) -> None:
    """``x[key] = value``, functionalized."""
    what = "tensor item assignment (x[...] = v)"
    steps = index_steps(key, x.meta.sizes())  # (SymInts where symbolic, as externs.py)
    if steps is not None:
        region = x
        for step in steps:
            region = step.apply(out, region)
        new_region = conform(out, region, value, what)
        refuse_grad_input(out, x, what)
        root = x.base or x
        chain = (*x.view, *steps) if x.base is not None else tuple(steps)
        rebind(out, root, scatter_through(out, root, chain, new_region))
        return
    keys = key if isinstance(key, tuple) else (key,)
    if not all(isinstance(k, TensorVar) for k in keys):
        raise Unsupported(f"{what} with a mixed basic/advanced index is not supported yet")
    if not isinstance(value, TensorVar):
        value = out.extern(torch.Tensor.new_full, (x, (), value), {}, track=False)
    elif value.meta.dtype != x.meta.dtype:
        value = out.op("to_dtype", (value,), {"dtype": x.meta.dtype})
    new = out.extern(torch.Tensor.index_put, (x, tuple(keys), value), {}, track=False)
    mutate(out, x, new, what)
