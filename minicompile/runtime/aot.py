"""Exported libraries: build them with PyTorch's C++ library, load them into Python, and the
runner program that runs one without Python.

An exported model is three files (minicompile/aot_export.py writes them): ``model.so`` (the
kernels and the C++ wrapper, codegen/export_wrapper.py), ``model.weights`` (its parameters and
buffers, read by the library on its first call) and the runner, ``minicompile_runner``,
which serves every exported library::

    minicompile_runner model.so inputs.pt outputs.pt

reads the tensors Python saved (``torch.save([x, y], "inputs.pt")``: a tensor, list or
tuple), runs the model and writes its outputs as a tuple ``torch.load`` reads.  The runner
is built once per PyTorch install and compiler (cached under the cache directory) and
copied beside each library.
"""

from __future__ import annotations

import ctypes
import dataclasses
import json
import os
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from minicompile import compat
from minicompile.config import Config
from minicompile.errors import BackendCompilerFailed
from minicompile.runtime import cache
from minicompile.runtime.build import vector_math_flags
from minicompile.runtime.cache import cache_key, tool_versions

RUNNER_SOURCE = r"""// minicompile_runner: run an exported minicompile library without Python.
//   minicompile_runner model.so inputs.pt outputs.pt [repeats]
// inputs.pt: a tensor, or a list or tuple of tensors, saved with torch.save;
// outputs.pt: the model's outputs as a tuple, for torch.load.  With repeats, the model
// runs that many more times and the median time of a run is printed.
#include <ATen/core/ivalue.h>
#include <torch/csrc/jit/serialization/pickle.h>

#include <dlfcn.h>
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <iterator>
#include <vector>

using RunFn = int (*)(void**, int64_t, void**, int64_t);

int main(int argc, char** argv) {
    if (argc != 4 && argc != 5) {
        std::cerr << "usage: " << argv[0] << " model.so inputs.pt outputs.pt [repeats]\n";
        return 2;
    }
    void* lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        std::cerr << "cannot load " << argv[1] << ": " << dlerror() << "\n";
        return 1;
    }
    auto run = reinterpret_cast<RunFn>(dlsym(lib, "mc_run"));
    auto last_error = reinterpret_cast<const char* (*)()>(dlsym(lib, "mc_last_error"));
    auto num_outputs = reinterpret_cast<int64_t (*)()>(dlsym(lib, "mc_num_outputs"));
    if (!run || !last_error || !num_outputs) {
        std::cerr << argv[1] << " is not a library exported by minicompile\n";
        return 1;
    }
    std::ifstream in(argv[2], std::ios::binary);
    if (!in) {
        std::cerr << "cannot read " << argv[2] << "\n";
        return 1;
    }
    std::vector<char> data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::vector<at::Tensor> tensors;
    try {
        c10::IValue saved = torch::jit::pickle_load(data);
        std::vector<c10::IValue> items;
        if (saved.isTensor()) {
            items.push_back(saved);
        } else if (saved.isTuple()) {
            items = saved.toTupleRef().elements().vec();
        } else {
            items = saved.toList().vec();
        }
        for (const c10::IValue& item : items) tensors.push_back(item.toTensor());
    } catch (const std::exception& e) {
        std::cerr << argv[2] << " does not hold a tensor or a list of tensors: " << e.what()
                  << "\n";
        return 1;
    }
    std::vector<void*> outputs(num_outputs());
    auto run_once = [&]() {  // mc_run takes over (deletes) the input handles
        std::vector<void*> inputs;
        for (const at::Tensor& t : tensors) inputs.push_back(new at::Tensor(t));
        return run(inputs.data(), inputs.size(), outputs.data(), outputs.size());
    };
    if (run_once() != 0) {
        std::cerr << "the model failed: " << last_error() << "\n";
        return 1;
    }
    int repeats = argc == 5 ? std::atoi(argv[4]) : 0;
    std::vector<double> times;
    for (int k = 0; k < repeats; ++k) {
        for (void* handle : outputs) delete static_cast<at::Tensor*>(handle);
        auto start = std::chrono::steady_clock::now();
        if (run_once() != 0) {
            std::cerr << "the model failed: " << last_error() << "\n";
            return 1;
        }
        times.push_back(std::chrono::duration<double, std::milli>(
            std::chrono::steady_clock::now() - start).count());
    }
    if (!times.empty()) {
        std::sort(times.begin(), times.end());
        std::cerr << "minicompile_runner: " << times[times.size() / 2] << " ms a run (median of "
                  << times.size() << ")\n";
    }
    std::vector<c10::IValue> results;
    for (void* handle : outputs) {
        at::Tensor* t = static_cast<at::Tensor*>(handle);
        results.emplace_back(*t);
        delete t;
    }
    auto tuple = c10::ivalue::Tuple::create(std::move(results));
    std::vector<char> bytes = torch::jit::pickle_save(tuple);
    std::ofstream out(argv[3], std::ios::binary);
    out.write(bytes.data(), bytes.size());
    return out ? 0 : 1;
}
"""


