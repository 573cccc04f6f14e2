"""Exported libraries: build them with PyTorch's C++ library, load them into Python, and
the runner program (runner.cpp) that runs one without Python.

An exported model is ``model.so`` (kernels and C++ wrapper), ``model.weights`` (read on
its first call), for CUDA ``model.cubins`` (its Triton kernels) and ``minicompile_runner``,
built once per PyTorch install and compiler (cached) and copied beside each library::

    minicompile_runner model.so inputs.pt outputs.pt
"""

from __future__ import annotations

import ctypes
import dataclasses
import json
import os
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from minicompile import compat
from minicompile.config import Config
from minicompile.runtime import toolchain
from minicompile.runtime.build import cached_build, vector_math_flags

RUNNER_SOURCE = Path(__file__).with_name("runner.cpp").read_text()


def torch_flags() -> tuple[list[str], list[str]]:
    """Compiler flags for PyTorch's C++ headers, and linker flags for its libraries."""
    from torch.utils import cpp_extension

    abi = compat.cxx11_abi()
    compile_flags = ["-std=c++20", f"-D_GLIBCXX_USE_CXX11_ABI={abi}"]
    compile_flags += [f"-I{p}" for p in cpp_extension.include_paths()]
    lib_dirs = cpp_extension.library_paths()
    link = [f"-L{p}" for p in lib_dirs] + [f"-Wl,-rpath,{p}" for p in lib_dirs]
    return compile_flags, link + ["-ltorch", "-ltorch_cpu", "-lc10"]


def build_library(kernels: str | None, wrapper: str, out: Path, cfg: Config) -> None:
    """Compile the kernels' and the wrapper's units at once, and link them into ``out``
    (``kernels`` None: the wrapper alone, whose kernels are cubins)."""
    compile_flags, link_flags = torch_flags()
    mvec = vector_math_flags()
    base = [f for f in cfg.cxx_flags if f != "-shared"]
    with tempfile.TemporaryDirectory(prefix="minicompile-export-") as folder:
        tmp = Path(folder)
        (tmp / "kernels.cpp").write_text(kernels or "")
        (tmp / "wrapper.cpp").write_text(wrapper)
        kernel_cmd = [cfg.cxx, *base, *[f for f in mvec if not f.startswith("-l")], "-c",
                      str(tmp / "kernels.cpp"), "-o", str(tmp / "kernels.o")]
        wrapper_cmd = [cfg.cxx, "-O2", "-fPIC", *compile_flags, "-c", str(tmp / "wrapper.cpp"),
                       "-o", str(tmp / "wrapper.o")]
        with ThreadPoolExecutor(2) as pool:
            done = [pool.submit(toolchain.run, wrapper_cmd, "the wrapper")]
            if kernels is not None:
                done.append(pool.submit(toolchain.run, kernel_cmd, "the kernels"))
            for job in done:
                job.result()
        objects = [str(tmp / "kernels.o")] if kernels is not None else []
        link = [cfg.cxx, "-shared", "-fopenmp", *objects, str(tmp / "wrapper.o"),
                "-o", str(tmp / "model.so"), *link_flags,
                *[f for f in mvec if f.startswith("-l")], "-ldl"]
        toolchain.run(link, "the library")
        shutil.move(str(tmp / "model.so"), str(out))  # (a rename where it can be)


def runner(cfg: Config) -> Path:
    """The runner program, built once for this PyTorch and compiler (cached on disk)."""
    compile_flags, link_flags = torch_flags()
    flags = ["-O2", *compile_flags]
    return cached_build(RUNNER_SOURCE, " ".join(flags + link_flags), cfg, "runner", ".bin",
                        lambda src, out: toolchain.run([cfg.cxx, *flags, str(src), "-o",
                                                        str(out), *link_flags, "-ldl"],
                                                       "the runner"))[0]


def beside(library: Path, suffix: str) -> Path:
    """A file the library reads beside it (``.weights``, ``.cubins``): its path with ``.so``
    replaced by ``suffix``."""
    name = library.name[:-3] if library.name.endswith(".so") else library.name
    return library.with_name(name + suffix)


