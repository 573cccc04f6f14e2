"""A training batch norm's backward does eager's work and no more: no gradient flows into
the running statistics (eager updates them under no_grad), its reductions take one pass
over the activations (eager's ``native_batch_norm_backward`` takes one for its two sums),
and on the CPU the convolution reads the activation the forward saved instead of one the
backward computes again.  Structure from the joint graph (passes/autograd.py); values
against eager on both backends, two steps with fresh inputs."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest
import torch
import torch.nn as nn

import minicompile
from minicompile.graph import Node

from devices import device_for

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "capture"))

from capture_helpers import capture  # noqa: E402  (tests/capture's helper)


class ConvBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 4, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv2(torch.relu(self.bn(self.conv1(x))))


def _loss(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return model(x).square().mean()


def _reduction_passes(graph_nodes: list[Node], size: int) -> int:
    """The longest chain of sums over ``size``-element values where each reads (through
    any ops) the result of the one before: the passes over the activations."""
    depth: dict[Node, int] = {}
    for node in graph_nodes:
        before = max((depth.get(a, 0) for a in node.inputs()), default=0)
        big_sum = node.target == "sum" and node.args[0].meta.numel() == size
        depth[node] = before + big_sum
    return max(depth.values())


def test_batch_norm_backward_structure() -> None:
    from minicompile.passes.autograd import differentiate
    from minicompile.passes.pipeline import run_graph_passes

    model = ConvBlock().train()
    x = torch.randn(2, 3, 8, 8)
    graph = capture(_loss, model, x)[0].graph
    joint = differentiate(run_graph_passes(graph)[0])
    grads = [k for kind, k in joint.backward_inputs if kind == "grad"]
    assert grads == [0], joint.backward_inputs  # the loss's only: none per statistic
    assert _reduction_passes(joint.backward.nodes, 2 * 8 * 8 * 8) == 1, str(joint.backward)
    conv_backward = [n for n in joint.backward.nodes if str(n.target).endswith("conv_backward")]
    activation = conv_backward[0].args[1]  # conv2's input: the relu's output, saved
    assert activation.op == "placeholder", str(joint.backward)


def test_running_statistics_written_back_in_one_call() -> None:
    """The running statistics and batch counts of every batch norm go back into the buffers
    in one call (runtime/values.write_backs: a ``_foreach_copy_`` per dtype, one kernel
    each on a GPU), not one copy a buffer: three launches a layer a step before."""
    model = nn.Sequential(ConvBlock(), nn.BatchNorm2d(4)).train()
    cap = capture(_loss, model, torch.randn(2, 3, 8, 8))[0]
    assert cap.rebuild_source.count("write_backs(") == 1, cap.rebuild_source
    assert "write_back(" not in cap.rebuild_source, cap.rebuild_source


def test_batch_norm_training_matches_eager(backend: str) -> None:
    device = device_for(backend)
    torch.manual_seed(0)
    model = ConvBlock().to(device).train()
    ref = copy.deepcopy(model)
    compiled = minicompile.compile(model, backend=backend)
    for _ in range(2):
        x = torch.randn(2, 3, 8, 8, device=device)
        loss, want = _loss(compiled, x), _loss(ref, x)
        torch.testing.assert_close(loss, want, rtol=1e-5, atol=1e-6)
        loss.backward()
        want.backward()
        for (name, p), q in zip(model.named_parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5, msg=name)
        for a, b in zip(model.buffers(), ref.buffers()):  # running statistics, batch count
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
        model.zero_grad(set_to_none=True)
        ref.zero_grad(set_to_none=True)
    assert minicompile.stats()["eager_fallbacks"] == 0


def _outputs_of_the_function(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The number of outputs each call of the training autograd.Function returns."""
    from minicompile.runtime.autograd import CompiledGraphFunction

    counts: list[int] = []
    forward = CompiledGraphFunction.forward

    def counting(ctx: object, *args: object) -> tuple:
        results = forward(ctx, *args)
        counts.append(len(results))
        return results

    monkeypatch.setattr(CompiledGraphFunction, "forward", staticmethod(counting))
    return counts


@pytest.mark.parametrize("returns_statistic", [False, True])
def test_running_statistics_are_written_back_not_returned_by_the_function(
        backend: str, returns_statistic: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """The Function returns only what autograd needs, the loss (rebuild returns a buffer
    the user gets back as the buffer itself): the running statistics go into the same buffer tensors, with eager's values,
    seen through aliases the user keeps between steps."""
    counts = _outputs_of_the_function(monkeypatch)
    device = device_for(backend)
    torch.manual_seed(0)
    model = nn.Sequential(ConvBlock(), nn.BatchNorm2d(4)).to(device).train()
    ref = copy.deepcopy(model)

    def step(m: nn.Module, x: torch.Tensor) -> tuple:
        loss = _loss(m, x)
        return (loss, m[1].running_mean) if returns_statistic else (loss,)

    compiled = minicompile.compile(step, backend=backend)
    buffers = dict(model.named_buffers())
    aliases = [model[0].bn.running_var, model[1].running_mean[1:3]]  # the user's own views
    for _ in range(2):
        before = [b._version for b in model.buffers()], [b._version for b in ref.buffers()]
        x = torch.randn(2, 3, 8, 8, device=device)
        got, want = compiled(model, x), step(ref, x)
        torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-6)
        if returns_statistic:
            assert got[1] is model[1].running_mean  # eager returns the buffer itself
        grads = torch.autograd.grad(got[0], list(model.parameters()))
        for g, w in zip(grads, torch.autograd.grad(want[0], list(ref.parameters()))):
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)
        assert dict(model.named_buffers()) == buffers  # the same tensors, written in place
        for (name, a), b in zip(model.named_buffers(), ref.buffers()):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)
        torch.testing.assert_close(aliases[0], ref[0].bn.running_var, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(aliases[1], ref[1].running_mean[1:3], rtol=1e-5, atol=1e-6)
        # One write-back a buffer a step: eager's count for num_batches_tracked (add_); eager
        # leaves the running statistics' counters (native_batch_norm declares no mutation),
        # torch.compile's copy_ moves them as minicompile's does.
        mine, eager = ([b._version - v for b, v in zip(bs, vs)]
                       for bs, vs in zip((model.buffers(), ref.buffers()), before))
        assert mine == [1] * len(mine) and all(e <= 1 for e in eager), (mine, eager)
    assert counts == [1, 1], counts  # the loss (a returned buffer is the buffer itself)
    assert minicompile.stats()["eager_fallbacks"] == 0
