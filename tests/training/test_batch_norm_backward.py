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
