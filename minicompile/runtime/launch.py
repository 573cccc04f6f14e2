"""Cheap launches of compiled Triton kernels on a GPU.

``kernel[grid](*args)`` goes through ``triton.jit``'s per-call path: every argument is
specialized (dtype, 16-byte alignment, integer value classes), the kernel is looked up in
its cache, launch metadata is built, and only then is the compiled kernel launched.  On an
H100 host that is about 20 µs a launch, of which the launch itself is 9.

A :class:`Launcher` takes that path once for each specialization, to compile and to get the
compiled kernel, and afterwards launches the compiled kernel directly.  Its cache key is
what Triton specializes a kernel on for our arguments: each pointer's alignment, and each
integer's class (1, a multiple of 16, fits in 32 bits), on the current device.  A key it
has not seen (a misaligned view, a new dynamic size) goes through ``triton.jit`` again, so
no launch ever uses a kernel compiled for other arguments.
"""

from __future__ import annotations

from typing import Any

import torch

_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
_current_device = getattr(torch._C, "_cuda_getDevice", None)


def _int_class(v: int) -> tuple[bool, bool, bool]:
    return (v == 1, v % 16 == 0, -(2**31) <= v < 2**31)


class Launcher:
    """``launcher(grid, *args)``: launch ``fn`` over ``grid`` programs (one axis) with the
    positional ``args`` (tensors and ints) and the fixed keyword ``options`` (constexprs
    and compile options such as ``num_warps``).

    ``pointers``: the positions of the tensors whose alignment may change from call to call
    (inputs, library results; the wrapper's own allocations are always aligned), and
    ``sizes`` those of the integers that may (dynamic sizes; the others are constants of
    the generated code).  Only those are part of the cache key."""

    def __init__(self, fn: Any, pointers: tuple[int, ...], sizes: tuple[int, ...],
                 **options: Any) -> None:
        self.fn = fn
        self.options = options
        self.pointers, self.sizes = pointers, sizes
        self.compiled: dict[tuple, Any] = {}
        self.constexprs: tuple | None = None  # in the kernel's parameter order, once known
        self.direct = _raw_stream is not None and _current_device is not None

    def key(self, args: tuple) -> tuple:
        aligned = tuple([args[i].data_ptr() & 15 == 0 for i in self.pointers])
        if self.sizes:
            return (_current_device(), aligned, tuple([_int_class(args[i]) for i in self.sizes]))
        return (_current_device(), aligned)

    def __call__(self, grid: int, *args: Any) -> None:
        if self.constexprs is None:
            rest = list(getattr(self.fn, "arg_names", ()))[len(args):]
            self.direct = self.direct and all(n in self.options for n in rest)
            self.constexprs = tuple(self.options.get(n) for n in rest)
        key = self.key(args) if self.direct else None
        kernel = self.compiled.get(key) if key is not None else None
        if kernel is None:
            compiled = self.fn[(grid,)](*args, **self.options)
            if key is not None and hasattr(compiled, "packed_metadata"):
                self.compiled[key] = compiled
            return
        kernel.run(grid, 1, 1, _raw_stream(key[0]), kernel.function,
                   kernel.packed_metadata, None, None, None, *args, *self.constexprs)
