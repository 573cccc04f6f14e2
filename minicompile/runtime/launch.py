"""Cheap launches of compiled Triton kernels on a GPU (``kernel[grid](*args)`` costs about
14 µs on an H100 host).  A :class:`Launcher` keys its launches by what Triton specializes on
(pointer alignment, integer classes, the device) and launches the key's cubin through
PyTorch's static CUDA launcher, else through Triton's launcher.  A new key is built again:
no launch uses a kernel compiled for other arguments.
"""

from __future__ import annotations

from typing import Any

import torch

from minicompile import compat, perf
from minicompile.runtime import triton_build
from minicompile.runtime.triton_build import int_class

_raw_stream, _current_device = compat.cuda_stream_functions()
_static_launcher = compat.STATIC_CUDA_LAUNCHER


class Example:
    """A tensor argument as codegen describes it: its dtype, 16-byte aligned."""

    def __init__(self, dtype: torch.dtype) -> None:
        self.dtype = dtype

    def data_ptr(self) -> int:
        return 0


class Launcher:
    """``launcher(grid, *args)``: launch ``fn`` over ``grid`` programs (one axis) with
    ``args`` (tensors, then ints) and the fixed keyword ``options``.  Only the tensors at
    ``pointers`` (not the wrapper's own allocations, always aligned) and the ints at
    ``sizes`` (dynamic sizes) may change class between calls: they make the key.
    ``example``: what the calls pass as far as codegen knows (dtypes, values or hints;
    None where unknown), for a build ahead of the first call."""

    def __init__(self, fn: Any, pointers: tuple[int, ...], sizes: tuple[int, ...],
                 example: tuple | None = None, **options: Any) -> None:
        self.fn = fn
        self.options = options
        self.pointers, self.sizes = pointers, sizes
        self.example = example
        self.compiled: dict[tuple, Any] = {}  # key -> Triton's compiled kernel
        self.static: dict[tuple, tuple] = {}  # key -> a static launch's fixed arguments
        self.no_static: set[tuple] = set()  # keys whose kernel needs Triton's launcher
        self.constexprs: tuple | None = None  # in the kernel's parameter order, once known
        self.tensors: int | None = None  # how many arguments are tensors, once known
        self.direct = _raw_stream is not None and _current_device is not None
        self.build: triton_build.Built | None = None  # the example's, once adopted
        self.built_on = 0  # ... for this device

    def example_args(self) -> list | None:  # (None: unknown)
        if self.example is None or any(v is None for v in self.example):
            return None
        return [v if isinstance(v, int) else Example(v) for v in self.example]

    def __call__(self, grid: int, *args: Any) -> None:
        key = None
        if self.direct:  # the key: see the module's doc
            tensors = self.tensors
            if tensors is None:  # (the tensors come first)
                tensors = self.tensors = sum(not isinstance(a, int) for a in args)
            ptrs = tuple([a.data_ptr() for a in args[:tensors]])
            device = _current_device()
            aligned = tuple([ptrs[i] & 15 == 0 for i in self.pointers])
            key = ((device, aligned, tuple([int_class(args[i]) for i in self.sizes]))
                   if self.sizes else (device, aligned))
            launch = self.static.get(key)
            if launch is None and key not in self.no_static:
                launch = self._static(key, args)
            if launch is not None:
                function, warps, shared, codes, keep, tail = launch
                # Pointers as integers: the static launcher reads a tensor's data_ptr slower.
                ints = args[tensors:] if keep is None else tuple([args[i] for i in keep])
                try:
                    _static_launcher._launch_kernel(function, grid, 1, 1, warps, shared,
                                                    codes, ptrs + ints + tail,
                                                    _raw_stream(device))
                    return
                except RuntimeError as e:  # the driver refused the launch: Triton's path
                    del self.static[key]
                    self.no_static.add(key)
                    name = getattr(self.fn, "__name__", "a kernel")
                    perf.note(f"{name} launches through Triton: {e}")
        if self.constexprs is None:
            rest = list(getattr(self.fn, "arg_names", ()))[len(args):]
            self.direct = self.direct and all(n in self.options for n in rest)
            self.constexprs = tuple(self.options.get(n) for n in rest)
        kernel = self.compiled.get(key) if key is not None else None
        if kernel is None:
            fn = self.fn.real() if hasattr(self.fn, "real") else self.fn
            compiled = fn[(grid,)](*args, **self.options)
            if key is not None and hasattr(compiled, "packed_metadata"):
                self.compiled[key] = compiled
            return
        kernel.run(grid, 1, 1, _raw_stream(key[0]), kernel.function,
                   kernel.packed_metadata, None, None, None, *args, *self.constexprs)

    def adopt(self, built: triton_build.Built, device: int) -> None:
        """Ahead of the first call: the static launch of a call like the example."""
        args = self.example_args()
        if not self.direct or args is None:
            return
        self.tensors = sum(not isinstance(a, int) for a in args)
        key = (device, (True,) * len(self.pointers))  # (the example: aligned)
        if self.sizes:
            key += (tuple([int_class(args[i]) for i in self.sizes]),)
        if key not in self.static:
            try:
                self.static[key] = self._launch(built, tuple(args), device)
            except RuntimeError:  # (the driver refuses the cubin: the first call says so)
                return
        self.build, self.built_on = built, device

    def _launch(self, built: triton_build.Built, args: tuple, device: int) -> tuple:
        """A static launch's function, warps, shared memory, codes, ints passed, scratch tail."""
        function = triton_build.load(built.cubin, built.name, built.shared, device)
        tensors = self.tensors
        # Integers equal to 1 are constants of the kernel: not passed.
        keep = [i for i, a in enumerate(args[tensors:], tensors) if a != 1]
        tail = (None,) * (len(built.arg_codes) - tensors - len(keep))
        return (function, built.num_warps, built.shared, built.arg_codes,
                tuple(keep) if len(keep) < len(args) - tensors else None, tail)

    def _static(self, key: tuple, args: tuple) -> tuple | None:
        """The static launch of ``key`` (None: it needs Triton's launcher)."""
        launch = None
        if triton_build.available():
            built = triton_build.find_or_build(self.fn, args, self.options, key[0])
            if built is not None:
                launch = self._launch(built, args, key[0])
        if launch is None:
            self.no_static.add(key)
        else:
            self.static[key] = launch
        return launch
