"""minicompile/compat.py on the PyTorch this suite runs on: every entry answers, and answers
what the rest of the compiler relies on.  CI runs the suite on each supported release (the
newest a fresh install picks, and the pinned CPU build), so each is checked on each."""

from __future__ import annotations

import pytest
import torch

import minicompile
from minicompile import compat


class Double(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):  # noqa: ANN001, ANN205
        return x * 2

    @staticmethod
    def backward(ctx, grad):  # noqa: ANN001, ANN205
        return grad * 2


class DoubleAgain(Double):
    pass


class OwnApply(torch.autograd.Function):
    """A class that defines ``apply`` itself: not autograd's ``apply``."""

    @classmethod
    def apply(cls, x):  # noqa: ANN001, ANN206
        return x


class NotAFunction:
    @classmethod
    def apply(cls, x):  # noqa: ANN001, ANN206
        return x


def test_the_running_release_is_one_the_readme_names() -> None:
    assert compat.TORCH_VERSION in compat.TESTED, (
        f"PyTorch {torch.__version__} is not among the tested releases {compat.TESTED}: "
        "run the suite on it, then name it in compat.TESTED and the README")


def test_autograd_function_apply_is_recognised() -> None:
    assert compat.autograd_function_of(Double.apply) is Double
    assert compat.autograd_function_of(DoubleAgain.apply) is DoubleAgain
    for other in (OwnApply.apply, NotAFunction.apply, Double.forward, torch.sin, len, None,
                  Double, torch.ones(1).add):
        assert compat.autograd_function_of(other) is None, other


def test_prims_common_has_what_the_metadata_rules_use() -> None:
    pc = compat.prims_common()
    x = torch.empty(2, 3, 4, 5).to(memory_format=torch.channels_last)
    assert pc.suggest_memory_format(x) == torch.channels_last
    assert pc.is_non_overlapping_and_dense_or_false(x)
    kind = pc.ELEMENTWISE_TYPE_PROMOTION_KIND.DEFAULT
    assert pc.elementwise_dtypes(torch.ones(1, dtype=torch.int32), 1.5,
                                 type_promotion_kind=kind) == (torch.float32, torch.float32)
    perm, _ = pc.compute_elementwise_output_logical_to_physical_perm(x)
    assert list(perm) == [0, 2, 3, 1]


def test_fake_tensors_and_symbols() -> None:
    env = compat.shape_env(duck_shape=False)
    mode = compat.fake_tensor_mode(shape_env=env, allow_non_fake_inputs=True)
    source = compat.source_class()("x.size()[0]")
    assert source.name == "x.size()[0]" and source.name() == "x.size()[0]"
    sym = env.create_symbol(5, source, dynamic_dim=compat.dynamic_dim())
    size = env.create_symintnode(sym, hint=5, source=source)
    with mode, compat.python_dispatcher():
        fake = torch.empty(size, 3)
        out = torch.nn.functional.linear(fake, torch.empty(4, 3))
    assert out.shape[1] == 4 and str(out.shape[0]) == str(sym)
    assert compat.sympy_functions().FloorDiv is not None


