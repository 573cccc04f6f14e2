"""2-d max pooling of NCHW CPU inputs on ATen's channels-last kernel
(passes/cpu_pooling.py, minicompile/runtime/pooling.py): values and input gradients equal
to eager's on both backends, twice with fresh inputs, over strides, padding, dilation,
ceil_mode and ties (a ReLU's zeros: the first maximum of a window takes the gradient);
inputs of other layouts keep ATen's call on them."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import minicompile
from minicompile import config

CL = torch.channels_last
# (kernel_size, stride, padding, dilation, ceil_mode)
WINDOWS = {
    "squeezenet": (3, 2, 0, 1, True),
    "resnet": (3, 2, 1, 1, False),
    "default_stride": (2, None, 0, 1, False),
    "rect_dilated": ((3, 2), (1, 2), (1, 0), (2, 1), True),
}
INPUTS = {  # (make an input, whether the pass rewrites its pool: None, in eval only)
    "nchw": (lambda: torch.randn(4, 40, 16, 16), True),
    "small_nchw": (lambda: torch.randn(2, 3, 7, 6), None),
    "relu_ties": (lambda: torch.randn(4, 40, 16, 16).round().clamp_min(0), True),
    "channels_last": (lambda: torch.randn(2, 3, 11, 10).contiguous(memory_format=CL), False),
    "transposed": (lambda: torch.randn(2, 3, 10, 11).transpose(2, 3), False),
}


def pool(window: tuple) -> Callable[[torch.Tensor], torch.Tensor]:
    k, s, p, d, ceil = window

    def fn(x: torch.Tensor) -> torch.Tensor:
        return F.max_pool2d(x * 2, k, s, p, d, ceil_mode=ceil) + 1
    return fn


def matches_eager(fn: Callable, compiled: Callable, make: Callable, grad: bool) -> None:
    """``compiled`` gives ``fn``'s values, strides and (``grad``) input gradients exactly,
    on two fresh inputs."""
    for seed in (0, 1):
        torch.manual_seed(seed)
        x = make().requires_grad_(grad)
        x2 = x.detach().clone().requires_grad_(grad)
        expected, got = fn(x), compiled(x2)
        torch.testing.assert_close(got, expected, rtol=0, atol=0)
        assert got.stride() == expected.stride()
        if grad:
            g = torch.randn_like(expected)
            expected.backward(g)
            got.backward(g)
            torch.testing.assert_close(x2.grad, x.grad, rtol=0, atol=0)


# Every window on NCHW inputs; one on the others.
CASES = [(kind, w) for kind in ("nchw", "relu_ties") for w in WINDOWS] + [
    (kind, "resnet") for kind in ("small_nchw", "channels_last", "transposed")]


@pytest.mark.parametrize("grad", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("case", CASES, ids=["-".join(c) for c in CASES])
def test_max_pool_matches_eager(case: tuple[str, str], grad: bool, backend: str,
                                capsys: pytest.CaptureFixture,
                                monkeypatch: pytest.MonkeyPatch) -> None:
    from minicompile.runtime import autograd, function_grads

    direct = []  # (the rewritten pool's backward is called directly: no nested engine call)
    monkeypatch.setattr(autograd, "function_grads", lambda *a: direct.append(
        function_grads.function_grads(*a)) or direct[-1])
    make, rewritten = INPUTS[case[0]]
    fn = pool(WINDOWS[case[1]])
    with config.patch(logs=frozenset({"graph"})):
        matches_eager(fn, minicompile.compile(fn, backend=backend), make, grad)
    logged = "1 max pools on the channels-last kernel" in capsys.readouterr().err
    assert logged == (not grad if rewritten is None else rewritten)
    # (Triton on CPU tensors without its interpreter, on a GPU machine: the graph is
    # captured and logged, then runs eagerly, so no road of ours is taken)
    ours = backend == "cpp" or config.get().triton_interpret
    assert all(r is not None for r in direct) and len(direct) == (
        2 if grad and logged and ours else 0)


class PoolInputs(TorchDispatchMode):
    """Whether each max pool's input (ATen's kernel call) is channels-last."""

    def __init__(self) -> None:
        super().__init__()
        self.channels_last: list[bool] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        if func is torch.ops.aten.max_pool2d_with_indices.default:
            x = args[0]
            self.channels_last.append(not x.is_contiguous() and x.is_contiguous(
                memory_format=torch.channels_last))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("grad", [True, False], ids=["train", "eval"])
def test_many_threads_pool_on_the_nchw_kernel(grad: bool) -> None:
    """With few elements a thread (4x40x16x16 on 16 threads), the rewritten pool runs ATen's
    NCHW kernel (the planes shared among the threads) instead of the channels-last copies;
    on one thread the channels-last one.  Values and gradients as eager's either way."""
    from minicompile.runtime import pooling

    x = torch.randn(4, 40, 16, 16)
    fn = pool(WINDOWS["squeezenet"])
    compiled = minicompile.compile(fn, backend="cpp")
    compiled(x.requires_grad_(grad))  # (compiled before the calls watched)
    threads = torch.get_num_threads()
    try:
        for n, channels_last in ((1, True), (16, False)):
            torch.set_num_threads(n)
            assert pooling.channels_last_pays(x) == channels_last
            seen = PoolInputs()

            def watched(x: torch.Tensor, seen: PoolInputs = seen) -> torch.Tensor:
                with seen:
                    return compiled(x)

            matches_eager(fn, watched, INPUTS["nchw"][0], grad)
            assert seen.channels_last == [channels_last] * 2, seen.channels_last
    finally:
        torch.set_num_threads(threads)