def write_weights(path: Path, weights: list[torch.Tensor]) -> None:
    """The weights file the library reads: each tensor's storage in its own layout."""
    with open(path, "wb") as f:
        f.write(b"MCWEIGHTS1")
        f.write(len(weights).to_bytes(8, "little"))
        for w in weights:
            w = w.detach()
            laid = torch.empty_strided(w.shape, w.stride(), dtype=w.dtype).copy_(w)
            storage = laid.untyped_storage()  # (its bytes through NumPy: bytes() of a
            # storage reads it element by element, minutes for a ResNet's weights)
            data = (torch.empty(0, dtype=torch.uint8).set_(storage).numpy().tobytes()
                    if storage.nbytes() else b"")
            f.write(len(data).to_bytes(8, "little"))
            f.write(data)


_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_capsule_pointer.restype = ctypes.c_void_p
_new_capsule = ctypes.pythonapi.PyCapsule_New
_new_capsule.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_new_capsule.restype = ctypes.py_object


@dataclasses.dataclass
class ExportedModel:
    """An exported library loaded into this process (``minicompile.load``): call it."""

    path: Path
    lib: Any
    signature: dict

    def __call__(self, *args: torch.Tensor) -> Any:
        _aoti = compat.aoti()
        if not all(isinstance(a, torch.Tensor) for a in args):
            raise TypeError("an exported model takes tensors")
        # New at::Tensor handles (in PyCapsules), which mc_run takes over and deletes.
        handles = _aoti.unsafe_alloc_void_ptrs_from_tensors(list(args))
        n_out = self.lib.mc_num_outputs()
        inputs = (ctypes.c_void_p * max(len(handles), 1))(
            *[_capsule_pointer(h, None) for h in handles])
        outputs = (ctypes.c_void_p * max(n_out, 1))()
        if self.lib.mc_run(inputs, len(handles), outputs, n_out) != 0:
            message = self.lib.mc_last_error().decode(errors="replace")
            raise RuntimeError(f"exported model {self.path.name}: {message}")
        # Handles mc_run made for us: PyTorch takes them over as tensors.
        results = _aoti.alloc_tensors_by_stealing_from_void_ptrs(
            [_new_capsule(outputs[k], None, None) for k in range(n_out)])
        structure = self.signature["returns"]
        if structure == "tensor":
            return results[0]
        return tuple(results) if structure == "tuple" else list(results)

    def __repr__(self) -> str:
        return f"<minicompile exported model {self.path}: {self.signature['inputs']}>"


_stamps: dict[Path, tuple[int, int, int]] = {}  # libraries loaded, as they were then


def load(path: str | os.PathLike) -> ExportedModel:
    """Load a library written by minicompile.export, its weights read now (from a copy if
    the path was loaded before: the dynamic loader would return the library it holds)."""
    path = Path(path).resolve()
    try:
        info = path.stat()
    except OSError as e:
        raise OSError(f"minicompile.load: cannot load {path}: {e}") from e
    stamp = (info.st_ino, info.st_mtime_ns, info.st_size)
    target = path
    if _stamps.setdefault(path, stamp) != stamp:
        target = Path(tempfile.mkdtemp(prefix="minicompile-load-")) / path.name
        shutil.copyfile(path, target)
        for suffix in (".weights", ".cubins"):
            if beside(path, suffix).exists():
                shutil.copyfile(beside(path, suffix), beside(target, suffix))
    try:
        lib = ctypes.CDLL(str(target))
    except OSError as e:
        raise OSError(f"minicompile.load: cannot load {path}: {e}") from e
    if not hasattr(lib, "mc_run") or not hasattr(lib, "mc_signature"):
        raise OSError(f"minicompile.load: {path} is not a library exported by minicompile")
    lib.mc_run.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64]
    lib.mc_run.restype = ctypes.c_int
    lib.mc_last_error.restype = ctypes.c_char_p
    lib.mc_num_outputs.restype = ctypes.c_int64
    lib.mc_signature.restype = ctypes.c_char_p
    if lib.mc_init() != 0:
        raise RuntimeError(f"minicompile.load: {path.name}: "
                           f"{lib.mc_last_error().decode(errors='replace')}")
    return ExportedModel(path, lib, json.loads(lib.mc_signature().decode()))