def test_dispatch_mode_base_sees_operators() -> None:
    seen = []

    class Recorder(compat.TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
            seen.append(str(func))
            return func(*args, **(kwargs or {}))

    with Recorder():
        torch.ones(2).sin()
    assert any("sin" in name for name in seen)


def test_custom_op_fake_kernel_is_seen() -> None:
    @torch.library.custom_op("mc_compat_test::plain", mutates_args=())
    def plain(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @torch.library.custom_op("mc_compat_test::faked", mutates_args=())
    def faked(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @faked.register_fake
    def _(x: torch.Tensor) -> torch.Tensor:
        return torch.empty_like(x)

    ops = torch.ops.mc_compat_test
    assert not compat.custom_op_has_fake_kernel(ops.plain.default)
    assert compat.custom_op_has_fake_kernel(ops.faked.default)
    assert compat.custom_op_has_fake_kernel(torch.ops.aten.sin.default)

    def backward(ctx, grad):  # noqa: ANN001, ANN202
        return grad * 2

    def setup(ctx, inputs, output) -> None:  # noqa: ANN001
        pass

    faked.register_autograd(backward, setup_context=setup)
    assert compat.custom_op_of(faked) is ops.faked and compat.custom_op_of(torch.sin) is None
    for op in (ops.faked, ops.faked.default):
        assert compat.custom_op_autograd(op) == (ops.faked.default, backward, setup)
    assert compat.custom_op_autograd(ops.plain) is None
    assert compat.custom_op_autograd(torch.ops.aten.sin) is None
    y = Double.apply(torch.ones(2, requires_grad=True))
    assert compat.is_function_node(y.grad_fn) and compat.node_outputs(y.grad_fn) == 1
    assert not compat.is_function_node(torch.ones(2, requires_grad=True).sin().grad_fn)


def test_cuda_entry_points_follow_the_build() -> None:
    # CUDA builds have the launcher and the stream calls (also on a machine without a
    # GPU); the CPU build has none of them.
    stream, device = compat.cuda_stream_functions()
    cuda_only = [compat.STATIC_CUDA_LAUNCHER, stream, device]
    if torch.version.cuda is None:
        assert cuda_only == [None] * 3
    else:
        assert all(callable(e) for e in cuda_only)
    if torch.cuda.is_available():
        assert all(callable(e) for e in compat.storage_functions())
    assert callable(compat.GPU_SLEEP)  # (in every build; it runs on a GPU)



def test_generated_code_allocations_and_views() -> None:
    # PyTorch's fast paths where it has them (every tested release does), else the
    # fallbacks; the same tensors either way, for a view with an offset of its own.
    guards = torch._C._dynamo.guards
    assert compat.empty_strided_cpu is guards._empty_strided_cpu
    assert compat.reinterpret is guards._reinterpret_tensor
    for empty, view in ((compat.empty_strided_cpu, compat.reinterpret),
                        (compat._empty_strided_cpu, compat._reinterpret)):
        t = empty((2, 3), (1, 2), torch.float16)
        assert (t.shape, t.stride(), t.dtype, t.device.type) == ((2, 3), (1, 2),
                                                                  torch.float16, "cpu")
        base = torch.arange(24.0).reshape(2, 12)[:, 1:]  # storage offset 1
        want = base.as_strided((2, 3), (12, 1), base.storage_offset() + 2)
        assert torch.equal(view(base, (2, 3), (12, 1), 2), want)
        assert torch.equal(view(base, (2, 3), (12, 1)), base[:, :3])

def test_abi_and_export_handles() -> None:
    assert compat.cxx11_abi() in (0, 1)
    aoti = compat.aoti()
    handles = aoti.unsafe_alloc_void_ptrs_from_tensors([torch.arange(3.0)])
    (back,) = aoti.alloc_tensors_by_stealing_from_void_ptrs(handles)
    assert back.tolist() == [0.0, 1.0, 2.0]


@pytest.fixture
def fresh() -> None:
    minicompile.reset()


def test_class_bound_c_methods_are_guarded_without_recompiles(fresh: None) -> None:
    """``Double.apply`` is a new object at every read (a builtin bound method from
    PyTorch 2.14, a bound classmethod before): guarded by what it is bound to, it compiles
    once, with no grad (inlined) and with grad (a library call)."""

    @minicompile.compile(backend="cpp")
    def fn(x):  # noqa: ANN001, ANN202
        return DoubleAgain.apply(Double.apply(x)) * 0.5

    for requires_grad in (False, True):
        minicompile.reset()
        for _ in range(3):
            x = torch.randn(4, requires_grad=requires_grad)
            out = fn(x)
            torch.testing.assert_close(out, x * 2)
            if requires_grad:
                out.sum().backward()
                torch.testing.assert_close(x.grad, torch.full((4,), 2.0))
        stats = minicompile.stats()
        assert (stats["graphs"], stats["recompiles"], stats["graph_breaks"]) == (1, 0, 0)


def test_clamp_gradient_at_bounds_is_eagers() -> None:
    x = torch.tensor([0.0, 1.0, 0.5], requires_grad=True)
    (grad,) = torch.autograd.grad(x.clamp(0.0, 1.0).sum(), x)
    expected = 1.0 if compat.clamp_gradient_at_bounds() else 0.0
    assert grad.tolist() == [expected, expected, 1.0]
    assert compat.clamp_gradient_at_bounds() == (compat.TORCH_VERSION < (2, 14))


def test_attention_backward_is_the_nodes_own() -> None:
    """The CPU's fused attention node is in the table, and its backward op called on what
    the node saved gives autograd's gradients."""
    q, k, v = (torch.randn(1, 2, 5, 8, requires_grad=True) for _ in range(3))
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    backward = compat.ATTENTION_BACKWARDS[type(out.grad_fn).__name__]
    g = torch.randn_like(out)
    for got, expected in zip(backward(out.grad_fn, g, [True] * 3),
                             torch.autograd.grad(out, (q, k, v), g)):
        torch.testing.assert_close(got, expected)


def test_tensor_guards_check_what_tensor_guards_check() -> None:
    """The C++ check passes tensors with the metadata of those it was built from (other
    objects and values), and fails each change the Python guards see, and a tensor twice."""
    w, b = torch.nn.Parameter(torch.randn(3, 4)), torch.zeros(4)
    guards = compat.tensor_guards([w, b])
    assert guards is not None, "TensorGuards is gone: guards still work, only slower"
    assert guards.check(w, b) and guards.check(torch.nn.Parameter(torch.ones(3, 4)), b + 1)
    for other in (torch.nn.Parameter(torch.randn(3, 4, dtype=torch.float64)),
                  torch.nn.Parameter(torch.randn(3, 5)), torch.nn.Parameter(torch.randn(4, 3).t()),
                  torch.nn.Parameter(torch.randn(3, 4), requires_grad=False),
                  torch.nn.Parameter(torch.randn(3, 4, device="meta")), torch.randn(3, 4)):
        assert not guards.check(other, b), other
    assert not compat.tensor_guards([w, w]).check(w, w)


def test_dict_version_moves_on_every_write_dict_guards_rely_on() -> None:
    """PEP 509's tag (runtime/dict_guards.py): every store, delete or clear moves it, through
    ``setattr`` on a module (its ``__dict__``, ``_modules``, ``_parameters``) too; reads do not."""
    import sys

    version = compat.DICT_VERSION
    if sys.version_info[:2] in ((3, 11), (3, 12)):
        assert version is not None, "no dict_version: every guard runs every call (slower)"
    if version is None:
        return
    m = torch.nn.Linear(2, 2)
    d, modules, params = vars(m), m._modules, m._parameters
    writes = [lambda: setattr(m, "training", False), lambda: setattr(m, "scale", 1.0),
              lambda: delattr(m, "scale"), lambda: setattr(m, "sub", torch.nn.ReLU()),
              lambda: setattr(m, "weight", torch.nn.Parameter(torch.ones(2, 2))),
              lambda: m._forward_hooks.__setitem__(0, print), lambda: m._forward_hooks.clear()]
    watched = [d, d, d, modules, params, m._forward_hooks, m._forward_hooks]
    for write, watch in zip(writes, watched):
        before = version(watch)
        _ = watch.get("weight"), m.training, m.weight  # reads
        assert version(watch) == before
        write()
        assert version(watch) != before, write
    # A plain object's attribute stores, once the interpreter specializes them (a warm loop).
    class Plain:
        pass

    p = Plain()
    p.a = 0
    d = vars(p)
    for i in range(200):
        before = version(d)
        p.a = i + 1
        assert version(d) != before, i
