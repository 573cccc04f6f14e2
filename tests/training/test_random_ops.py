"""Random draws compiled (ops.RANDOM_FUNCTIONS and RANDOM_IN_PLACE): library
calls that draw from PyTorch's generator in program order, so a compiled function draws
exactly what eager draws from the same seed, and fresh values on every call.  timm's
stochastic depth (``x.new_empty(shape).bernoulli_(keep)``) trains whole."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import minicompile


def _draws_like_eager(fn, make) -> None:  # noqa: ANN001
    """``fn`` compiled against eager on fresh inputs ``make()`` under two seeds, then two
    calls on one input: their draws differ (the generator moved on)."""
    compiled = minicompile.compile(fn)
    for seed in (0, 1):
        args = make()
        torch.manual_seed(seed)
        got = compiled(*args)
        torch.manual_seed(seed)
        want = fn(*args)
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    args = make()
    first, second = compiled(*args), compiled(*args)
    first, second = (first, second) if isinstance(first, tuple) else ((first,), (second,))
    assert not any(torch.equal(a, b) for a, b in zip(first, second))
    stats = minicompile.stats()
    assert (stats["graphs"], stats["graph_breaks"], stats["eager_fallbacks"]) == (1, 0, 0), stats


def rand_functions(x):
    noise = torch.rand_like(x) + torch.randn(x.shape, device=x.device, dtype=x.dtype)
    ints = torch.randint(0, 10, x.shape, device=x.device) + torch.randperm(x.shape[-1],
                                                                          device=x.device)
    return x * noise + ints, torch.randint_like(x, 5) - torch.randn_like(x)


def bernoulli_and_normal(x):
    mask = torch.bernoulli(torch.sigmoid(x))
    return mask * torch.normal(x, 2.0) + x.bernoulli(0.3), torch.multinomial(x.softmax(-1), 3)


def in_place_draws(x):
    y = torch.empty_like(x)
    y.uniform_(-1, 1)
    z = x.clone().normal_(1.0, 0.5).exponential_()  # (each reads the draws before it)
    w = x.new_empty(x.shape[:1]).random_(0, 7)
    return y + z, x.clone().bernoulli_(0.25), w


def drop_path(x):  # timm's stochastic depth
    keep = 0.8
    shape = (x.shape[0],) + (1,) * (x.ndim - 1)
    r = x.new_empty(shape).bernoulli_(keep)
    r.div_(keep)
    return x * r


@pytest.mark.parametrize("fn", [rand_functions, bernoulli_and_normal, in_place_draws,
                                drop_path], ids=lambda f: f.__name__)
def test_random_draws_match_eager_and_change_per_call(backend: str, device: torch.device,
                                                      fn) -> None:  # noqa: ANN001
    with minicompile.config.patch(backend=backend):
        _draws_like_eager(fn, lambda: (torch.randn(64, 16, device=device),))


def test_an_input_drawn_into_in_place_holds_eager_draws(device: torch.device) -> None:
    def fill(x, y):
        x.uniform_(0, 2)
        return x * y

    compiled = minicompile.compile(fill)
    a, b = torch.empty(32, device=device), torch.empty(32, device=device)
    y = torch.randn(32, device=device)
    torch.manual_seed(3)
    got = compiled(a, y)
    torch.manual_seed(3)
    want = fill(b, y)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(a, b)  # (written back into the caller's tensor)
    assert minicompile.stats()["graph_breaks"] == 0


def test_a_generator_argument_breaks_with_a_reason() -> None:
    g = torch.Generator().manual_seed(0)

    def f(x):
        return x + torch.rand(x.shape, generator=g)

    with pytest.raises(minicompile.Unsupported, match="Generator"):
        minicompile.compile(f, fullgraph=True)(torch.randn(4))


def test_in_place_draws_into_a_tensor_that_requires_grad_break() -> None:
    def f(x):
        y = x * 2
        y.uniform_()
        return y

    with pytest.raises(minicompile.Unsupported, match="requires grad"):
        minicompile.compile(f, fullgraph=True)(torch.randn(4, requires_grad=True))


def test_draws_of_dynamic_sizes(device: torch.device) -> None:
    def f(x):
        return x + torch.rand(x.shape[0], 1, device=x.device)

    compiled = minicompile.compile(f, dynamic=True)
    for n in (5, 9):
        x = torch.randn(n, 3, device=device)
        torch.manual_seed(n)
        got = compiled(x)
        torch.manual_seed(n)
        torch.testing.assert_close(got, f(x))
    assert minicompile.stats()["recompiles"] == 0


def _trains_like_eager(model: nn.Module, twin: nn.Module, compiled, make,  # noqa: ANN001
                       loss_tol: dict, grad_rtol: float, grad_atol: float) -> None:
    """Two steps on fresh inputs ``make()``, each seeded alike for eager ``model`` and the
    compiled ``twin``: the losses and every gradient (``grad_atol`` relative to the largest
    gradient) match, in one graph."""
    for seed in (1, 2):
        x = make()
        torch.manual_seed(seed)
        want = model(x).square().mean()
        torch.manual_seed(seed)
        got = compiled(x).square().mean()
        want.backward()
        got.backward()
        torch.testing.assert_close(got, want, **loss_tol)
        scale = max(p.grad.abs().max().item() for p in model.parameters())
        for p, q in zip(model.parameters(), twin.parameters()):
            torch.testing.assert_close(q.grad, p.grad, rtol=grad_rtol, atol=grad_atol * scale)
        model.zero_grad()
        twin.zero_grad()
    assert minicompile.stats()["graph_breaks"] == 0


class DropPathBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)
        self.norm = nn.LayerNorm(16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + drop_path(self.fc(self.norm(x)))


def test_stochastic_depth_trains_whole_with_eager_gradients(backend: str,
                                                            device: torch.device) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(DropPathBlock(), DropPathBlock()).to(device).train()
    twin = nn.Sequential(DropPathBlock(), DropPathBlock()).to(device).train()
    twin.load_state_dict(model.state_dict())
    compiled = minicompile.compile(twin, backend=backend, fullgraph=True)
    _trains_like_eager(model, twin, compiled, lambda: torch.randn(8, 4, 16, device=device),
                       {}, 1e-5, 1e-6)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need CUDA")
def test_cuda_graphs_draw_eagers_values_on_every_call() -> None:
    """mode="reduce-overhead": the ordinary first call, the recording call (its warm-up
    run's draws are set back) and the replays (PyTorch's graph-safe generator) each draw
    what eager draws from the same seed."""

    def f(x):
        return x * torch.rand_like(x) + x.new_empty(x.shape[:1] + (1,)).bernoulli_(0.8)

    compiled = minicompile.compile(f, mode="reduce-overhead")
    x = torch.randn(256, 64, device="cuda")
    outs = []
    for seed in range(5):
        torch.manual_seed(seed)
        outs.append(compiled(x).clone())
        torch.manual_seed(seed)
        torch.testing.assert_close(outs[-1], f(x), rtol=1e-6, atol=1e-6)
    assert not any(torch.equal(a, b) for k, a in enumerate(outs) for b in outs[:k])


@pytest.mark.parametrize("name", ["vit_tiny_patch16_224", "convnext_atto"])
def test_timm_models_with_stochastic_depth_train_whole(name: str) -> None:
    """timm's DropPath draws ``x.new_empty(shape).bernoulli_(keep)`` in every block: the
    loss and every gradient match eager's from the same seed, in one graph."""
    import copy

    from model_report import import_torchvision

    import_torchvision()  # (torchvision without its C++ operators, as the zoo's)
    import timm

    torch.manual_seed(0)
    small = {"img_size": 32, "patch_size": 8, "depth": 2} if name.startswith("vit") else {}
    model = timm.create_model(name, pretrained=False, num_classes=10, drop_path_rate=0.3,
                              **small).train()
    twin = copy.deepcopy(model)
    compiled = minicompile.compile(twin, backend="cpp", fullgraph=True)
    _trains_like_eager(model, twin, compiled, lambda: torch.randn(2, 3, 32, 32),
                       {"rtol": 1e-4, "atol": 1e-5}, 1e-3, 1e-4)
