"""Custom ``torch.autograd.Function``s where a gradient flows (BLOOM's ``GeLUFunction`` in
training, straight-through estimators, gradient reversal): ``apply`` is a library call of
the compiled forward, and the class's own ``backward`` runs in the compiled backward.  The
backwards here are deliberately not the forwards' derivatives: the gradients must be the
user's, as eager's are.  Every case is checked against eager twice, on fresh values."""

from __future__ import annotations

import pytest
import torch

import minicompile


class ScaledSin(torch.autograd.Function):
    """The older style: forward with a context."""

    @staticmethod
    def forward(ctx, x, scale):  # noqa: ANN001, ANN205
        ctx.save_for_backward(x)
        ctx.scale = scale
        return x.sin() * scale

    @staticmethod
    def backward(ctx, grad):  # noqa: ANN001, ANN205
        (x,) = ctx.saved_tensors
        return grad * ctx.scale * (x.cos() + 1.0), None  # not sin's derivative


class Reverse(torch.autograd.Function):
    """The newer style: setup_context apart; two results."""

    @staticmethod
    def forward(x, y):  # noqa: ANN001, ANN205
        return x.clone(), x * y

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:  # noqa: ANN001
        ctx.save_for_backward(inputs[1])

    @staticmethod
    def backward(ctx, ga, gb):  # noqa: ANN001, ANN205
        (y,) = ctx.saved_tensors
        return -ga + gb * y, None


class AddOneInPlace(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):  # noqa: ANN001, ANN205
        ctx.mark_dirty(x)
        return x.add_(1)

    @staticmethod
    def backward(ctx, grad):  # noqa: ANN001, ANN205
        return grad


def model(x, w, y):  # noqa: ANN001, ANN201
    h = ScaledSin.apply(x @ w, 2.0)
    a, b = Reverse.apply(h.tanh(), y)
    return (a * b).sum() + h.mean()


def test_apply_is_a_library_call_and_the_users_backward_runs(backend: str,
                                                             device: torch.device) -> None:
    compiled = minicompile.compile(model, backend=backend)
    for _ in range(2):
        leaves = [torch.randn(3, 4, device=device), torch.randn(4, 5, device=device),
                  torch.randn(3, 5, device=device)]
        ours = [t.clone().requires_grad_() for t in leaves[:2]] + [leaves[2]]
        theirs = [t.clone().requires_grad_() for t in leaves[:2]] + [leaves[2]]
        got, want = compiled(*ours), model(*theirs)
        torch.testing.assert_close(got, want)
        got.backward()
        want.backward()
        for a, e in zip(ours[:2], theirs[:2]):
            torch.testing.assert_close(a.grad, e.grad)
    stats = minicompile.stats()
    assert (stats["graphs"], stats["graph_breaks"], stats["eager_fallbacks"]) == (1, 0, 0)
    report = minicompile.explain(model)(*[t.requires_grad_() for t in (
        torch.randn(3, 4, device=device), torch.randn(4, 5, device=device))],
        torch.randn(3, 5, device=device))
    assert "ScaledSin.apply" in str(report) and "Reverse.apply" in str(report)


def test_a_result_that_takes_no_gradient_calls_apply_in_the_wrapper(backend: str,
                                                                    device: torch.device) -> None:
    def f(x):  # noqa: ANN001, ANN202
        return ScaledSin.apply(x * 2, 3.0).detach() + 1

    compiled = minicompile.compile(f, backend=backend)
    for _ in range(2):
        x = torch.randn(6, device=device, requires_grad=True)
        torch.testing.assert_close(compiled(x), f(x))
    assert minicompile.stats()["graph_breaks"] == 0


def test_an_in_place_forward_and_a_local_class_break_with_a_reason() -> None:
    class Local(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):  # noqa: ANN001, ANN205
            return x * 2

        @staticmethod
        def backward(ctx, grad):  # noqa: ANN001, ANN205
            return grad * 2

    def in_place(x):  # noqa: ANN001, ANN202
        return AddOneInPlace.apply(x * 1) * 2

    def local(x):  # noqa: ANN001, ANN202
        return Local.apply(x) + 1

    for fn, reason in ((in_place, "modifies an input in place"),
                       (local, "cannot be found again by its module and name")):
        with pytest.raises(minicompile.Unsupported, match=reason):
            minicompile.compile(fn, fullgraph=True)(torch.randn(3, requires_grad=True))
        for _ in range(2):  # (a graph break: eager's values and gradients)
            x = torch.randn(3, requires_grad=True)
            x2 = x.detach().clone().requires_grad_()
            minicompile.compile(fn)(x).sum().backward()
            fn(x2).sum().backward()
            torch.testing.assert_close(x.grad, x2.grad)


