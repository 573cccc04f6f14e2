"""The Triton kernels of an exported CUDA library, built to cubins at export time, and the
``model.cubins`` file beside the library that its C++ wrapper loads them from.

The build is runtime/triton_build.py's: the same kernel file (Triton's imports, the helpers,
the kernels), the same worker processes and job, for the GPU target given (no GPU needed:
``("cuda", 90, 32)`` builds for Hopper anywhere Triton's ptxas runs).  What an export
specializes differs from a launch's: every pointer is 16-byte aligned (the wrapper copies an
input or library result that is not), a static integer is specialized as a launch would be,
and a dynamic one is a plain ``i64`` (no constant 1, no multiple of 16).

``model.cubins``: "MCCUBINS1", the count, then per kernel its name, the function's name in
the cubin, num_warps, shared memory, argument codes (runtime/triton_worker.py's ARG_CODES,
scratch pointers last) and the cubin; strings and blobs as an int64 length and bytes.
"""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path

import torch

from minicompile import config
from minicompile.errors import Unsupported
from minicompile.runtime import triton_build

MAGIC = b"MCCUBINS1"


@dataclasses.dataclass(frozen=True)
class KernelBuild:
    """One kernel to build: its name and parameters (from its source), what each argument
    is (a torch.dtype for a pointer, an int for a static size, None for a dynamic size) and
    its keyword options (constexprs and compile options)."""

    name: str
    params: tuple[str, ...]
    args: tuple
    options: dict


@dataclasses.dataclass(frozen=True)
class Cubin:
    name: str
    function: str
    num_warps: int
    shared: int
    arg_codes: str
    data: bytes


def _spec(arg: object) -> tuple[str, object]:
    """Triton's specialization of an exported kernel's argument (see the module's doc)."""
    if arg is None:
        return ("i64", "")
    if isinstance(arg, int):
        spec = triton_build.specialization(arg)
        assert spec is not None
        return spec
    name = triton_build.TRITON_TYPES.get(str(arg).removeprefix("torch."))
    if name is None:
        raise Unsupported(f"export: a kernel takes a {arg} tensor, which Triton has no type for")
    return ("*" + name, "D")


class _Job:
    """A build for triton_build.build_all: the worker's job."""

    def __init__(self, kernel: KernelBuild, kernel_file: Path, target: tuple, out: Path) -> None:
        self.kernel, self.kernel_file, self.target, self.out = kernel, kernel_file, target, out

    def job(self) -> dict:
        k = self.kernel
        return triton_build.worker_job(self.kernel_file, k.name, k.params,
                                       [_spec(a) for a in k.args], k.options, self.target,
                                       self.out)


def device_target(device: torch.device) -> tuple[str, int, int]:
    """The GPU target of a CUDA device (Triton's GPUTarget fields)."""
    return triton_build.target(device.index if device.index is not None else 0)


def build(kernel_file: str, kernels: list[KernelBuild], target: tuple) -> list[Cubin]:
    """Build ``kernels`` (defined in the text ``kernel_file``, after triton_build's HEADER)
    for ``target`` in Triton build workers; Unsupported naming a kernel that cannot be."""
    with tempfile.TemporaryDirectory(prefix="minicompile-cubins-") as folder:
        tmp = Path(folder)
        source = tmp / "kernels.py"
        source.write_text(triton_build.HEADER + "\n\n" + kernel_file)
        jobs = [_Job(k, source, target, tmp / k.name) for k in kernels]
        reasons = triton_build.build_all(jobs, config.get().compile_threads, here=False)
        out = []
        for k, why in zip(kernels, reasons):
            built = triton_build.cached(tmp / k.name) if why is None else None
            if built is None:
                raise Unsupported(f"export: the Triton kernel {k.name} does not build for "
                                  f"{target}: {why or 'no cubin written'}")
            out.append(Cubin(k.name, built.name, built.num_warps, built.shared,
                             built.arg_codes, built.cubin.read_bytes()))
    return out


def write(path: Path, cubins: list[Cubin]) -> None:
    """The ``.cubins`` file (see the module's doc)."""

    def blob(data: bytes) -> bytes:
        return len(data).to_bytes(8, "little") + data

    parts = [MAGIC, len(cubins).to_bytes(8, "little")]
    for c in cubins:
        parts += [blob(c.name.encode()), blob(c.function.encode()),
                  *(n.to_bytes(8, "little") for n in (c.num_warps, c.shared)),
                  blob(c.arg_codes.encode()), blob(c.data)]
    path.write_bytes(b"".join(parts))

