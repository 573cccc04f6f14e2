"""Training-mode modules on every backend, compared with eager over two calls with fresh
inputs: batch norm on batch statistics with its running statistics updated in place,
dropout drawing eager's masks from the same seed, and ``torch.autocast`` regions as casts.

Autograd is not compiled yet: everything runs under ``torch.no_grad()`` in ``.train()``."""

from __future__ import annotations

import copy
import operator
import types
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import minicompile
from minicompile import config
from minicompile.capture import autocast
from minicompile.capture.variables import TensorVar
from minicompile.graph import Graph, TensorMeta

BF16 = dict(rtol=1.6e-2, atol=1e-2)


def assert_same(actual, expected, **tol) -> None:
    if isinstance(expected, (tuple, list)):
        assert len(actual) == len(expected)
        for a, e in zip(actual, expected):
            assert_same(a, e, **tol)
    elif isinstance(expected, torch.Tensor):
        assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
        torch.testing.assert_close(actual, expected, **tol)
    else:
        assert actual == expected


def check_module(make, shape, backend, device, calls=2, **tol) -> nn.Module:
    """``make()`` compiled and eager (same weights), called ``calls`` times on fresh inputs:
    outputs and every parameter and buffer (running statistics) agree after each call."""
    torch.manual_seed(0)
    model = make().to(device).train()
    eager = copy.deepcopy(model)
    compiled = minicompile.compile(model, backend=backend, fullgraph=True)
    with torch.no_grad():
        for _ in range(calls):
            x = torch.randn(shape, device=device)
            assert_same(compiled(x), eager(x), **tol)
            for (name, got), (_, want) in zip(model.state_dict().items(),
                                              eager.state_dict().items()):
                assert torch.allclose(got.double(), want.double(), atol=1e-5), name
    return model


# -- batch norm ----------------------------------------------------------------------------

BATCH_NORMS = {
    "1d_2d_input": (lambda: nn.BatchNorm1d(5), (6, 5)),
    "1d_3d_input": (lambda: nn.BatchNorm1d(3, momentum=0.3), (4, 3, 5)),
    "2d": (lambda: nn.BatchNorm2d(3), (2, 3, 4, 5)),
    "2d_cumulative": (lambda: nn.BatchNorm2d(3, momentum=None), (2, 3, 4, 4)),
    "2d_no_running_stats": (lambda: nn.BatchNorm2d(3, track_running_stats=False), (2, 3, 3, 3)),
    "2d_not_affine": (lambda: nn.BatchNorm2d(3, affine=False), (3, 3, 2, 2)),
    "3d": (lambda: nn.BatchNorm3d(2), (2, 2, 3, 2, 2)),
}


@pytest.mark.parametrize("case", BATCH_NORMS, ids=str)
def test_batch_norm_modules_in_training(case: str, backend: str, device: torch.device) -> None:
    make, shape = BATCH_NORMS[case]
    model = check_module(make, shape, backend, device, calls=3)
    if model.track_running_stats:
        assert int(model.num_batches_tracked) == 3
    stats = minicompile.stats()
    assert stats["graphs"] == 1 and stats["graph_breaks"] == 0 and stats["recompiles"] == 0


def test_conv_batch_norm_relu_fuses(backend: str, device: torch.device) -> None:
    """Conv is a library call; the statistics, the normalisation and the running-statistic
    updates are reduction kernels and their epilogues, with no library call for the norm."""
    def make():
        return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU())

    with config.patch(layout_opt="off"):  # (on CUDA, channels-last adds the two copies in)
        check_module(make, (2, 3, 5, 5), backend, device)
    stats = minicompile.stats()
    assert stats["kernels"] <= 3, stats
    with torch.no_grad():
        graph = str(minicompile.explain(make().to(device).train())(torch.randn(2, 3, 5, 5,
                                                                                 device=device)))
    assert "conv2d" in graph and "batch_norm" not in graph and "sum" in graph, graph


@torch.no_grad()
def test_batch_norm_and_dropout_with_symbolic_batch(backend: str, device: torch.device) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.Dropout(0.3)).to(device)
    eager = copy.deepcopy(model)
    compiled = minicompile.compile(model, backend=backend, dynamic=True, fullgraph=True)
    for n in (2, 3, 5):
        x = torch.randn(n, 4, device=device)
        torch.manual_seed(n)
        got = compiled(x)
        torch.manual_seed(n)
        assert_same(got, eager(x))
        assert_same(model[1].running_var, eager[1].running_var)
    assert minicompile.stats()["recompiles"] == 0


