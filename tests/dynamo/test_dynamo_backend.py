"""``torch.compile(fn, backend="minicompile")``: Dynamo's FX graphs through minicompile.

Every compiled function runs twice with fresh values and is compared with eager PyTorch, on
both backends (passed as ``options={"backend": ...}``).  Dynamo is slow to trace on two
cores, so each test compiles a few functions rather than one per op.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import minicompile
from minicompile.dynamo_backend import minicompile_backend

from devices import device_for
from gpt import GPT, Block, GPTConfig

torch._dynamo = pytest.importorskip("torch._dynamo")


@pytest.fixture(autouse=True)
def fresh() -> None:
    torch._dynamo.reset()
    minicompile.reset()


def compiled(fn: object, backend: str, **kwargs: object) -> object:
    return torch.compile(fn, backend="minicompile", options={"backend": backend}, **kwargs)


def close(a: object, b: object) -> None:
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def pointwise(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.sin(x) * 2 + y.exp() - (x > 0).float()


def softmax_matmul(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x @ y.t(), dim=-1).transpose(0, 1).contiguous().view(-1)


def norm_and_outputs(x: torch.Tensor, y: torch.Tensor) -> tuple:
    # tuple, list and None outputs; layer_norm over the last dim
    h = F.layer_norm(x, (x.shape[-1],))
    return h, None, [h.sum(-1), y.mean()]


def library_calls(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    # ops with no rule of minicompile's become library calls inside the graph
    return torch.cumsum(x, 0).relu() + torch.special.bessel_j0(y)


FUNCTIONS = [pointwise, softmax_matmul, norm_and_outputs, library_calls]


def test_listed_by_dynamo() -> None:
    from torch._dynamo.backends.registry import lookup_backend

    # Read from the installed package's metadata: after setup.cfg changes, `pip install -e .`
    # again (a stale minicompile.egg-info in the checkout hides the entry point).
    assert "minicompile" in torch._dynamo.list_backends()
    assert lookup_backend("minicompile") is minicompile_backend


@pytest.mark.parametrize("fn", FUNCTIONS, ids=lambda f: f.__name__)
def test_functions_match_eager(fn: object, backend: str) -> None:
    device = device_for(backend)
    c = compiled(fn, backend)
    for seed in (0, 1):
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(6, 8, generator=g).to(device)
        y = torch.randn(8, 6, generator=g).to(device).t()  # non-contiguous
        close(c(x, y), fn(x, y))
    stats = minicompile.stats()
    assert stats["graphs"] == 1 and stats["eager_fallbacks"] == 0 and stats["kernels"] >= 1


def test_modules_match_eager(backend: str) -> None:
    device = device_for(backend)
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16)).to(device)
    block = Block(GPTConfig(n_embd=32, n_head=4, block_size=8)).to(device).eval()
    for model, shape in ((mlp, (4, 16)), (block, (2, 8, 32))):
        c = compiled(model, backend)
        with torch.no_grad():
            for _ in range(2):
                x = torch.randn(shape, device=device)
                close(c(x), model(x))
    assert minicompile.stats()["graph_breaks"] == 0


def test_dynamic_sizes_compile_once(backend: str) -> None:
    """dynamic=True: Dynamo's symbolic sizes (and SymInt inputs) are minicompile's symbols
    from the first compile, so two sizes compile one graph each side."""

    def fn(x: torch.Tensor) -> tuple:
        n = x.shape[0]
        return torch.softmax(x.view(n // 2, -1), dim=-1) * n, torch.arange(n, device=x.device)

    from torch._dynamo.utils import counters

    counters.clear()
    device = device_for(backend)
    c = compiled(fn, backend, dynamic=True)
    for n in (6, 10):
        x = torch.randn(n, 4, device=device)
        close(c(x), fn(x))
    assert counters["stats"]["unique_graphs"] == 1
    stats = minicompile.stats()
    assert (stats["graphs"], stats["recompiles"], stats["eager_fallbacks"]) == (1, 0, 0)


def test_dynamic_gpt_reads_module_floats_as_constants(backend: str) -> None:
    """dynamic=True: Dynamo passes LayerNorm's eps and Dropout's p as 0-d tensors read
    with .item(); each set of their values is one compiled graph, without a graph break."""
    from torch._dynamo.utils import counters

    counters.clear()
    device = device_for(backend)
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=16, vocab_size=64, n_layer=1, n_head=2, n_embd=32))
    model = model.to(device).eval()
    c = compiled(model, backend, dynamic=True)
    with torch.no_grad():
        for b, t in ((2, 8), (3, 12)):
            idx = torch.randint(0, 64, (b, t), device=device)
            close(c(idx), model(idx))
    stats = minicompile.stats()
    assert (stats["graphs"], stats["graph_breaks"], stats["recompiles"]) == (1, 0, 0)
    assert counters["stats"]["unique_graphs"] == 1


def test_new_scalar_values_compile_again(backend: str) -> None:
    """The graph called with another value of a scalar input compiles with that value."""
    calls: list = []

    def recording(gm: torch.fx.GraphModule, example_inputs: list, **kwargs: object) -> object:
        fn = minicompile_backend(gm, example_inputs, **kwargs)

        def run(*args: object) -> object:
            calls.append((gm, fn, args))
            return fn(*args)

        return run

    device = device_for(backend)
    ln = nn.LayerNorm(8).to(device)
    c = torch.compile(ln, backend=recording, dynamic=True, options={"backend": backend})
    with torch.no_grad():
        x = torch.randn(4, 8, device=device)
        close(c(x), ln(x))
        gm, fn, args = calls[-1]
        scalars = [k for k, a in enumerate(args) if isinstance(a, torch.Tensor) and a.dim() == 0]
        assert scalars, "Dynamo passed no scalar input (eps)"
        for eps in (0.5, 2.0):
            new = [torch.full_like(a, eps) if k in scalars else a for k, a in enumerate(args)]
            close(fn(*new), gm(*new))
    assert minicompile.stats()["graphs"] == 3


def test_backward_through_the_backend(backend: str) -> None:
    """Inputs requiring grad: the graph's backward is minicompile's compiled one, and
    parameter gradients equal eager's, step after step."""
    device = device_for(backend)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4)).to(device)
    twin = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4)).to(device)
    twin.load_state_dict(model.state_dict())
    c = compiled(twin, backend)
    for _ in range(2):
        x = torch.randn(5, 8, device=device, requires_grad=True)
        x2 = x.detach().clone().requires_grad_()
        F.log_softmax(model(x), -1).mean().backward()
        out = c(x2)
        assert type(out.grad_fn).__name__ == "CompiledGraphFunctionBackward"
        ran = []
        out.grad_fn.register_hook(lambda *_: ran.append(True))
        F.log_softmax(out, -1).mean().backward()
        assert ran, "the compiled backward did not run"
        close(x2.grad, x.grad)
        for p, q in zip(model.parameters(), twin.parameters()):
            close(q.grad, p.grad)
    assert minicompile.stats()["eager_fallbacks"] == 0


