"""Unsupported constructs: a clear one-line reason and the user's source line."""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F
from capture_helpers import capture

from minicompile.errors import Unsupported


def unsupported(fn, *args, **kwargs) -> Unsupported:
    with pytest.raises(Unsupported) as info:
        capture(fn, *args, **kwargs)
    return info.value


def test_print_names_reason_and_line() -> None:
    def f(x):
        y = x + 1
        print(y)
        return y

    e = unsupported(f, torch.ones(2))
    assert e.reason == "print() is not traceable (side effect)"
    where = e.stack[-1]
    assert where.filename == __file__ and where.function == "f"
    assert where.text == "print(y)"
    assert where.lineno == f.__code__.co_firstlineno + 2
    assert f"{__file__}:{where.lineno} in f" in str(e)


_GENERATOR = torch.Generator()  # (draws from a generator of their own are not compiled)


@pytest.mark.parametrize(
    "fn,reason,text",
    [
        (lambda x: x.sum().item(), "Tensor.item() reads tensor data into Python", None),
        (lambda x: x.tolist(), "Tensor.tolist() reads tensor data into Python", None),
        (lambda x: x.numpy().item(), "numpy.ndarray.item() reads the array's data", None),
        (lambda x: x + x.numpy(), "between a NumPy array and a torch tensor", None),
        (lambda x: len(x.sum()), "len() of a 0-d tensor", None),
        (lambda x: bool(x.sum()), "bool() of a tensor reads its data into Python", None),
        (lambda x: os.getpid() + x, "call to posix.getpid is not supported", None),
        (lambda x: x.to("meta"), "moving a tensor from cpu to meta is not supported", None),
        (lambda x: float(x), "float() of a tensor reads its data into Python", None),
        (lambda x: torch.nn.functional.rrelu(x, training=True), "random ops are not compiled",
         None),
        (lambda x: torch.rand(2, generator=_GENERATOR) + x, "of type Generator", None),
        (lambda x: x.uniform_(generator=_GENERATOR), "of type Generator", None),
        (lambda x: torch.nonzero(x), "data-dependent output shape", None),
        (lambda x: x[x > 0], "bool mask has a data-dependent shape", None),
        (lambda x: x.t_(), "changes tensor metadata", None),
        (lambda x: torch.manual_seed(0), "effects outside the graph", None),
        (lambda x: x.add_(1.5) if False else x.long().add_(1.5), "can't be cast", None),
        (lambda x: x.add_(torch.ones(3, 2, 2)), "differs from the tensor's", None),
        (lambda x: x.expand(3, 2, 2).add_(1), "expanded (broadcast) view", None),
        (
            lambda x: torch.div(x.long(), 2, rounding_mode="trunc"),
            "only supported on float32",
            None,
        ),
    ],
)
def test_reasons(fn, reason, text) -> None:
    e = unsupported(fn, torch.ones(2, 2))
    assert reason in e.reason
    assert e.stack and e.stack[-1].filename == __file__


def test_if_on_tensor() -> None:
    def g(x):
        if (x > 0).all():
            return x
        return -x

    e = unsupported(g, torch.ones(2))
    assert e.reason.startswith("data-dependent branch")

    def h(x):
        if x > 0:
            return x
        return -x

    e = unsupported(h, torch.ones(()))
    assert e.reason.startswith("data-dependent branch")
    assert e.hint == "use torch.where"
    assert e.stack[-1].text == "if x > 0:"


@pytest.mark.parametrize("layerdrop", [0.0, -0.5, 1.0, 2.0])
def test_layerdrop_branch_on_a_draw_its_range_decides(layerdrop: float) -> None:
    """transformers' LayerDrop (BART, 5.17): ``torch.rand([]) < layerdrop`` is decided by
    the draw's range where it can be (0.0: never skip), with eager's random stream; a bound
    inside the range (or at its end, 1.0) is a data-dependent branch, as before."""
    import minicompile

    def layers(x):
        kept = x
        for _ in range(2):
            if torch.rand([]) < layerdrop:  # skip the layer
                continue
            kept = kept * 2 + 1
        return kept + torch.rand(3)  # the stream after the draws is eager's

    minicompile.reset()
    compiled = minicompile.compile(layers)
    for seed in (1, 2, 3):
        x = torch.randn(3)
        torch.manual_seed(seed)
        got = compiled(x)
        torch.manual_seed(seed)
        torch.testing.assert_close(got, layers(x))
    stats = minicompile.stats()
    whole = (stats["graphs"], stats["graph_breaks"], stats["eager_fallbacks"]) == (1, 0, 0)
    assert whole == (layerdrop <= 0.0 or layerdrop > 1.0), stats