@torch.no_grad()
def test_functional_batch_norm_updates_caller_tensors(backend: str, device: torch.device) -> None:
    def f(x, mean, var, w, b):
        y = F.batch_norm(x, mean, var, w, b, training=True, momentum=0.2, eps=1e-3)
        z = torch.batch_norm(x * 2, w, b, mean, var, True, 0.5, 1e-5, False)  # its own order
        e = torch.batch_norm(x, w, b, mean, var, False, 0.1, 1e-5, False)  # evaluation
        return y, z, e

    compiled = minicompile.compile(f, backend=backend, fullgraph=True)
    for _ in range(2):
        x = torch.randn(4, 3, 5, device=device)
        w, b = torch.randn(3, device=device), torch.randn(3, device=device)
        mean, var = torch.randn(3, device=device), torch.rand(3, device=device) + 0.5
        m2, v2 = mean.clone(), var.clone()
        assert_same(compiled(x, mean, var, w, b), f(x, m2, v2, w, b))
        assert_same((mean, var), (m2, v2))


@torch.no_grad()
def test_batch_norm_result_layout_is_eagers(backend: str, device: torch.device) -> None:
    def f(x, mean, var):
        return F.batch_norm(x, mean, var, training=True)

    compiled = minicompile.compile(f, backend=backend)
    for x in (torch.randn(2, 3, 4, 5, device=device).to(memory_format=torch.channels_last),
              torch.randn(5, 3, 2, device=device).transpose(0, 2),
              torch.randn(3, 4, device=device).t()):
        mean, var = torch.zeros(x.shape[1], device=device), torch.ones(x.shape[1], device=device)
        got, want = compiled(x, mean.clone(), var.clone()), f(x, mean, var)
        assert_same(got, want)
        assert got.stride() == want.stride(), (got.stride(), want.stride())


@torch.no_grad()
def test_batch_norm_training_then_eval(backend: str, device: torch.device) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6)).to(device)
    eager = copy.deepcopy(model)
    compiled = minicompile.compile(model, backend=backend)
    for train in (True, True, False, True):
        model.train(train)
        eager.train(train)
        x = torch.randn(5, 4, device=device)
        assert_same(compiled(x), eager(x))
        assert_same(model[1].running_var, eager[1].running_var)


@torch.no_grad()
@pytest.mark.parametrize("stats_dtype", [torch.float32, torch.bfloat16])
def test_batch_norm_in_bfloat16(stats_dtype, backend: str, device: torch.device) -> None:
    def f(x, mean, var, w, b):
        return F.batch_norm(x, mean, var, w, b, training=True)

    compiled = minicompile.compile(f, backend=backend, fullgraph=True)
    for _ in range(2):
        x = torch.randn(4, 3, 3, device=device, dtype=torch.bfloat16)
        params = [torch.randn(3, device=device, dtype=stats_dtype) for _ in range(4)]
        params[1] = params[1].abs() + 0.5
        copies = [p.clone() for p in params]
        assert_same(compiled(x, *params), f(x, *copies), **BF16)
        assert_same(params, copies, **BF16)


@torch.no_grad()
def test_cumulative_average_is_guarded(backend: str, device: torch.device) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.BatchNorm1d(3, momentum=None)).to(device).train()
    eager = copy.deepcopy(model)
    compiled = minicompile.compile(model, backend=backend)
    for momentum in (None, None, 0.5, None):
        model[0].momentum = eager[0].momentum = momentum
        x = torch.randn(4, 3, device=device)
        assert_same(compiled(x), eager(x))
        assert_same((model[0].running_mean, model[0].num_batches_tracked),
                    (eager[0].running_mean, eager[0].num_batches_tracked))


def test_batch_norm_one_value_per_channel_runs_eagerly() -> None:
    bn = nn.BatchNorm1d(3).train()
    compiled = minicompile.compile(bn, backend="cpp")
    with torch.no_grad(), pytest.raises(ValueError, match="more than 1 value per channel"):
        compiled(torch.randn(1, 3))


# -- dropout -------------------------------------------------------------------------------


class DropNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.drop = nn.Dropout(0.3)
        self.drop2 = nn.Dropout(0.5, inplace=True)

    def forward(self, x):
        h = self.drop(torch.relu(self.lin(x)))
        return self.drop2(h * 2) + F.dropout(x, 0.2, self.training)


def test_dropout_module_draws_eagers_masks(backend: str, device: torch.device) -> None:
    torch.manual_seed(0)
    model = DropNet().to(device).train()
    compiled = minicompile.compile(model, backend=backend, fullgraph=True)
    with torch.no_grad():
        for seed in (1, 2):
            x = torch.randn(4, 8, device=device)
            torch.manual_seed(seed)
            got, after = compiled(x), torch.rand(3, device=device)
            torch.manual_seed(seed)
            want, after_eager = model(x), torch.rand(3, device=device)
            assert torch.equal(got == 0, want == 0)
            assert_same(got, want)
            assert torch.equal(after, after_eager)  # the generator advanced as in eager