def test_grad_mode_and_autocast_regions_stay_in_the_graph(backend: str) -> None:
    """Dynamo writes ``with torch.no_grad()`` and ``with torch.autocast(...)`` blocks as
    calls (``torch._C._set_grad_enabled``, ``_enter_autocast`` / ``_exit_autocast``):
    one graph, eager's values, dtypes and gradients."""

    def fn(x: torch.Tensor) -> tuple:
        with torch.no_grad():
            y = x * 2
        z = (y + x).sin()
        with torch.autocast(x.device.type, dtype=torch.bfloat16):
            w = z @ z.t()
        return z, w

    device = device_for(backend)
    c = compiled(fn, backend)
    for _ in range(2):
        x = torch.randn(4, 4, device=device, requires_grad=True)
        x2 = x.detach().clone().requires_grad_()
        got, want = c(x), fn(x2)
        close(got, want)
        assert got[1].dtype == torch.bfloat16
        (got[0].sum() + got[1].float().sum()).backward()
        (want[0].sum() + want[1].float().sum()).backward()
        close(x.grad, x2.grad)
    stats = minicompile.stats()
    assert (stats["graphs"], stats["graph_breaks"]) == (1, 0)


def test_fx_graph_with_get_attr_and_in_place(backend: str) -> None:
    """A GraphModule handed over directly: get_attr nodes (a buffer, a parameter) and an
    in-place op on an input, which the caller sees as in eager."""

    class M(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.randn(4, 4))
            self.register_buffer("b", torch.randn(4))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x.mul_(2)
            return (x @ self.w + self.b).relu()

    device = device_for(backend)
    m = M().to(device)
    gm = torch.fx.symbolic_trace(m)
    assert any(n.op == "get_attr" for n in gm.graph.nodes)
    fn = minicompile_backend(gm, [], options={"backend": backend})
    with torch.no_grad():
        for _ in range(2):
            x = torch.randn(3, 4, device=device)
            x2 = x.clone()
            close(fn(x), m(x2))
            close(x, x2)


def test_options_are_checked() -> None:
    with pytest.raises(ValueError, match="unknown option"):
        minicompile_backend(torch.fx.symbolic_trace(nn.ReLU()), [], options={"bogus": 1})


@torch.library.custom_op("minicompile_dynamo_test::offset", mutates_args=())
def _offset(x: torch.Tensor, by: float) -> torch.Tensor:
    return x + by


@_offset.register_fake
def _(x: torch.Tensor, by: float) -> torch.Tensor:
    return torch.empty_like(x)


class MakesAModule(nn.Module):
    """Builds a module in forward: Dynamo's graph then calls PyTorch's usage log."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = nn.Identity()
        return torch.ops.minicompile_dynamo_test.offset(scale(x).sin(), 0.5) * 2


def test_custom_ops_and_the_usage_log_in_dynamos_graph(backend: str) -> None:
    device = device_for(backend)
    model = MakesAModule()
    c = compiled(model, backend)
    for _ in range(2):
        x = torch.randn(5, 3, device=device)
        close(c(x), model(x))
    stats = minicompile.stats()
    assert (stats["graphs"], stats["graph_breaks"], stats["eager_fallbacks"]) == (1, 0, 0)
