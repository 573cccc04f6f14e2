"""CUDA export (minicompile/aot_export.py, codegen/export_cuda.py, runtime/cubins.py): Triton
kernels built to cubins at export time and launched from the C++ wrapper.

On a GPU: resnet18, a small GPT and a transformers BERT exported with a dynamic batch, run
through ``minicompile.load`` (on the default stream and on another) and the C++ runner at
two batch sizes, against eager.  Without one: the cubins built for a Hopper target and a
CUDA library built from a CPU trace (``cuda_target``), its wrapper's text, and its clear
errors.  A failing GPU check prints the library's own message (the CUDA driver's error
string included) and the runner's stderr.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import minicompile
from minicompile.aot_export import OLDEST_TORCH, Exported, torch_supported
from minicompile.errors import Unsupported

if not torch_supported():
    pytest.skip(f"export needs PyTorch {OLDEST_TORCH} or newer (minicompile/aot_export.py)",
                allow_module_level=True)

CUDA = torch.cuda.is_available()
HOPPER = ("cuda", 90, 32)
needs_cuda = pytest.mark.skipif(not CUDA, reason="CUDA export runs on a GPU")


class Head(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(16, 32)
        self.norm = torch.nn.LayerNorm(32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.norm(F.gelu(self.fc(x))) * 2.0, dim=-1)


def run_runner(exported: Exported, inputs: list, tmp: Path) -> tuple:
    """The library run by the C++ runner (CPU tensors in and out; it copies to GPU 0)."""
    torch.save([t.cpu() for t in inputs], tmp / "inputs.pt")
    proc = subprocess.run([str(exported.runner), str(exported.library), str(tmp / "inputs.pt"),
                           str(tmp / "outputs.pt")], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"minicompile_runner failed: {proc.stderr}"
    return torch.load(tmp / "outputs.pt")


# -- without a GPU: the build side --------------------------------------------------------


@pytest.fixture(scope="module")
def cross(tmp_path_factory: pytest.TempPathFactory) -> tuple:
    """A CUDA library built without a GPU: the graph traced on the CPU, cubins for Hopper."""
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("export_cuda")
    model = Head().eval()
    return model, minicompile.export(model, (torch.randn(4, 16),), folder / "head.so",
                                     dynamic=[0], cuda_target=HOPPER)


def test_cubins_and_wrapper_of_a_cuda_library(cross: tuple, tmp_path: Path) -> None:
    _, exported = cross
    assert exported.cubins is not None and exported.cubins.read_bytes().startswith(b"MCCUBINS1")
    kernels = exported.sources[1].read_text()
    wrapper = exported.sources[0].read_text()
    names = [line.split("(")[0][4:] for line in kernels.splitlines()
             if line.startswith("def triton_")]
    assert names and all(f"// {name}" in wrapper for name in names)
    # A launch per kernel, its grid from the dynamic batch; the library call on the device.
    launches = [line for line in wrapper.splitlines() if "mc_launch(mc_cuda, " in line]
    assert len(launches) == len(names)
    assert "const int64_t s0 = arg0.size(0);" in wrapper
    assert all(line.split(", ")[2].startswith(("s0", "(s0")) for line in launches), launches
    assert "at::linear(" in wrapper and ".device(mc_device)" in wrapper
    assert "#include <cuda" not in wrapper  # the driver API comes from dlopen
    # The cubins: each kernel's ELF image, its codes pointers first, then the ints.
    data = exported.cubins.read_bytes()
    assert data.count(b"\x7fELF") == len(names)


def test_cuda_library_refuses_cpu_tensors(cross: tuple, tmp_path: Path) -> None:
    _, exported = cross
    lib = minicompile.load(exported)
    for batch in (3, 5):
        with pytest.raises(RuntimeError, match="input x is not a CUDA tensor"):
            lib(torch.randn(batch, 16))
    if not CUDA:
        torch.save([torch.randn(3, 16)], tmp_path / "inputs.pt")
        proc = subprocess.run([str(exported.runner), str(exported.library),
                               str(tmp_path / "inputs.pt"), str(tmp_path / "out.pt")],
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 1 and "GPU" in proc.stderr, proc.stderr


def test_cubins_for_a_target_without_a_gpu() -> None:
    from minicompile.runtime import cubins

    source = ("@triton.jit\n"
              "def add_one(in_ptr0, out_ptr0, s0, xnumel, XBLOCK: tl.constexpr):\n"
              "    xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)\n"
              "    xmask = xindex < xnumel\n"
              "    tl.store(out_ptr0 + xindex, tl.load(in_ptr0 + xindex, xmask) + s0, xmask)\n")
    params = ("in_ptr0", "out_ptr0", "s0", "xnumel", "XBLOCK")
    # A dynamic size is an i64 ("l"); a static one of 32 bits an i32 ("i"); 1 a constant.
    for ints, codes in (((None, 48), "OOli"), ((None, 1), "OOl"), ((7, None), "OOil")):
        (built,) = cubins.build(source, [cubins.KernelBuild(
            "add_one", params, (torch.float32, torch.float32, *ints),
            {"XBLOCK": 128, "num_warps": 4})], HOPPER)
        assert built.name == "add_one" and built.num_warps == 4
        scratch = built.arg_codes[len(codes):]  # Triton's scratch pointers, last
        assert built.arg_codes.startswith(codes) and set(scratch) <= {"O"}
        assert built.data.startswith(b"\x7fELF")


def test_export_refuses_devices_it_cannot_run_on(tmp_path: Path) -> None:
    with pytest.raises(Unsupported, match="one CUDA device"):
        minicompile.export(lambda x: x + 1, (torch.empty(3, device="meta"),), tmp_path / "m.so")


# -- on a GPU --------------------------------------------------------------------------------


@needs_cuda
@pytest.mark.parametrize("name", ["resnet18", "gpt", "bert"])
def test_cuda_library_matches_eager(name: str, tmp_path: Path,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from serving_models import SERVED

    torch.manual_seed(0)
    model, fn, inputs = SERVED[name]()
    model.cuda()
    tol = {"rtol": 1e-3, "atol": 1e-3}
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    example = [t.cuda() for t in inputs(4)]
    exported = minicompile.export(fn, tuple(example), tmp_path / f"{name}.so",
                                  dynamic=[0] * len(example))
    lib = minicompile.load(exported)
    side = torch.cuda.Stream()
    with torch.no_grad():
        for batch in (3, 6):  # two sizes of the dynamic batch, fresh values each
            args = [t.cuda() for t in inputs(batch)]
            expected = fn(*args)
            torch.testing.assert_close(lib(*args), expected, **tol)
            with torch.cuda.stream(side):  # the caller's current stream
                side.wait_stream(torch.cuda.default_stream())
                out = lib(*args)
            torch.cuda.default_stream().wait_stream(side)
            torch.testing.assert_close(out, expected, **tol)
            (from_cpp,) = run_runner(exported, args, tmp_path)
            # (the runner is a process of its own, with libtorch's default: TF32 convolutions
            # and matrix products; a resnet18 logit moved by 1.4e-3 on an H200)
            torch.testing.assert_close(from_cpp, expected.cpu(), rtol=1e-2, atol=1e-2)
        with pytest.raises(RuntimeError, match="is not a CUDA tensor|is on cpu"):
            lib(*[t.cpu() for t in inputs(3)])
