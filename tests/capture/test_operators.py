"""Operators called as ``torch.ops.ns.name``: a library's ``torch.library.custom_op``
(transformers' MoE layers call ``torch.ops.transformers.grouped_mm_fallback`` under a
compiler) and ATen's own.  Those whose schema says they only compute tensors are library
calls of the graph, their metadata from their fake kernels; the others are graph breaks that
say why.  Every compiled call is checked against eager on fresh values, twice."""

from __future__ import annotations

import pytest
import torch

import minicompile


@torch.library.custom_op("minicompile_test::scale_add", mutates_args=())
def scale_add(x: torch.Tensor, y: torch.Tensor, alpha: float) -> torch.Tensor:
    return x * alpha + y


@scale_add.register_fake
def _(x: torch.Tensor, y: torch.Tensor, alpha: float) -> torch.Tensor:
    return torch.empty_like(x)


def _scale_add_backward(ctx, grad):  # noqa: ANN001, ANN202
    return grad * ctx.alpha, grad, None


def _scale_add_context(ctx, inputs, output) -> None:  # noqa: ANN001
    ctx.alpha = inputs[2]


scale_add.register_autograd(_scale_add_backward, setup_context=_scale_add_context)


@torch.library.custom_op("minicompile_test::min_max", mutates_args=())
def min_max(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return x.amin(-1), x.amax(-1)


@min_max.register_fake
def _(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return x.new_empty(x.shape[:-1]), x.new_empty(x.shape[:-1])


@torch.library.custom_op("minicompile_test::no_fake", mutates_args=())
def no_fake(x: torch.Tensor) -> torch.Tensor:
    return x.clone()


@torch.library.custom_op("minicompile_test::bump", mutates_args=("x",))
def bump(x: torch.Tensor) -> None:
    x.add_(1)


def matches_eager(fn, backend: str, device: torch.device, *shapes: tuple[int, ...]):  # noqa: ANN001, ANN201
    compiled = minicompile.compile(fn, backend=backend)
    for _ in range(2):  # fresh values each call: none may be baked in
        args = [torch.randn(s, device=device) for s in shapes]
        want = fn(*[a.clone() for a in args])
        got = compiled(*[a.clone() for a in args])
        assert type(got) is type(want)
        for g, w in zip(got if isinstance(got, tuple) else (got,),
                        want if isinstance(want, tuple) else (want,)):
            torch.testing.assert_close(g, w)
    assert minicompile.stats()["graph_breaks"] == minicompile.stats()["eager_fallbacks"] == 0
    return compiled


def test_a_custom_op_with_a_fake_kernel_is_a_library_call(backend: str,
                                                          device: torch.device) -> None:
    def f(x, y):
        return torch.ops.minicompile_test.scale_add(x.sin(), y, 2.5).cos()

    matches_eager(f, backend, device, (6, 5), (6, 5))
    report = minicompile.explain(f)(torch.randn(6, 5, device=device),
                                    torch.randn(6, 5, device=device))
    assert report.graph_break_count == 0
    assert "torch.ops.minicompile_test.scale_add" in str(report)


def test_an_overload_and_a_tuple_of_results(backend: str, device: torch.device) -> None:
    def f(x):
        lo, hi = torch.ops.minicompile_test.min_max.default(x * 2)
        return hi - lo, lo

    matches_eager(f, backend, device, (4, 7))


def test_aten_operators_return_what_eager_returns(backend: str, device: torch.device) -> None:
    def f(x, y):
        z = torch.ops.aten.mul.Tensor(x, y)
        return torch.ops.aten.max(z, 1)  # a plain tuple from torch.ops, not return_types.max

    out = matches_eager(f, backend, device, (3, 8), (3, 8))(
        torch.randn(3, 8, device=device), torch.randn(3, 8, device=device))
    assert type(out) is tuple


def test_gradients_flow_through_a_custom_ops_own_backward(backend: str,
                                                         device: torch.device) -> None:
    def f(x, y):
        return (torch.ops.minicompile_test.scale_add(x.tanh(), y, -1.5) ** 2).sum()

    compiled = minicompile.compile(f, backend=backend)
    for _ in range(2):
        x, y = (torch.randn(5, 3, device=device, requires_grad=True) for _ in range(2))
        x2, y2 = (t.detach().clone().requires_grad_() for t in (x, y))
        f(x, y).backward()
        compiled(x2, y2).backward()
        torch.testing.assert_close(x2.grad, x.grad)
        torch.testing.assert_close(y2.grad, y.grad)
    assert minicompile.stats()["graph_breaks"] == minicompile.stats()["eager_fallbacks"] == 0


def test_the_decorated_function_is_the_operator(backend: str, device: torch.device) -> None:
    """``scale_add(...)``, the function ``@torch.library.custom_op`` returned, called as the
    PyTorch tutorials call it: the same library call as ``torch.ops...scale_add``, and the
    op's own backward (runtime/custom_op_grads.py)."""
    def f(x, y):
        z = scale_add(x.tanh(), y, -1.5)
        lo, hi = min_max(z.detach())  # (it has no backward)
        return (z.exp() * (hi - lo)[:, None]).sum()

    compiled = minicompile.compile(f, backend=backend, fullgraph=True)
    for _ in range(2):
        x, y = (torch.randn(5, 3, device=device, requires_grad=True) for _ in range(2))
        x2, y2 = (t.detach().clone().requires_grad_() for t in (x, y))
        want, got = f(x, y), compiled(x2, y2)
        torch.testing.assert_close(got, want)
        want.backward()
        got.backward()
        torch.testing.assert_close(x2.grad, x.grad)
        torch.testing.assert_close(y2.grad, y.grad)
    assert minicompile.stats()["graph_breaks"] == minicompile.stats()["eager_fallbacks"] == 0


@pytest.mark.parametrize("call, reason", [
    (lambda x: torch.ops.minicompile_test.bump(x), "writes to its arguments"),
    (lambda x: torch.ops.minicompile_test.no_fake(x), "no fake kernel"),
    (lambda x: bump(x), "writes to its arguments"),
    (lambda x: no_fake(x), "no fake kernel"),
    (lambda x: torch.ops.aten.add_.Tensor(x, 1.0), "writes to its arguments"),
    (lambda x: torch.ops.aten.bernoulli.default(x.sigmoid()), "random ops"),
    (lambda x: torch.ops.aten.nonzero(x), "depends on the data"),
    (lambda x: torch.ops.aten.view.default(x, [-1]), "returns a view"),
    (lambda x: torch.ops.aten.split.Tensor(x, 2), "view"),
], ids=["mutates", "no-fake", "decorated-mutates", "decorated-no-fake", "aten-in-place", "random", "data-dependent", "view", "split"])
def test_operators_that_are_not_library_calls_break_with_a_reason(call, reason: str) -> None:  # noqa: ANN001
    def f(x):
        y = x + 1
        call(y)
        return y * 2

    for _ in range(2):
        x = torch.randn(4, 3)
        torch.testing.assert_close(minicompile.compile(f)(x), f(x))
    report = minicompile.explain(f)(torch.randn(4, 3))
    assert report.graph_break_count == 1
    assert "torch.ops." in str(report) and reason in str(report)
    with pytest.raises(minicompile.Unsupported, match=reason):
        minicompile.compile(f, fullgraph=True)(torch.randn(4, 3))