class CubeTimes(torch.autograd.Function):
    """Every input a tensor and one result: the backward is called directly, not through a
    nested engine call (runtime/function_grads.py)."""

    @staticmethod
    def forward(ctx, x, w):  # noqa: ANN001, ANN205
        ctx.save_for_backward(x, w)
        return x ** 3 * w

    @staticmethod
    def backward(ctx, grad):  # noqa: ANN001, ANN205
        x, w = ctx.saved_tensors
        return grad * w * x * 2.0, (grad * x).sum(0).double()  # not the derivative; float64


@torch.library.custom_op("minicompile_test::rows_times", mutates_args=())
def rows_times(x: torch.Tensor, w: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """A custom op shaped like transformers' MoE ``grouped_mm_fallback``: tensors only, an
    integer tensor among them, a backward registered with torch.library."""
    return x[rows] @ w


@rows_times.register_fake
def _(x, w, rows):  # noqa: ANN001, ANN202
    return x.new_empty(rows.shape[0], w.shape[1])


def _rows_times_context(ctx, inputs, output) -> None:  # noqa: ANN001
    ctx.save_for_backward(inputs[0], inputs[1])
    ctx.rows = inputs[2]


def _rows_times_backward(ctx, grad):  # noqa: ANN001, ANN202
    x, w = ctx.saved_tensors
    grad_x = torch.zeros_like(x).index_add_(0, ctx.rows, grad @ w.T)
    return grad_x * 3.0, x[ctx.rows].T @ grad, None  # x's: not the derivative


rows_times.register_autograd(_rows_times_backward, setup_context=_rows_times_context)


@torch.library.custom_op("minicompile_test::rows_times_scaled", mutates_args=())
def rows_times_scaled(x: torch.Tensor, w: torch.Tensor, rows: torch.Tensor, *,
                      scale: float) -> torch.Tensor:
    """rows_times with a keyword-only argument: recorded (its Function is called
    directly, runtime/function_grads.py), not compiled through its backward."""
    return x[rows] @ w * scale


@rows_times_scaled.register_fake
def _(x, w, rows, *, scale):  # noqa: ANN001, ANN202
    return x.new_empty(rows.shape[0], w.shape[1])


def _scaled_context(ctx, inputs, keyword_only_inputs, output) -> None:  # noqa: ANN001
    _rows_times_context(ctx, inputs, output)
    ctx.scale = keyword_only_inputs["scale"]


def _scaled_backward(ctx, grad):  # noqa: ANN001, ANN202
    grad_x, grad_w, _ = _rows_times_backward(ctx, grad * ctx.scale)
    return grad_x, grad_w, None


rows_times_scaled.register_autograd(_scaled_backward, setup_context=_scaled_context)


def roads(x, w, rows):  # noqa: ANN001, ANN201
    a = CubeTimes.apply(x.tanh(), w) + ScaledSin.apply(x, 0.5)  # (a float input: engine)
    w2 = w.unflatten(0, (5, 1)) * x[:1].T[:, :5] + 1
    b = torch.ops.minicompile_test.rows_times(a, w2, rows)  # as transformers calls it
    return (b + torch.ops.minicompile_test.rows_times_scaled(a, w2, rows, scale=0.5)).sum(1)


def test_functions_of_tensors_take_the_direct_road(backend: str, device: torch.device,
                                                   monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture) -> None:
    """CubeTimes' and rows_times_scaled's Functions are called directly, ScaledSin's (a
    float input) goes through the engine, and rows_times (a custom op with a registered
    backward) is not recorded: its setup_context and backward run in the backward graph
    (runtime/custom_op_grads.py)."""
    from minicompile.runtime import autograd, function_grads

    direct = []
    monkeypatch.setattr(autograd, "function_grads", lambda *a: direct.append(
        function_grads.function_grads(*a)) or direct[-1])
    compiled = minicompile.compile(roads, backend=backend)
    with minicompile.config.patch(logs=frozenset({"output_code"})):
        compiled(torch.randn(4, 5, device=device, requires_grad=True),
                 torch.randn(5, device=device), torch.zeros(7, dtype=torch.long, device=device))
    code = capsys.readouterr().err
    assert "custom_op_grads('torch.ops.minicompile_test.rows_times'" in code
    assert "record('torch.ops.minicompile_test.rows_times'" not in code
    assert "record('torch.ops.minicompile_test.rows_times_scaled'" in code
    direct.clear()
    for _ in range(2):
        x, w = torch.randn(4, 5, device=device), torch.randn(5, device=device)
        rows = torch.randint(0, 4, (7,), device=device)
        grads = []
        for fn in (roads, compiled):
            leaves = [x.clone().requires_grad_(), w.clone().requires_grad_()]
            out = fn(*leaves, rows)
            (out * torch.linspace(-1, 1, 7, device=device)[:, None]).sum().backward()
            grads.append([out.detach(), *(t.grad for t in leaves)])
        for got, want in zip(grads[1], grads[0]):
            torch.testing.assert_close(got, want)
    assert minicompile.stats()["graph_breaks"] == 0
    roads_taken = sorted("direct" if r is not None else "engine" for r in direct)
    assert roads_taken == ["direct"] * 4 + ["engine"] * 2  # 2 calls of each