def torch_flags() -> tuple[list[str], list[str]]:
    """Compiler flags for PyTorch's C++ headers, and linker flags for its libraries."""
    from torch.utils import cpp_extension

    abi = compat.cxx11_abi()
    compile_flags = ["-std=c++20", f"-D_GLIBCXX_USE_CXX11_ABI={abi}"]
    compile_flags += [f"-I{p}" for p in cpp_extension.include_paths()]
    lib_dirs = cpp_extension.library_paths()
    link = [f"-L{p}" for p in lib_dirs] + [f"-Wl,-rpath,{p}" for p in lib_dirs]
    return compile_flags, link + ["-ltorch", "-ltorch_cpu", "-lc10"]


def _run(cmd: list[str], what: str) -> None:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    except (OSError, subprocess.SubprocessError) as e:
        raise BackendCompilerFailed(f"could not run the C++ compiler for {what}: {e}") from e
    if proc.returncode != 0:
        raise BackendCompilerFailed(
            f"building {what} failed ({' '.join(cmd)}):\n{proc.stderr.strip()[-4000:]}")


def build_library(kernels: str, wrapper: str, out: Path, cfg: Config) -> None:
    """Compile the kernels' unit (the C++ backend's flags) and the wrapper's (PyTorch's
    headers) at once, and link them into the shared library ``out``."""
    compile_flags, link_flags = torch_flags()
    mvec = vector_math_flags()
    base = [f for f in cfg.cxx_flags if f != "-shared"]
    with tempfile.TemporaryDirectory(prefix="minicompile-export-") as folder:
        tmp = Path(folder)
        (tmp / "kernels.cpp").write_text(kernels)
        (tmp / "wrapper.cpp").write_text(wrapper)
        kernel_cmd = [cfg.cxx, *base, *[f for f in mvec if not f.startswith("-l")], "-c",
                      str(tmp / "kernels.cpp"), "-o", str(tmp / "kernels.o")]
        wrapper_cmd = [cfg.cxx, "-O2", "-fPIC", *compile_flags, "-c", str(tmp / "wrapper.cpp"),
                       "-o", str(tmp / "wrapper.o")]
        with ThreadPoolExecutor(2) as pool:
            done = [pool.submit(_run, kernel_cmd, "the kernels"),
                    pool.submit(_run, wrapper_cmd, "the wrapper")]
            for job in done:
                job.result()
        link = [cfg.cxx, "-shared", "-fopenmp", str(tmp / "kernels.o"), str(tmp / "wrapper.o"),
                "-o", str(tmp / "model.so"), *link_flags,
                *[f for f in mvec if f.startswith("-l")], "-ldl"]
        _run(link, "the library")
        os.replace(tmp / "model.so", out) if _same_device(tmp, out) else shutil.move(
            str(tmp / "model.so"), str(out))


def _same_device(a: Path, b: Path) -> bool:
    try:
        return os.stat(a).st_dev == os.stat(b.parent).st_dev
    except OSError:
        return False


def runner(cfg: Config) -> Path:
    """The runner program, built once for this PyTorch and compiler (cached on disk)."""
    compile_flags, link_flags = torch_flags()
    cmd_flags = ["-O2", *compile_flags]
    key = cache_key(RUNNER_SOURCE, " ".join(cmd_flags + link_flags), tool_versions(cfg.cxx))
    parts = ("runner", key[:2])
    found = cache.find(cfg.cache_dir, parts, f"{key}.bin")
    if found is not None and cache.sha256_file(found) == _read(found.with_suffix(".sum")):
        return found
    src = cache.store(cfg.cache_dir, parts, f"{key}.cpp", RUNNER_SOURCE)
    tmp = cache.scratch(cfg.cache_dir, parts, key, ".bin")
    _run([cfg.cxx, *cmd_flags, str(src), "-o", str(tmp), *link_flags, "-ldl"], "the runner")
    built = tmp.parent / f"{key}.bin"
    cache.write_atomic(built.with_suffix(".sum"), cache.sha256_file(tmp) or "")
    os.replace(tmp, built)
    return built


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def weights_path(library: Path) -> Path:
    """Where a library finds its weights: its path with ``.so`` replaced by ``.weights``."""
    name = library.name[:-3] if library.name.endswith(".so") else library.name
    return library.with_name(name + ".weights")


def write_weights(path: Path, weights: list[torch.Tensor]) -> None:
    """The weights file the library reads (export_wrapper.PREAMBLE's mc_read_weights): each
    tensor's storage in its own layout (what the kernels were generated for)."""
    with open(path, "wb") as f:
        f.write(b"MCWEIGHTS1")
        f.write(len(weights).to_bytes(8, "little"))
        for w in weights:
            w = w.detach()
            laid = torch.empty_strided(w.shape, w.stride(), dtype=w.dtype).copy_(w)
            data = bytes(laid.untyped_storage()) if laid.untyped_storage().nbytes() else b""
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
    """An exported library loaded into this process (``minicompile.load``): call it with
    the inputs' tensors; it returns what the exported function returned."""

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
    """Load a library written by minicompile.export into this process, its weights read
    now.  A library exported again to a path loaded before is loaded from a copy: the
    dynamic loader would return the library it already holds under that name."""
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
        if weights_path(path).exists():
            shutil.copyfile(weights_path(path), weights_path(target))
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