@torch.no_grad()
def test_random_calls_are_never_merged_dropped_or_reordered(backend: str,
                                                            device: torch.device) -> None:
    def f(x):
        a = F.dropout(x, 0.5)
        b = F.dropout(x, 0.5)  # same arguments, another mask
        F.dropout(x, 0.5)  # unused: still draws
        c = F.dropout2d(x.sin().unsqueeze(0), 0.5)[0]
        d = F.alpha_dropout(x, 0.2, True)
        e = torch.dropout(x, 0.4, True)
        return c, a, b, d * 2, e

    compiled = minicompile.compile(f, backend=backend, fullgraph=True)
    for seed in (3, 4):
        x = torch.randn(2, 4, 6, device=device)
        torch.manual_seed(seed)
        got = compiled(x)
        torch.manual_seed(seed)
        want = f(x)
        for g, w in zip(got, want):
            assert torch.equal(g == 0, w == 0)
        assert_same(got, want)
        assert not torch.equal(got[1], got[2])


@torch.no_grad()
def test_dropout_identity_cases_and_probability_one(backend: str, device: torch.device) -> None:
    def f(x):
        return (F.dropout(x, 0.0), F.dropout(x, 0.5, training=False), F.dropout(x, 1.0),
                F.alpha_dropout(x, 0.5))  # alpha dropout: training=False by default

    compiled = minicompile.compile(f, backend=backend, fullgraph=True)
    for _ in range(2):
        x = torch.randn(3, 5, device=device)
        a, b, c, d = compiled(x)
        assert torch.equal(a, x) and torch.equal(b, x) and torch.equal(d, x)
        assert torch.equal(c, torch.zeros_like(x))
    assert "dropout(" not in str(minicompile.explain(lambda x: F.dropout(x, 0.0))(x))


@torch.no_grad()
def test_dropout_in_place_forms(backend: str, device: torch.device) -> None:
    def f(x, y):
        F.dropout(x, 0.5, True, True)
        F.dropout(y, p=0.25, inplace=True)
        return x + y

    compiled = minicompile.compile(f, backend=backend, fullgraph=True)
    for seed in (5, 6):
        x, y = torch.randn(4, 4, device=device), torch.randn(4, 4, device=device)
        x2, y2 = x.clone(), y.clone()
        torch.manual_seed(seed)
        got = compiled(x, y)
        torch.manual_seed(seed)
        want = f(x2, y2)
        assert_same((got, x, y), (want, x2, y2))


@torch.no_grad()
def test_dropout_statistics() -> None:
    compiled = minicompile.compile(lambda x: F.dropout(x, 0.3), backend="cpp")
    x = torch.rand(200, 100) + 1.0
    for _ in range(2):
        y = compiled(x)
        zeroed = (y == 0).float().mean().item()
        assert abs(zeroed - 0.3) < 0.02
        kept = y != 0
        torch.testing.assert_close(y[kept], x[kept] / 0.7)


# -- autocast ------------------------------------------------------------------------------


def autocast_program(x, w, b, img, kernel):
    with torch.autocast(x.device.type, dtype=torch.bfloat16):
        y = F.linear(x, w, b)  # lower precision on every device
        z = torch.softmax(y, -1) + y  # CPU: bf16 softmax; CUDA: float32
        loss = F.mse_loss(y, z.float())
        conv = F.conv2d(img, kernel)
        mixed = torch.cat([y, x])  # promotes
        with torch.autocast(x.device.type, enabled=False):
            plain = x @ w.t()  # float32
            inner = torch.is_autocast_enabled(x.device.type)
        prod = torch.bmm(x.unsqueeze(0), w.t().unsqueeze(0)).exp()
        outer = (torch.is_autocast_enabled(x.device.type),
                 torch.get_autocast_dtype(x.device.type))
    return y, z, loss, F.layer_norm(conv, conv.shape[-2:]), mixed, plain, prod, inner, outer


def autocast_inputs(device):
    return (torch.randn(4, 8, device=device), torch.randn(8, 8, device=device),
            torch.randn(8, device=device), torch.randn(1, 2, 5, 5, device=device),
            torch.randn(3, 2, 3, 3, device=device))


@torch.no_grad()
def test_autocast_region_casts_as_eager(backend: str, device: torch.device) -> None:
    compiled = minicompile.compile(autocast_program, backend=backend, fullgraph=True)
    for _ in range(2):
        args = autocast_inputs(device)
        assert_same(compiled(*args), autocast_program(*args), **BF16)
    graph = str(minicompile.explain(autocast_program)(*autocast_inputs(device)))
    assert "to_dtype" in graph
    stats = minicompile.stats()
    assert stats["graph_breaks"] == 0 and stats["eager_fallbacks"] == 0, stats