def test_shape_error_runs_eagerly() -> None:
    e = unsupported(lambda a, b: a + b, torch.ones(2, 3), torch.ones(4))
    assert e.reason.startswith("add: eager PyTorch raises RuntimeError")


def test_setattr_on_library_objects_and_long_loops() -> None:
    def mutate(x, box):
        box.value = x
        return x

    def forever(x):
        while True:
            x = x + 1

    e = unsupported(mutate, torch.ones(2), object())
    assert e.reason == "attribute write on object  is not supported" or "object" in e.reason
    assert "trace longer than 100000 instructions" in unsupported(forever, torch.ones(2)).reason


def test_nonlocal_write_to_a_cell_of_the_trace_is_fine() -> None:
    from capture_helpers import check_matches_eager

    def f(x):
        k = 1

        def g():
            nonlocal k
            k = 2

        g()
        return x * k

    check_matches_eager(f, torch.ones(2))


def test_inlined_error_has_full_stack() -> None:
    def inner(t):
        return t.item()

    def outer(x):
        return inner(x * 2)

    e = unsupported(outer, torch.ones(()))
    assert [s.function for s in e.stack] == ["outer", "inner"]
    assert e.stack[0].text == "return inner(x * 2)"
    assert e.stack[-1].text == "return t.item()"


def test_recursion_is_capped() -> None:
    def rec(x, n):
        return x if n == 0 else rec(x + 1, n - 1)

    capture(rec, torch.ones(2), 3)  # shallow recursion inlines
    assert "inlining deeper than 20" in unsupported(rec, torch.ones(2), 30).reason


def test_in_place_op_on_a_leaf_that_requires_grad() -> None:
    e = unsupported(lambda x: x.mul_(2), torch.ones(2, requires_grad=True))
    assert "in-place op on an input that requires grad" in e.reason


def test_a_custom_autograd_function_of_a_local_class_that_takes_gradients_breaks() -> None:
    # (one of a module is a library call: tests/training/test_autograd_functions.py)
    class Doubled(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, grad):
            return grad * 2

    reason = unsupported(lambda x: Doubled.apply(x), torch.ones(2, requires_grad=True)).reason
    assert "Doubled.apply() on tensors that require grad" in reason
    assert "cannot be found again by its module and name" in reason


def test_repeat_interleave_by_a_tensor_has_a_data_dependent_size() -> None:
    reason = unsupported(lambda x, r: torch.repeat_interleave(x, r), torch.ones(3),
                         torch.tensor([1, 2, 0])).reason
    assert "data-dependent output shape" in reason


@torch.library.custom_op("minicompile_test::twice", mutates_args=())
def _twice(x: torch.Tensor) -> torch.Tensor:
    return x * 2


def test_a_custom_operator_is_named_as_users_call_it() -> None:
    # (without a fake kernel: tests/capture/test_operators.py compiles those with one)
    reason = unsupported(lambda x: torch.ops.minicompile_test.twice(x), torch.ones(2)).reason
    assert reason.startswith("torch.ops.minicompile_test.twice: it has no fake kernel")


def test_unsupported_global_object_call() -> None:
    import operator

    thing = operator.methodcaller("sin")
    reason = unsupported(lambda x: thing(x), torch.ones(2)).reason
    assert reason == "call to operator.methodcaller('sin') is not supported"


def test_failing_assert_and_mixed_devices() -> None:
    def f(x):
        if x.ndim != 3:
            raise ValueError("needs 3 dims")
        return x

    # (a failing `assert` in this file would go through pytest's assertion rewriting)
    assert unsupported(f, torch.ones(2)).reason == "raise statement: eager raises"
    if torch.cuda.is_available():
        e = unsupported(lambda a, b: a + b, torch.ones(2), torch.ones(2, device="cuda"))
        assert "tensors on different devices (cpu, cuda:0)" in e.reason
