"""nn.Module capture: submodules inlined, parameters as inputs read by reference, guards on
identity, hooks and training; minicompile.compile(module) shares the parameters."""

from __future__ import annotations


import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from capture_helpers import assert_same, capture, replay

import minicompile
from minicompile.errors import Unsupported


class Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.lin = nn.Linear(d, d)
        self.norm = nn.LayerNorm(d)
        self.drop = nn.Dropout(0.1)
        self.act = nn.GELU()

    def forward(self, x):
        return x + self.drop(self.act(self.lin(self.norm(x))))


class Base(nn.Module):
    def forward(self, x):
        return x * 2


class Model(Base):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 8)
        self.blocks = nn.ModuleList([Block(8) for _ in range(2)])
        self.seq = nn.Sequential(nn.Linear(8, 8), nn.ReLU())
        self.heads = nn.ModuleDict({"a": nn.Linear(8, 2), "b": nn.Linear(8, 3)})
        self.register_buffer("steps", torch.zeros(()))
        self.calls = 0

    def forward(self, idx):
        h = self.emb(idx)
        for blk in self.blocks:
            h = blk(h)
        h = self.seq(h) + self.blocks[len(self.blocks) - 1](h)
        h = super().forward(h)
        out = {k: head(h) for k, head in self.heads.items()}
        self.steps.add_(1)
        self.calls += 1
        return out


def model_and_input():
    torch.manual_seed(0)
    return Model().eval(), torch.randint(0, 10, (2, 5))


def test_model_capture_matches_eager_and_updates_state() -> None:
    m, idx = model_and_input()
    with torch.no_grad():
        cap, frame = capture(type(m).forward, m, idx)
        got = replay(cap, frame)
        assert (float(m.steps), m.calls) == (1.0, 1)
        assert_same(got, m(idx))
    sources = cap.input_sources
    assert "L['self']._modules['emb']._parameters['weight']" in sources
    assert "L['self']._buffers['steps']" in sources
    guards = str(cap.guards)
    assert ".get('blocks') is ModuleList):  # L['self']._modules['blocks'] identity" in guards
    assert ") == ['0', '1']):  # L['self']._modules['blocks'] keys" in guards
    assert "._forward_hooks" in guards and "training is False" in guards
    externs = {n.target for n in cap.graph.calls()}
    assert {"torch.nn.functional.linear", "torch.nn.functional.layer_norm"} <= externs
    assert "torch.nn.functional.embedding" in externs
    assert not any("dropout" in t for t in externs)  # eval mode: identity


def test_guards_follow_training_hooks_and_submodule_identity() -> None:
    m, idx = model_and_input()
    with torch.no_grad():
        cap, frame = capture(type(m).forward, m, idx)
        assert cap.guards.check(m, idx)
        m.train()
        assert "training" in cap.guards.explain_failure(m, idx)
        m.eval()
        handle = m.seq.register_forward_hook(lambda *a: None)
        assert "hooks" in cap.guards.explain_failure(m, idx)
        handle.remove()
        m.seq = nn.Sequential(nn.Linear(8, 8), nn.ReLU())
        assert "identity" in cap.guards.explain_failure(m, idx)


def test_parameters_are_read_by_reference() -> None:
    lin = nn.Linear(4, 4)
    with torch.no_grad():
        cap, frame = capture(type(lin).forward, lin, torch.randn(2, 4))
        lin.weight.mul_(2)  # an optimizer step
        assert cap.guards.check(*frame)
        torch.testing.assert_close(replay(cap, frame), lin(frame[1]))


def test_autograd_with_grad_enabled_marks_results() -> None:
    lin = nn.Linear(4, 4)  # with grad enabled, the result is marked for the backward
    graph = capture(type(lin).forward, lin, torch.randn(2, 4))[0].graph
    assert graph.outputs[0].meta.requires_grad


def test_compile_module_shares_parameters() -> None:
    m, idx = model_and_input()
    ref = Model().eval()
    ref.load_state_dict(m.state_dict())
    cm = minicompile.compile(m)
    assert isinstance(cm, nn.Module) and cm.emb is m.emb
    assert cm.state_dict().keys() == m.state_dict().keys()
    assert list(cm.parameters())[0] is list(m.parameters())[0]
    assert cm.calls == 0
    with torch.no_grad():
        assert_same(cm(idx), ref(idx))
        assert (m.calls, float(m.steps)) == (1, 1.0)


def test_module_with_user_methods_properties_and_functional_calls() -> None:
    class M(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = nn.Linear(4, 6)
            self.scale = 0.5

        @property
        def width(self) -> int:
            return self.proj.out_features

        def split(self, h):
            return h.split(self.width // 2, dim=-1)

        def forward(self, x):
            a, b = self.split(self.proj(x))
            return F.softmax(a, dim=-1) * self.scale + torch.sigmoid(b)

    m = M()
    x = torch.randn(3, 4)
    with torch.no_grad():
        cap, frame = capture(M.forward, m, x)
        assert_same(replay(cap, frame), m(x))
