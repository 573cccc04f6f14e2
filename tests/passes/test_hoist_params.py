"""passes/hoist_params.py and runtime/derived.py: work on parameters and buffers alone is
computed once, and again after they change; views, outputs and random draws stay."""

from __future__ import annotations

import json

import pytest
import sympy
import torch
from torch import nn

import minicompile
from minicompile import ops
from minicompile.runtime.derived import WithDerived
from minicompile.graph import Graph, TensorMeta, graph_to_json
from minicompile.passes.hoist_params import hoist_parameter_values

from devices import device_for
from graph_builder import GraphBuilder


def test_what_is_hoisted_and_what_stays() -> None:
    b = GraphBuilder()
    x = b.input("L_x", (4, 8))
    w, bias, r = b.input("L_w", (3, 8)), b.input("L_b", (8,)), b.input("L_r", (8,))
    product = b(ops.extern_op(torch.mm), x, b("permute", w, (1, 0)))  # a view alone: stays
    shifted = b("add", x, b("mul", bias, 2.0))  # computed from a parameter: hoisted
    returned = b("exp", bias)  # an output: a new tensor every call, as eager's
    viewed = b("reshape", b("sigmoid", r), (2, 4))  # returned as a view: stays too
    noise = b("add", x, b(ops.extern_op(torch.rand_like), bias))  # a random draw: stays
    rows = b("embedding", w, b("iota", (3,), 0, torch.device("cpu")))  # with a constant
    scores = b(ops.extern_op(torch.mm), x, b("permute", rows, (1, 0)))
    graph = b.output(product, shifted, returned, viewed, noise, scores)
    assert hoist_parameter_values(graph, frozenset()) == (None, "")
    hoisted, text = hoist_parameter_values(graph, frozenset({1, 2, 3}))
    hoisted.main.verify()
    hoisted.derived.verify()
    assert hoisted.positions == (1, 2) and "2 values computed once" in text
    assert [n.target for n in hoisted.derived.outputs] == ["mul", "permute"]
    main = str(hoisted.main)
    assert "placeholder derived_0 : f32[8]" in main and "placeholder derived_1 : f32[8, 3]" in main
    for gone in ("mul(", "embedding(", "iota("):
        assert gone not in main, gone
    for stays in ("permute(", "exp(", "sigmoid(", "torch.rand_like("):
        assert stays in main, stays
    inputs = [torch.randn(4, 8), torch.randn(3, 8), torch.randn(8), torch.randn(8)]
    derived = ops.run_graph(hoisted.derived, [inputs[k] for k in hoisted.positions])
    got, want = ops.run_graph(hoisted.main, [*inputs, *derived]), ops.run_graph(graph, inputs)
    for a, e in zip(got[:4] + got[5:], want[:4] + want[5:], strict=True):
        torch.testing.assert_close(a, e)
    # As a warm entry stores and runs it (runtime/entries.py, derived.py): the same values,
    # in the same layouts.
    stored = json.loads(json.dumps(graph_to_json(hoisted.derived)))
    loaded = WithDerived.from_json(lambda values: values, stored, hoisted.positions)
    fresh = WithDerived.from_graph(lambda values: values, hoisted.derived, hoisted.positions)
    assert loaded.metas == fresh.metas
    for a, e in zip(loaded(inputs)[4:], fresh(inputs)[4:], strict=True):
        torch.testing.assert_close(a, e)
        assert a.stride() == e.stride()


def test_what_json_cannot_hold_is_refused() -> None:
    g = Graph()
    x = g.placeholder("x", TensorMeta((sympy.Symbol("s0"),), (sympy.Integer(1),),
                                      torch.float32, torch.device("cpu")))
    g.output((x,))
    with pytest.raises(ValueError, match="TensorMeta .* has no JSON form"):
        graph_to_json(g)


class Scaled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(8, 8))
        self.register_buffer("scale", torch.rand(8) + 0.5)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        weight = self.w * self.scale.rsqrt()[:, None]  # computed once
        return x @ weight.t(), weight * 3  # (an output: computed every call)


def test_values_follow_compiled_optimizer_steps_and_outputs_are_never_the_cache(
        backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from minicompile.runtime import derived

    computed = []
    real = derived.WithDerived.compute
    monkeypatch.setattr(derived.WithDerived, "compute",
                        lambda self, sources: computed.append(1) or real(self, sources))
    device = device_for(backend)
    torch.manual_seed(0)
    model = Scaled().to(device)
    compiled = minicompile.compile(model, backend=backend, fullgraph=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    step = minicompile.compile(optimizer.step)  # writes the weight in place, in its kernel
    for _ in range(3):
        x = torch.randn(4, 8, device=device)
        with torch.no_grad():
            got, want = compiled(x), model(x)
            for a, e in zip(got, want, strict=True):
                torch.testing.assert_close(a, e)
            got[1].zero_()  # the caller's to change: the next call's values stay eager's
        model(x)[0].square().sum().backward()  # an optimizer step changes the weight
        step()
        optimizer.zero_grad()
    assert minicompile.stats()["eager_fallbacks"] == 0
    assert len(computed) == 3  # once a call: every call follows a change
