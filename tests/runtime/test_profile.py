"""MINICOMPILE_LOGS=profile (minicompile/runtime/profile.py): each compiled graph's host
and device time per call and each kernel's and library call's share of the roofline,
named by graph nodes and source lines; values as eager's, and nothing installed when off."""

from __future__ import annotations

import inspect

import pytest
import torch

import minicompile
from minicompile import config
from minicompile.runtime import profile, roofline

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
ON = frozenset({"profile"})


@pytest.fixture(autouse=True)
def _small_limits(monkeypatch: pytest.MonkeyPatch):
    """The device's limits measured with a smaller copy and matmul (fast on two cores);
    no profile left for the report at exit."""
    monkeypatch.setitem(roofline.COPY_BYTES, "cpu", 2**22)
    monkeypatch.setitem(roofline.MATMUL_SIZE, "cpu", 128)
    for measured in (roofline.copy_bandwidth, roofline.peak_flops):
        measured.cache_clear()
    yield
    for measured in (roofline.copy_bandwidth, roofline.peak_flops):
        measured.cache_clear()
    minicompile.reset()  # (else the last test's graphs are reported at exit)


def pointwise_reduction_matmul(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    a = torch.sin(x) * 2
    b = a.sum(dim=1, keepdim=True)
    c = (a - b) @ w
    return torch.relu(c) + 1


LINES = {name: inspect.getsourcelines(pointwise_reduction_matmul)[1] + k
         for k, name in ((1, "sin"), (2, "sum"), (3, "matmul"), (4, "relu"))}


def run(compiled, device: torch.device, calls: int) -> None:
    for _ in range(calls):  # fresh values every call
        x, w = torch.randn(32, 64, device=device), torch.randn(64, 16, device=device)
        torch.testing.assert_close(compiled(x, w), pointwise_reduction_matmul(x, w),
                                   rtol=1e-4, atol=1e-4)


def test_report_names_each_kernel_and_times_it(backend: str, device: torch.device,
                                               capsys: pytest.CaptureFixture) -> None:
    with config.patch(logs=ON):
        compiled = minicompile.compile(pointwise_reduction_matmul, backend=backend)
    run(compiled, device, profile.REPORT_AT)
    (p,) = minicompile.profile_report(compiled)
    assert p.reported and p.calls == profile.REPORT_AT and p.backend == backend
    kernels = [s for s in p.steps if not s.library]
    (mm,) = [s for s in p.steps if s.library]
    assert len(kernels) >= 2 and all(s.name.startswith(backend) for s in kernels)
    # (On the CPU the product is BLAS's own op on 2-d views: codegen/gemm_calls.py.)
    product = "torch.mm" if device.type == "cpu" else "torch.matmul"
    assert mm.name == product and mm.flops == (2 * 32 * 64 * 16, torch.float32)
    here = f"test_profile.py:{LINES['matmul']}"
    assert "torch.matmul" in mm.nodes and mm.where == (here,)
    (first,) = [s for s in kernels if " sin" in s.nodes]
    assert " sum" in first.nodes and f"test_profile.py:{LINES['sin']}" in first.where
    assert first.bytes >= (32 * 64 + 32 * 64) * 4  # x read, a - b written
    assert f"test_profile.py:{LINES['relu']}" in kernels[-1].where
    assert all(s.seconds > 0 and len(s.times) == len(mm.times) > 0 for s in p.steps)
    assert p.host_s > 0 and p.device_s > 0 and p.bound in ("host", "device")
    # On the CPU a call is its kernels, library calls and Python; on a GPU the longer of
    # the host's time and the device's.
    assert p.kernels_s + p.library_s + p.python_s == pytest.approx(
        max(p.total_s, p.kernels_s + p.library_s))
    err = capsys.readouterr().err
    assert err.count("minicompile profile: pointwise_reduction_matmul") == 1  # at the 10th
    for s in kernels:
        line = next(x for x in err.splitlines() if f" {s.name}: " in x)
        assert "of copy bw" in line and s.nodes in line
    assert "of peak" in next(x for x in err.splitlines() if f" {product}: " in x)
    assert "summary: bound by the" in err and "measured in this process" in err
    run(compiled, device, 2)  # reported: later calls run the plain call
    assert len(p.host) + len(p.device) + len(mm.times) == profile.REPORT_AT - 1


def test_off_installs_nothing(backend: str, device: torch.device) -> None:
    compiled = minicompile.compile(pointwise_reduction_matmul, backend=backend)
    run(compiled, device, 2)
    (entry,) = compiled.entries
    assert not isinstance(entry.call, profile.Profiled)
    assert entry.call.__name__ == "call" and minicompile.profile_report(compiled) == []


def test_training_graphs_and_the_report_at_exit(capsys: pytest.CaptureFixture) -> None:
    def loss_of(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x @ w).sum()

    with config.patch(logs=ON):
        compiled = minicompile.compile(loss_of, backend="cpp")
    for _ in range(3):
        x, w = torch.randn(8, 16), torch.randn(16, 4, requires_grad=True)
        got = torch.autograd.grad(compiled(x, w), w)
        torch.testing.assert_close(got, torch.autograd.grad(loss_of(x, w), w))
    forward, backward = minicompile.profile_report(compiled)
    name = loss_of.__qualname__
    assert (forward.name, backward.name) == (name, f"{name}_backward")
    assert forward.calls == backward.calls == 3 and not forward.reported
    profile.report_rest()  # (atexit's)
    err = capsys.readouterr().err
    assert f"minicompile profile: {name} (cpp" in err
    assert f"minicompile profile: {name}_backward (cpp" in err
    assert all(s.seconds > 0 for p in (forward, backward) for s in p.steps)


@cuda
def test_cuda_graphs_report_the_whole_graph(capsys: pytest.CaptureFixture) -> None:
    with config.patch(logs=ON):
        compiled = minicompile.compile(pointwise_reduction_matmul, backend="triton",
                                       mode="reduce-overhead")
    run(compiled, torch.device("cuda"), profile.REPORT_AT)
    (p,) = minicompile.profile_report(compiled)
    assert p.whole is not None and not p.steps and p.cuda
    assert p.host_s > 0 and p.device_s > 0
    assert "CUDA graphs: a replay has no per-kernel times" in capsys.readouterr().err


def test_flops_of_library_calls() -> None:
    x, w = torch.randn(2, 3, 8, 8), torch.randn(5, 3, 3, 3)
    out = torch.nn.functional.conv2d(x, w)
    assert roofline.flops("torch.nn.functional.conv2d", out, (x, w), {}) == (
        2 * out.numel() * 3 * 9, torch.float32)
    q, k, v = torch.randn(2, 4, 6, 8), torch.randn(2, 4, 10, 8), torch.randn(2, 4, 10, 8)
    attn = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    assert roofline.flops("torch.nn.functional.scaled_dot_product_attention", attn,
                          (q, k, v), {}) == (2 * 2 * 4 * 6 * 10 * 16, torch.float32)
    a, b, bias = torch.randn(4, 6), torch.randn(6, 3), torch.randn(3)
    assert roofline.flops("torch.addmm", torch.addmm(bias, a, b), (bias, a, b), {})[0] == 144
    assert roofline.flops("torch.nn.functional.embedding", a, (a, b), {}) is None
    name, args = roofline.library_op("minicompile.runtime.autograd.record",
                                     ("torch.mm", (1,), (3, 1), a, b))
    assert name == "torch.mm" and args == (a, b)
