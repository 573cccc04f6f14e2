"""Ahead-of-time export (minicompile/aot_export.py): a function or module -> a shared library.

Each exported library is built once per module (building against PyTorch's headers takes
seconds) and run through ``minicompile.load`` and through the C++ runner in a subprocess,
twice with fresh inputs, against eager PyTorch.  Export is C++-only by nature (the library
runs without Python, so the Triton interpreter has no place in it): there is no backend
fixture here.  The error cases need no build.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import minicompile
from minicompile.aot_export import OLDEST_TORCH, Exported, torch_supported

if not torch_supported():
    pytest.skip(f"export needs PyTorch {OLDEST_TORCH} or newer (minicompile/aot_export.py)",
                allow_module_level=True)


class MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(16, 32)
        self.norm = torch.nn.LayerNorm(32)
        self.fc2 = torch.nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.norm(F.gelu(self.fc1(x))))


def conv_block() -> torch.nn.Module:
    block = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8),
                                torch.nn.ReLU(), torch.nn.MaxPool2d(2))
    block[1].running_mean.normal_()
    block[1].running_var.uniform_(0.5, 2.0)
    return block.eval()


SCALE = torch.randn(7)  # a global tensor the function reads: baked into the library


def attention_like(x: torch.Tensor, y: torch.Tensor):
    scores = torch.softmax((x * SCALE + y) / 2, dim=-1)
    return scores, x.sum(0), x


WEIGHT_T = torch.randn(6, 5).t()  # a non-contiguous tensor, baked in its own layout
TABLE = torch.randn(10, 6)


class Context:
    active = None  # set during a call and reset after it (as transformers' output capturing)


CONTEXT = Context()


def mixed(x: torch.Tensor, s: torch.Tensor, h: torch.Tensor, idx: torch.Tensor):
    y = (x @ WEIGHT_T).relu() * s + F.embedding(idx, TABLE)
    top, where = torch.topk(y, 2, dim=-1)  # a library call with a tuple result
    CONTEXT.active = None  # what it holds already: nothing for the library to replay
    # Indexing by index tensors (aten::index), a method-only operator (new_ones).
    picked = (y > 0)[idx[:, None] % 3, idx[None, :] % 6]
    return [y.to(torch.bfloat16) + h, s * 2, y.sum(), top * 2, where,
            picked & picked.new_ones(())]


def run_runner(exported: Exported, inputs: object, tmp: Path) -> tuple:
    """The model run by the C++ runner in a fresh process, on inputs saved by Python."""
    torch.save(inputs, tmp / "inputs.pt")
    proc = subprocess.run([str(exported.runner), str(exported.library), str(tmp / "inputs.pt"),
                           str(tmp / "outputs.pt")], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return torch.load(tmp / "outputs.pt")


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("export")


@pytest.fixture(scope="module")
def mlp(folder: Path) -> tuple:
    torch.manual_seed(0)
    model = MLP().eval()
    compiled = minicompile.compile(model)  # exported as the model it wraps
    return model, minicompile.export(compiled, (torch.randn(4, 16),), folder / "mlp.so")


@pytest.fixture(scope="module")
def conv(folder: Path) -> tuple:
    torch.manual_seed(1)
    model = conv_block()
    example = torch.randn(2, 3, 8, 8).to(memory_format=torch.channels_last)
    return model, minicompile.export(model, (example,), folder / "conv.so")


@pytest.fixture(scope="module")
def dynamic(folder: Path) -> Exported:
    return minicompile.export(attention_like, (torch.randn(5, 7), torch.randn(7)),
                              folder / "dynamic.so", dynamic={"x": 0})


@pytest.fixture(scope="module")
def misc(folder: Path) -> Exported:
    example = (torch.randn(3, 5), torch.tensor(1.5), torch.randn(3, 6, dtype=torch.bfloat16),
               torch.randint(0, 10, (3,)))
    return minicompile.export(mixed, example, folder / "mixed.so")


def test_low_precision_zero_dim_embedding_strided_weight(misc: Exported,
                                                   tmp_path: Path) -> None:
    lib = minicompile.load(misc)  # what export returned, or its path
    for _ in range(2):
        args = (torch.randn(3, 5), torch.randn(()), torch.randn(3, 6, dtype=torch.bfloat16),
                torch.randint(0, 10, (3,)))
        out = lib(*args)
        assert isinstance(out, list) and out[0].dtype == torch.bfloat16
        torch.testing.assert_close(out, mixed(*args))
        torch.testing.assert_close(list(run_runner(misc, args, tmp_path)), mixed(*args))
    with pytest.raises(RuntimeError, match="index out of range"):
        lib(*args[:3], torch.tensor([0, 10, 1]))


def test_mlp_matches_eager(mlp: tuple, tmp_path: Path) -> None:
    model, exported = mlp
    assert exported.library.exists() and exported.weights.exists()
    lib = minicompile.load(exported.library)
    for _ in range(2):
        x = torch.randn(4, 16)
        out = lib(x)
        assert isinstance(out, torch.Tensor)
        torch.testing.assert_close(out, model(x))
    for _ in range(2):
        x = torch.randn(4, 16)
        (out,) = run_runner(exported, [x], tmp_path)
        torch.testing.assert_close(out, model(x))


def test_mlp_wrapper_reads_its_weights_from_the_file(mlp: tuple, tmp_path: Path) -> None:
    # The weights are the library's own copy: changing the module after export changes
    # nothing, and a library without its weights file says so.
    model, exported = mlp
    lib = minicompile.load(exported.library)
    x = torch.randn(4, 16)
    expected = model(x)
    wrapper = exported.sources[0].read_text()
    assert "at::linear(" in wrapper and "mc_check_layout" in wrapper
    with torch.no_grad():
        model.fc1.weight.add_(1.0)
        try:
            torch.testing.assert_close(lib(x), expected)
        finally:
            model.fc1.weight.sub_(1.0)
    moved = tmp_path / "alone.so"
    moved.write_bytes(exported.library.read_bytes())
    with pytest.raises(RuntimeError, match="cannot open the weights file"):
        minicompile.load(moved)


def test_load_after_exporting_again_to_the_same_path(mlp: tuple, conv: tuple,
                                                     tmp_path: Path) -> None:
    # The dynamic loader returns the library it holds under a name: load copies a library
    # that changed since, so the new one runs.
    path = tmp_path / "model.so"
    for (model, exported), shape in [(conv, (2, 3, 8, 8)), (mlp, (4, 16))]:
        for source, target in [(exported.library, path), (exported.weights, path.with_suffix(
                ".weights"))]:
            (tmp_path / "new").write_bytes(source.read_bytes())
            (tmp_path / "new").replace(target)
        x = torch.randn(shape)
        if len(shape) == 4:
            x = x.to(memory_format=torch.channels_last)
        torch.testing.assert_close(minicompile.load(path)(x), model(x))


def test_conv_batchnorm_relu_pool_matches_eager(conv: tuple, tmp_path: Path) -> None:
    model, exported = conv
    lib = minicompile.load(exported.library)
    for _ in range(2):
        x = torch.randn(2, 3, 8, 8).to(memory_format=torch.channels_last)
        torch.testing.assert_close(lib(x), model(x))
        (out,) = run_runner(exported, (x,), tmp_path)
        torch.testing.assert_close(out, model(x))
    with pytest.raises(RuntimeError, match="stride"):  # generated for channels_last
        lib(torch.randn(2, 3, 8, 8))
    with pytest.raises(RuntimeError, match="dtype"):
        lib(torch.randn(2, 3, 8, 8, dtype=torch.float64))


def test_dynamic_batch_runs_at_two_sizes(dynamic: Exported, tmp_path: Path) -> None:
    lib = minicompile.load(dynamic.library)
    for n in (3, 9):
        x, y = torch.randn(n, 7), torch.randn(7)
        out = lib(x, y)
        expected = attention_like(x, y)
        assert isinstance(out, tuple) and len(out) == 3
        torch.testing.assert_close(out[:2], expected[:2])
        assert out[2] is not None and out[2].data_ptr() == x.data_ptr()  # returned as given
        got = run_runner(dynamic, [x, y], tmp_path)
        torch.testing.assert_close(got, expected)
    with pytest.raises(RuntimeError, match="dynamic sizes are at least 2"):
        lib(torch.randn(1, 7), torch.randn(7))
    with pytest.raises(RuntimeError, match="size 6 at dim 1, expected 7"):
        lib(torch.randn(4, 6), torch.randn(7))
    with pytest.raises(RuntimeError, match="called with 1 inputs .* takes 2"):
        lib(torch.randn(4, 7))


def rows_of_four(x: torch.Tensor, y: torch.Tensor, z: torch.Tensor):
    return (x.view(-1, 4) * 2).sum(1), x + y, z.sum()


def test_size_relations_are_checked(folder: Path) -> None:
    # Three symbols; the trace relied on s0 == s1 (the add) and on s0 % 4 == 0 (the view),
    # and x and z share the name "n": the library checks all three on every call.
    example = (torch.randn(8), torch.randn(8), torch.randn(8))
    exported = minicompile.export(rows_of_four, example, folder / "rows.so",
                                  dynamic=[{0: "n"}, 0, {0: "n"}])
    lib = minicompile.load(exported.library)
    for n in (12, 20):
        args = (torch.randn(n), torch.randn(n), torch.randn(n))
        torch.testing.assert_close(lib(*args), rows_of_four(*args))
    with pytest.raises(RuntimeError, match=r"break Eq\(Mod\(s0, 4\), 0\)"):
        lib(torch.randn(10), torch.randn(10), torch.randn(10))
    with pytest.raises(RuntimeError, match=r"break Eq\(s0, s1\)"):
        lib(torch.randn(12), torch.randn(16), torch.randn(12))
    with pytest.raises(RuntimeError, match="dims named 'n' differ: x dim 0 and z dim 0"):
        lib(torch.randn(12), torch.randn(12), torch.randn(16))


class Head(torch.nn.Module):
    """A GPT's output head: a linear without bias on a 3-d input, with a dynamic batch."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(16)
        self.proj = torch.nn.Linear(16, 12, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.norm(x)).relu()


