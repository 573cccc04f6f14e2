"""A compiled backward's gradient buffers, kept across calls on the CPU.

Eager's backward allocates each gradient anew, and so did ours: on the CPU, glibc hands
the freed gradients (47 MB of resnet18's) back to the OS after each step, and the next step
faults every page in again (a third of a step's time).  A caching allocator spares eager
this on GPUs; here the generated backward asks :class:`OutputPool` for each output it
makes of 128 KiB or more (smaller ones come from glibc's heap without faults:
codegen/memory_reuse.MIN_POOLED_BYTES), and gets the memory of an earlier call's output
back when nothing else holds it any more: no ``p.grad`` that was kept, no returned value,
no view.  The pool keeps storages, not
tensors, so a gradient it hands out is a tensor nothing else refers to (autograd's
AccumulateGrad then takes it as ``p.grad`` without a copy, as eager's).
"""

from __future__ import annotations

import sys
import threading
import weakref

import torch

from minicompile import compat

KEEP = 2  # storages kept per output: a loop may hold one step's gradients into the next

_use_count = compat.storage_functions()[2]


class OutputPool:
    """``take(k, ...)``: the k-th output's tensor of this size, strides and dtype, in the
    memory of one of the last ``KEEP`` made for it that only the pool still holds."""

    def __init__(self, outputs: int) -> None:
        # Per output: (size, strides, dtype), a tensor and its storage.  Only ``detach()``ed
        # aliases of the tensor leave (a TensorImpl of their own, which AccumulateGrad takes
        # as ``p.grad``); each alias, view or other tensor of the memory counts in its
        # storage's use count.
        self.kept: list[list[tuple[tuple, torch.Tensor, torch.UntypedStorage]]] = [
            [] for _ in range(outputs)]
        self.lock = threading.Lock()  # (two threads never get one storage)

    def take(self, k: int, size: tuple, stride: tuple, dtype: torch.dtype,
             device: torch.device) -> torch.Tensor:
        key = (size, stride, dtype)
        kept = self.kept[k]
        with self.lock:
            for have, t, storage in kept:
                # Python references: kept's tuple, the loop's name, getrefcount's argument
                # and the storage's own (PyTorch keeps a storage's Python object alive while
                # a tensor uses it); its users: the kept tensor and storage object.
                if have == key and sys.getrefcount(storage) == 4 \
                        and _use_count(storage._cdata) == 2:
                    return t.detach()
            t = torch.empty_strided(size, stride, dtype=dtype, device=device)
            if _use_count is None:
                return t
            if len(kept) == KEEP:
                del kept[0]
            kept.append((key, t, t.untyped_storage()))
            return t.detach()

    def clear(self) -> None:
        """Drops every kept storage (a training step whose backward this is was freed: the
        generated module outlives it in the build cache; another step of the same code
        only makes its buffers again)."""
        with self.lock:
            for kept in self.kept:
                kept.clear()


def release_with(owner: object, backward: object) -> None:
    """The pool of the generated ``backward`` (its module's ``pool``), emptied when
    ``owner`` is freed."""
    pool = getattr(backward, "__globals__", {}).get("pool")
    if isinstance(pool, OutputPool):
        weakref.finalize(owner, pool.clear)