@torch.no_grad()
def test_autocast_state_at_entry_is_guarded(backend: str, device: torch.device) -> None:
    def f(x, w):
        return (x @ w).relu() + 1, torch.log_softmax(x, -1), x.sum()

    compiled = minicompile.compile(f, backend=backend, fullgraph=True)
    for on in (False, True, True, False):
        x, w = torch.randn(3, 6, device=device), torch.randn(6, 6, device=device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=on):
            assert_same(compiled(x, w), f(x, w), **BF16)
    assert minicompile.stats()["recompiles"] == 1


@torch.no_grad()
def test_autocast_decorator_and_other_spellings(backend: str, device: torch.device) -> None:
    @torch.autocast(device.type, dtype=torch.bfloat16)
    def project(x, w):
        return x @ w

    def f(x, w):
        with torch.amp.autocast(device_type=device.type, dtype=torch.bfloat16):
            a = torch.mm(x, w)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            with torch.autocast(device.type):  # the dtype of the region around it
                b = x @ w
        return project(x, w) + 1, a, b

    compiled = minicompile.compile(f, backend=backend, fullgraph=True)
    for _ in range(2):
        x, w = torch.randn(3, 4, device=device), torch.randn(4, 4, device=device)
        assert_same(compiled(x, w), f(x, w), **BF16)
    if device.type == "cpu":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # deprecated spelling

            def g(x, w):
                with torch.cpu.amp.autocast():
                    return x @ w

            x, w = torch.randn(3, 4), torch.randn(4, 4)
            assert_same(minicompile.compile(g, backend=backend, fullgraph=True)(x, w), g(x, w),
                        **BF16)


@torch.no_grad()
def test_training_modules_inside_autocast(backend: str, device: torch.device) -> None:
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(2, 4, 3)
            self.bn = nn.BatchNorm2d(4)
            self.drop = nn.Dropout(0.25)

        def forward(self, x):
            with torch.autocast(x.device.type, dtype=torch.bfloat16):
                return self.drop(self.bn(self.conv(x)).relu()).flatten(1).sum(-1)

    torch.manual_seed(0)
    model = Net().to(device).train()
    eager = copy.deepcopy(model)
    compiled = minicompile.compile(model, backend=backend, fullgraph=True)
    for seed in (7, 8):
        x = torch.randn(2, 2, 5, 5, device=device)
        torch.manual_seed(seed)
        got = compiled(x)
        torch.manual_seed(seed)
        assert_same(got, eager(x), rtol=5e-2, atol=5e-2)
        assert_same(model.bn.running_mean, eager.bn.running_mean, **BF16)


def _policy(device_type: str, fn, *metas, dtype=torch.float16):
    graph = Graph()
    args = tuple(TensorVar(graph.placeholder(f"a{k}", m)) if isinstance(m, TensorMeta) else m
                 for k, m in enumerate(metas))
    out = types.SimpleNamespace(graph=types.SimpleNamespace(shapes=None))
    return autocast._ask(out, fn, device_type, dtype, args, {})


def _meta(dtype, shape=(2, 2), device="cuda"):
    meta = TensorMeta.of(torch.empty(shape, dtype=dtype, device="meta"))
    return meta.__class__(**{**meta.__dict__, "device": torch.device(device)})


def test_cuda_policy_is_asked_of_pytorch_on_fake_tensors() -> None:
    """The CUDA lists, answered without a GPU: fake CUDA tensors carry autocast's keys."""
    f16, f32 = torch.float16, torch.float32
    assert _policy("cuda", torch.mm, _meta(f32), _meta(f32)) == ((f16, f16), (f16,))
    assert _policy("cuda", torch.exp, _meta(f16)) == ((f32,), (f32,))  # fp32 list on CUDA
    assert _policy("cuda", torch.sum, _meta(f16)) == ((f32,), (f32,))  # fp32 dtype= ops
    assert _policy("cuda", operator.add, _meta(f16), _meta(f32)) == ((None, None), (f32,))
    assert _policy("cuda", torch.mm, _meta(torch.float64), _meta(torch.float64))[1] == (
        torch.float64,)  # float64 is left alone
    assert _policy("cpu", torch.exp, _meta(f16, device="cpu"), dtype=torch.bfloat16) == (
        (None,), (f16,))  # not on CPU's lists
    with pytest.raises(minicompile.Unsupported, match="not a cast of its inputs"):
        _policy("cuda", lambda a, b: torch.mm(a, b).exp(), _meta(f32), _meta(f32))
