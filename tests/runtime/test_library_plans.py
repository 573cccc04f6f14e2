"""Convolution plans prepared ahead (runtime/library_plans.py): the mechanism on CPU
tensors with a stand-in library call, and on a GPU the generated module's list of
problems, and compiled convolution nets against eager on two calls with fresh values."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import minicompile
from minicompile import config, ops
from minicompile.runtime import library_plans
from minicompile.runtime.library_plans import LibraryPlans, Like

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
CPU = torch.device("cpu")


@pytest.fixture()
def no_skip(monkeypatch: pytest.MonkeyPatch) -> None:
    """As on a GPU machine with cuDNN: nothing skips the preparation."""
    monkeypatch.setattr(library_plans, "_skip_reason", lambda: None)


def test_each_problem_is_called_once_on_tensors_of_its_layout(no_skip: None) -> None:
    seen: list[tuple] = []
    lock = threading.Lock()

    def library(x: torch.Tensor, w: torch.Tensor, bias: object, stride: tuple, *,
                groups: int = 1) -> None:
        with lock:
            seen.append((x.shape, x.stride(), x.dtype, w.shape, w.stride(), bias, stride,
                         groups, torch.is_grad_enabled(), threading.current_thread().name))

    calls = [(library, (Like((2, 3, 8, 8), (192, 1, 24, 3), torch.bfloat16, CPU),
                        Like((4, 3, 3, 3), (27, 1, 9, 3), torch.bfloat16, CPU), None, (2, 2)),
              {"groups": 1}),
             (library, (Like((1, 4, 5, 5), (100, 25, 5, 1), torch.float32, CPU),
                        Like((4, 1, 1, 1), (1, 1, 1, 1), torch.float32, CPU), None, (1, 1)),
              {"groups": 4})]
    plans = LibraryPlans(calls)
    assert plans.threads == [] and seen == []  # (started by the module's loader)
    plans.start()
    assert 1 <= len(plans.threads) <= len(calls)
    plans.start()  # (once)
    plans.wait()
    assert plans.threads == []
    expected = [((2, 3, 8, 8), (192, 1, 24, 3), torch.bfloat16, (4, 3, 3, 3), (27, 1, 9, 3),
                 None, (2, 2), 1, False),
                ((1, 4, 5, 5), (100, 25, 5, 1), torch.float32, (4, 1, 1, 1), (1, 1, 1, 1),
                 None, (1, 1), 4, False)]
    assert sorted((s[:-1] for s in seen), key=str) == sorted(expected, key=str)
    assert len(seen) == 2 and all(s[-1].startswith("minicompile-plans-") for s in seen)
    plans.wait()  # (again: nothing left to wait for)


def test_a_failing_call_is_ignored_and_the_others_still_run(no_skip: None) -> None:
    ran = []

    def broken(x: torch.Tensor) -> None:
        raise RuntimeError("no plan for this")

    calls = [(broken, (Like((3,), (1,), torch.float32, CPU),), {}),
             (lambda x: ran.append(x.shape), (Like((5,), (1,), torch.float32, CPU),), {}),
             (broken, (Like((7,), (1,), torch.float32, CPU),), {})]
    plans = LibraryPlans(calls)
    plans.start()
    plans.wait()
    assert ran == [(5,)]


def test_plans_not_started_before_the_first_convolution_are_left_to_it(no_skip: None) -> None:
    ran = []
    plans = LibraryPlans([(ran.append, (Like((3,), (1,), torch.float32, CPU),), {})])
    plans.wait()
    plans.start()  # (too late: the real call has prepared its plan)
    assert ran == [] and plans.threads == []


def test_problems_over_the_memory_limit_are_left_to_their_first_call(
        no_skip: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(library_plans, "MAX_BYTES", 1000)
    ran = []
    small = Like((10, 10), (10, 1), torch.float32, CPU)  # 400 bytes
    big = Like((10, 20), (20, 1), torch.float32, CPU)  # 800: with small, over the limit
    plans = LibraryPlans([(lambda a, b: ran.append("small"), (small, small), {}),
                          (lambda a, b: ran.append("big"), (small, big), {})])
    plans.start()
    plans.wait()
    assert ran == ["small"]


def test_like_spans_its_strides() -> None:
    assert Like((2, 3), (1, 2), torch.float16, CPU).nbytes() == 12
    assert Like((2, 3), (0, 1), torch.float32, CPU).nbytes() == 12  # broadcast rows
    assert Like((0, 3), (3, 1), torch.float32, CPU).nbytes() == 0
    t = Like((2, 3, 4), (12, 1, 3), torch.int8, CPU).make()
    assert (t.shape, t.stride(), t.dtype) == ((2, 3, 4), (12, 1, 3), torch.int8)


@pytest.mark.parametrize(("setting", "why"), [
    ({"benchmark": True}, "benchmark"),
    ({"enabled": False}, "disabled"),
])
def test_what_skips_the_preparation(monkeypatch: pytest.MonkeyPatch, setting: dict,
                                    why: str) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.backends.cudnn, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    with torch.backends.cudnn.flags(**{"enabled": True, "benchmark": False, **setting}):
        assert why in (library_plans._skip_reason() or "")
        ran = []
        plans = LibraryPlans([(ran.append, (Like((1,), (1,), torch.float32, CPU),), {})])
        plans.start()
        plans.wait()
        assert ran == []
    with torch.backends.cudnn.flags(enabled=True, benchmark=False):
        assert library_plans._skip_reason() is None


def conv_module(device: str) -> str:
    """The generated module of two convolutions of one problem and a third of another."""
    from graph_builder import GraphBuilder, compile_graph_text

    conv = ops.extern_op(F.conv2d)
    b = GraphBuilder(device)
    x = b.input("L_x", (2, 8, 16, 16), torch.bfloat16)
    w = b.input("L_w", (8, 8, 3, 3), torch.bfloat16)
    w2 = b.input("L_w2", (4, 8, 1, 1), torch.bfloat16)
    y = b(conv, x, w, None, (1, 1), (1, 1), (1, 1), 1)
    y = b(conv, b("relu", y), w, None, (1, 1), (1, 1), (1, 1), 1)
    b.output(b("add", b(conv, y, w2, None, (2, 2), (0, 0), (1, 1), 1), 1.0))
    return compile_graph_text(b.graph, "triton").code.module


def test_a_gpu_module_lists_each_convolution_problem_once_and_waits_before_the_first() -> None:
    module = conv_module("cuda")
    compile(module, "generated", "exec")  # valid Python
    assert "from minicompile.runtime.library_plans import LibraryPlans, Like" in module
    problems = [line.strip() for line in module.splitlines()
                if line.startswith("    (torch.nn.functional.conv2d, (Like(")]
    assert problems == [
        "(torch.nn.functional.conv2d, (Like((2, 8, 16, 16), (2048, 256, 16, 1), "
        "torch.bfloat16, device0), Like((8, 8, 3, 3), (72, 9, 3, 1), torch.bfloat16, "
        "device0), None, (1, 1), (1, 1), (1, 1), 1), {}),",
        "(torch.nn.functional.conv2d, (Like((2, 8, 16, 16), (2048, 256, 16, 1), "
        "torch.bfloat16, device0), Like((4, 8, 1, 1), (8, 1, 1, 1), torch.bfloat16, "
        "device0), None, (2, 2), (0, 0), (1, 1), 1), {}),"]
    call = module[module.index("def call(args):"):]
    assert call.count("library_plans.wait()") == 1
    assert call.index("library_plans.wait()") < call.index("torch.nn.functional.conv2d(")


def test_cpu_modules_prepare_nothing() -> None:
    assert "library_plans" not in conv_module("cpu")


class ConvNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, stride=2, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(16)
        self.same = nn.Conv2d(16, 16, 3, padding=1)  # twice: one problem
        self.depthwise = nn.Conv2d(16, 16, 3, padding=1, groups=16)
        self.down = nn.Conv2d(16, 32, 1, stride=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.bn(self.stem(x)))
        x = torch.relu(self.same(x)) + self.same(x * 0.5)
        return self.down(torch.nn.functional.gelu(self.depthwise(x)))


def _generated(cache: Path) -> str:
    texts = [p.read_text() for p in cache.rglob("mc_*.py")]
    assert len(texts) == 1
    return texts[0]


@cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_compiled_conv_net_prepares_its_problems_and_matches_eager(
        tmp_path: Path, dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    model = ConvNet().cuda().to(dtype).eval()
    tol = {"atol": 3e-2, "rtol": 3e-2} if dtype == torch.bfloat16 else {"atol": 1e-3,
                                                                         "rtol": 1e-3}
    with config.patch(cache_dir=tmp_path), torch.no_grad(), \
            torch.backends.cudnn.flags(enabled=True, benchmark=False, allow_tf32=False):
        compiled = minicompile.compile(model)
        for _ in range(2):
            x = torch.randn(4, 3, 32, 32, device="cuda", dtype=dtype)
            torch.testing.assert_close(compiled(x), model(x), **tol)
    text = _generated(tmp_path)
    assert text.count("    (torch.nn.functional.conv2d, (Like(") == 4  # distinct problems
    assert text.count("library_plans.wait()") == 1
    assert text.index("library_plans.wait()") < text.index("= with_layout(torch.nn.functional"
                                                           ".conv2d(")


@cuda
def test_with_cudnn_benchmark_nothing_is_prepared_and_values_hold(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = ConvNet().cuda().eval()
    with config.patch(cache_dir=tmp_path), torch.no_grad(), \
            torch.backends.cudnn.flags(enabled=True, benchmark=True, allow_tf32=False):
        compiled = minicompile.compile(model)
        for _ in range(2):
            x = torch.randn(2, 3, 24, 24, device="cuda")
            torch.testing.assert_close(compiled(x), model(x), atol=1e-3, rtol=1e-3)


def test_a_process_that_exits_right_after_loading_waits_for_its_threads(tmp_path: Path) -> None:
    """Threads still preparing plans when the program ends are waited for at exit (not cut
    off by the interpreter's teardown while in the library)."""
    import subprocess
    import sys

    script = tmp_path / "exits.py"
    script.write_text(
        "import time, torch\n"
        "from minicompile.runtime import library_plans\n"
        "from minicompile.runtime.library_plans import LibraryPlans, Like\n"
        "library_plans._skip_reason = lambda: None\n"
        "def slow(x):\n"
        "    time.sleep(0.3)\n"
        "    print('prepared', tuple(x.shape), flush=True)\n"
        "LibraryPlans([(slow, (Like((2, 3), (3, 1), torch.float32, torch.device('cpu')),), {})])"
        ".start()\n")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "prepared (2, 3)"