def test_dynamic_linear_without_bias(folder: Path, tmp_path: Path) -> None:
    # PyTorch 2.11's C++ matmul (a linear without bias on a 3-d input) reads numel(),
    # which symbolic sizes refuse; the trace takes PyTorch's Python decomposition.
    torch.manual_seed(2)
    model = Head().eval()
    exported = minicompile.export(model, (torch.randn(4, 5, 16),), folder / "head.so",
                                  dynamic=[0])
    lib = minicompile.load(exported.library)
    for batch in (3, 7):
        x = torch.randn(batch, 5, 16)
        torch.testing.assert_close(lib(x), model(x))
        (out,) = run_runner(exported, [x], tmp_path)
        torch.testing.assert_close(out, model(x))
    with pytest.raises(RuntimeError, match="size 6 at dim 1, expected 5"):
        lib(torch.randn(3, 6, 16))


def test_runner_reports_a_wrong_input(dynamic: Exported, tmp_path: Path) -> None:
    torch.save([torch.randn(4, 5), torch.randn(7)], tmp_path / "bad.pt")
    proc = subprocess.run([str(dynamic.runner), str(dynamic.library), str(tmp_path / "bad.pt"),
                           str(tmp_path / "out.pt")], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1
    assert "input x has size 5 at dim 1, expected 7" in proc.stderr


# -- what is not exported: errors before anything is built ----------------------------------


def breaks(x: torch.Tensor) -> torch.Tensor:
    y = x + 1
    print("a graph break")
    return y * 2


def mutates(x: torch.Tensor) -> torch.Tensor:
    x.add_(1)
    return x * 2


def hooked() -> torch.nn.Module:
    layer = torch.nn.Linear(3, 3)
    layer.register_forward_hook(lambda mod, args, out: out * 2)
    return layer


def returns_dict(x: torch.Tensor) -> dict:
    return {"y": x + 1}


def interpolates(x: torch.Tensor) -> torch.Tensor:
    return F.interpolate(x, scale_factor=2.0)


def pooled_flat(x: torch.Tensor) -> torch.Tensor:  # (the flatten replays on the output)
    return F.max_pool2d(torch.relu(x * 2), 2).flatten(1)


@pytest.mark.parametrize(("fn", "args", "match"), [
    (breaks, (torch.randn(3),), r"print\(\) is not traceable.*\n  at .*test_export.py:\d+ in "
                                r"breaks\n    print"),
    (mutates, (torch.randn(3),), "mutates its inputs"),
    (torch.nn.BatchNorm1d(4), (torch.randn(3, 4),), "mutates its inputs or buffers"),
    (returns_dict, (torch.randn(3),), "returns dict"),
    (hooked(), (torch.randn(2, 3),), "forward hooks"),
    (interpolates, (torch.randn(1, 2, 3, 3),), "interpolate .* no ATen operator"),
    (pooled_flat, (torch.randn(2, 3, 4, 4),), r"returns a view .*\.view\(\(2, 12,?\)\).*clone"),
], ids=["graph break", "in-place input", "batch norm training", "dict", "hook", "library call",
        "view of an output"])
def test_not_exportable(fn: object, args: tuple, match: str, tmp_path: Path) -> None:
    with pytest.raises(minicompile.Unsupported, match=match):
        minicompile.export(fn, args, tmp_path / "model.so")
    assert not (tmp_path / "model.so").exists()


def test_bad_arguments(tmp_path: Path) -> None:
    x = torch.randn(3, 4)
    with pytest.raises(ValueError, match="size 1 at dynamic dim 0"):
        minicompile.export(returns_dict, (torch.randn(1, 4),), tmp_path / "m.so", dynamic=[0])
    with pytest.raises(ValueError, match="dynamic dims"):
        minicompile.export(returns_dict, (x,), tmp_path / "m.so", dynamic=[[0, 2]])
    with pytest.raises(ValueError, match="not arguments"):
        minicompile.export(returns_dict, (x,), tmp_path / "m.so", dynamic={"z": 0})
    with pytest.raises(TypeError, match="must be tensors"):
        minicompile.export(returns_dict, (x, 3), tmp_path / "m.so")
    with pytest.raises(OSError, match="not a library exported by minicompile"):
        torch_lib = Path(torch.__file__).parent / "lib" / "libc10.so"
        minicompile.load(torch_lib)
