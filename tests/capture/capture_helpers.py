"""Helpers for the capture tests: capture a call and replay its graph eagerly."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from minicompile import ops
from minicompile.capture import Capture, capture_frame, frame_args
from minicompile.graph import Graph


def interpret(graph: Graph, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Run ``graph`` eagerly, op by op (``minicompile.ops.run_graph``); returns the graph
    outputs in order (placeholder outputs are the input objects themselves)."""
    return list(ops.run_graph(graph, list(inputs)))


def capture(fn: Any, *args: Any, **kwargs: Any) -> tuple[Capture, tuple]:
    """Capture ``fn(*args, **kwargs)``; returns the capture and the frame layout values."""
    frame = frame_args(fn, args, kwargs)
    cap = capture_frame(fn, frame)
    cap.graph.verify()
    return cap, frame


def replay(cap: Capture, frame: tuple) -> Any:
    """What a compiled entry returns: get_inputs -> graph -> rebuild."""
    return cap.rebuild(interpret(cap.graph, cap.get_inputs(*frame)), *frame)


def assert_same(actual: Any, expected: Any) -> None:
    """Structure, types and values equal (tensors to assert_close tolerance, same dtype)."""
    assert type(actual) is type(expected), (type(actual), type(expected))
    if isinstance(expected, torch.Tensor):
        assert actual.dtype == expected.dtype and actual.shape == expected.shape
        torch.testing.assert_close(actual, expected, equal_nan=True)
    elif isinstance(expected, (tuple, list)):
        assert len(actual) == len(expected)
        for a, e in zip(actual, expected):
            assert_same(a, e)
    elif isinstance(expected, dict):
        assert actual.keys() == expected.keys()
        for k in expected:
            assert_same(actual[k], expected[k])
    else:
        assert actual == expected


def check_matches_eager(fn: Any, *args: Any, **kwargs: Any) -> Capture:
    """Capture, replay and compare with ``fn(*args, **kwargs)``; guards must pass."""
    cap, frame = capture(fn, *args, **kwargs)
    assert cap.guards.check(*frame), cap.guards.explain_failure(*frame)
    assert cap.guards.explain_failure(*frame) is None
    assert_same(replay(cap, frame), fn(*args, **kwargs))
    return cap


def body(cap: Capture) -> str:
    """The graph text without the source-line comments, for stable comparisons."""
    return "\n".join(line.split("  #")[0].rstrip() for line in str(cap.graph).splitlines())
