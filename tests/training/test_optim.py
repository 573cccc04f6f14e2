"""``minicompile.compile(opt.step)``: SGD, Adam and AdamW steps compiled into combo
kernels, compared with eager ``opt.step()`` on a deep copy of the model over 20 steps
(parameters and every state tensor, keys, dtypes and devices), with structure checks."""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

import minicompile

STEPS = 20
TOL = {"rtol": 1e-6, "atol": 1e-6}

CONFIGS: dict[str, Callable] = {
    "sgd": lambda ps: torch.optim.SGD(ps, lr=0.1),
    "sgd_momentum": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
    "sgd_nesterov_wd": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, nesterov=True,
                                                  weight_decay=0.01),
    "sgd_dampening_maximize": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.8,
                                                         dampening=0.3, maximize=True),
    "adam": lambda ps: torch.optim.Adam(ps, lr=1e-2),
    "adam_wd": lambda ps: torch.optim.Adam(ps, lr=1e-2, weight_decay=0.1),
    "adam_maximize_amsgrad": lambda ps: torch.optim.Adam(ps, lr=1e-2, maximize=True,
                                                         amsgrad=True),
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=1e-2),
    "adamw_amsgrad_small_beta1": lambda ps: torch.optim.AdamW(ps, lr=1e-2, betas=(0.3, 0.99),
                                                              amsgrad=True, weight_decay=0.05),
}


def make_model(device: torch.device, frozen: bool = False) -> torch.nn.Module:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 16), torch.nn.ReLU(),
        torch.nn.Linear(16, 3),
    ).to(device)
    if frozen:
        model[2].requires_grad_(False)
    return model


def backward(model: torch.nn.Module, k: int, device: torch.device) -> None:
    g = torch.Generator().manual_seed(k)
    x, y = torch.randn(5, 6, generator=g), torch.randint(0, 3, (5,), generator=g)
    F.cross_entropy(model(x.to(device)), y.to(device)).backward()


def assert_same(model: torch.nn.Module, ref: torch.nn.Module, opt, ref_opt) -> None:
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, **TOL)
    for p, q in zip(model.parameters(), ref.parameters()):
        state, ref_state = opt.state.get(p, {}), ref_opt.state.get(q, {})
        assert state.keys() == ref_state.keys()
        for key, value in ref_state.items():
            got = state[key]
            assert (got.dtype, got.device, got.shape) == (value.dtype, value.device, value.shape)
            torch.testing.assert_close(got, value, **TOL)


def train(model, ref, opt, ref_opt, step, device, steps=STEPS, hook=None) -> None:
    for k in range(steps):
        for m in (model, ref):
            backward(m, k, device)
        if hook is not None:
            hook(k)
        step()
        ref_opt.step()
        opt.zero_grad()
        ref_opt.zero_grad()


@pytest.mark.parametrize("name", CONFIGS)
def test_matches_eager(name: str, backend: str, device: torch.device) -> None:
    model = make_model(device)
    ref = copy.deepcopy(model)
    opt, ref_opt = CONFIGS[name](model.parameters()), CONFIGS[name](ref.parameters())
    step = minicompile.compile(opt.step, backend=backend)
    train(model, ref, opt, ref_opt, step, device)
    assert_same(model, ref, opt, ref_opt)
    stats = minicompile.stats()
    # One graph, one combo kernel for the 6 parameters, no recompile.  Adam's state is made
    # as eager makes it and its first step compiled; SGD's first momentum step (a copy of
    # the gradient) runs eagerly, and plain SGD has no state.
    assert stats["graphs"] == 1 and stats["kernels"] == 1, stats
    assert stats["recompiles"] == 0
    assert stats["eager_fallbacks"] == (1 if name.startswith("sgd_") else 0)


@pytest.mark.parametrize("scheduler", ["step_lr", "lambda_lr"])
@pytest.mark.parametrize("compile_first", [True, False], ids=["compile_first", "sched_first"])
def test_lr_scheduler_never_recompiles(scheduler: str, compile_first: bool, backend: str,
                                       device: torch.device) -> None:
    model = make_model(device)
    ref = copy.deepcopy(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)

    def make(o):
        if scheduler == "step_lr":
            return torch.optim.lr_scheduler.StepLR(o, step_size=3, gamma=0.5)
        return torch.optim.lr_scheduler.LambdaLR(o, lambda epoch: 1 / (1 + epoch))

    step = minicompile.compile(opt.step, backend=backend) if compile_first else None
    sched, ref_sched = make(opt), make(ref_opt)
    step = step or minicompile.compile(opt.step, backend=backend)  # the scheduler's wrapper
    for k in range(12):
        for m in (model, ref):
            backward(m, k, device)
        step()
        ref_opt.step()
        opt.zero_grad()
        ref_opt.zero_grad()
        sched.step()
        ref_sched.step()
    assert_same(model, ref, opt, ref_opt)
    assert opt.param_groups[0]["lr"] == ref_opt.param_groups[0]["lr"] != 1e-2
    stats = minicompile.stats()
    assert stats["graphs"] == 1 and stats["recompiles"] == 0, stats


def test_grad_none_frozen_and_param_groups(backend: str, device: torch.device) -> None:
    """Frozen parameters (never a gradient), a parameter whose gradient is None for some
    steps, and two groups with different hyperparameters."""
    model = make_model(device, frozen=True)
    ref = copy.deepcopy(model)

    def make(m):
        return torch.optim.Adam([
            {"params": m[0].parameters(), "lr": 1e-2, "weight_decay": 0.1},
            {"params": [*m[2].parameters(), *m[4].parameters()], "lr": 3e-3, "amsgrad": True},
        ])

    opt, ref_opt = make(model), make(ref)
    step = minicompile.compile(opt.step, backend=backend)

    def drop_bias_grad(k: int) -> None:
        if k % 4 == 3:
            model[4].bias.grad = None
            ref[4].bias.grad = None

    train(model, ref, opt, ref_opt, step, device, steps=12, hook=drop_bias_grad)
    assert_same(model, ref, opt, ref_opt)
    assert not opt.state[model[2].weight]  # frozen: no state, as eager
    # Two structures (with and without the bias's gradient), each compiled once.
    assert minicompile.stats()["graphs"] == 2


def test_state_dict_round_trip_and_eager_steps(backend: str, device: torch.device) -> None:
    """Compiled and eager steps interleave, and a checkpoint moves between them."""
    model = make_model(device)
    ref = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.05, momentum=0.9, nesterov=True)
    step = minicompile.compile(opt.step, backend=backend)
    train(model, ref, opt, ref_opt, step, device, steps=4)
    train(model, ref, opt, ref_opt, opt.step, device, steps=2)  # eager steps in between

    saved = copy.deepcopy(opt.state_dict())
    again = make_model(device)
    again.load_state_dict(model.state_dict())
    opt2 = torch.optim.SGD(again.parameters(), lr=0.05, momentum=0.9, nesterov=True)
    opt2.load_state_dict(saved)
    step2 = minicompile.compile(opt2.step, backend=backend)
    train(again, ref, opt2, ref_opt, step2, device, steps=4)
    assert_same(again, ref, opt2, ref_opt)
    assert minicompile.stats()["eager_fallbacks"] == 1  # only the first, state-making step
    torch.testing.assert_close(opt2.state_dict()["state"][0]["momentum_buffer"],
                               ref_opt.state_dict()["state"][0]["momentum_buffer"], **TOL)


def test_unsupported_options_run_eagerly(backend: str, device: torch.device) -> None:
    """Step hooks run with eager's step (the reason is kept); removing them compiles."""
    model = make_model(device)
    ref = copy.deepcopy(model)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    ref_opt = torch.optim.Adam(ref.parameters(), lr=1e-2)
    calls: list[int] = []
    handle = opt.register_step_post_hook(lambda *args: calls.append(1))
    step = minicompile.compile(opt.step, backend=backend)
    train(model, ref, opt, ref_opt, step, device, steps=3)
    assert calls == [1, 1, 1]
    assert "hooks" in step.eager_reason
    assert minicompile.stats()["graphs"] == 0
    handle.remove()
    train(model, ref, opt, ref_opt, step, device, steps=3)
    assert_same(model, ref, opt, ref_opt)
    assert minicompile.stats()["graphs"] == 1 and step.eager_reason is None


def test_fullgraph_raises_for_what_is_not_compiled() -> None:
    model = make_model(torch.device("cpu"))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    opt.register_step_pre_hook(lambda *args: None)
    step = minicompile.compile(opt.step, backend="cpp", fullgraph=True)
    backward(model, 0, torch.device("cpu"))
    with pytest.raises(minicompile.Unsupported, match="hooks"):
        step()


def test_many_parameters_are_a_few_kernels() -> None:
    """20 parameters of different shapes: combo kernels of at most 8 parts, one launch each."""
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(k + 1, 3)) for k in range(20)]
    ref = [torch.nn.Parameter(p.detach().clone()) for p in params]
    opt, ref_opt = torch.optim.SGD(params, lr=0.1), torch.optim.SGD(ref, lr=0.1)
    step = minicompile.compile(opt.step, backend="cpp")
    for k in range(3):
        for ps in (params, ref):
            for j, p in enumerate(ps):
                p.grad = torch.full_like(p, 0.01 * (j + k))
        step()
        ref_opt.step()
    for p, q in zip(params, ref):
        torch.testing.assert_close(p, q, **TOL)
    assert minicompile.stats()["kernels"] == 3  # 8 + 8 + 4 parts


def test_float64_and_closure() -> None:
    model = make_model(torch.device("cpu")).double()
    ref = copy.deepcopy(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2, weight_decay=0.1)
    step = minicompile.compile(opt.step, backend="cpp")
    x = torch.randn(5, 6, dtype=torch.float64)
    for _ in range(5):
        for m, o, s in ((model, opt, step), (ref, ref_opt, ref_opt.step)):
            def closure(m=m, o=o):
                o.zero_grad()
                loss = m(x).square().mean()
                loss.backward()
                return loss

            losses = s(closure)
        assert torch.is_tensor(losses)
    assert_same(model, ref, opt, ref_opt)
    assert opt.state[model[0].weight]["exp_avg"].dtype == torch.float64
    assert minicompile.stats()["graphs"] == 1


def test_other_callables_are_ordinary_functions() -> None:
    opt = torch.optim.SGD([torch.nn.Parameter(torch.ones(2))], lr=0.1)
    compiled = minicompile.compile(opt.zero_grad)
    assert not isinstance(compiled, minicompile.optim.CompiledStep)


def _mutating(x, y, w):
    x.mul_(0.5).add_(y)  # stored in place
    total = w.sum()  # w's kernel is a reduction: copied back instead
    w.add_(1.0)
    z = y * 2
    y.copy_(z)  # z is also returned: copied back
    return total, z


def test_in_place_stores_keep_eager_semantics(backend: str, device: torch.device) -> None:
    from minicompile import config

    args = [torch.randn(5, 3, device=device), torch.randn(5, 3, device=device),
            torch.randn(7, device=device)]
    expect = [a.clone() for a in args]
    want = _mutating(*expect)
    with config.patch(store_in_place=True):
        fn = minicompile.compile(_mutating, backend=backend)
    got = fn(*args)
    for a, b in zip([*args, *got], [*expect, *want]):
        torch.testing.assert_close(a, b)
    assert got[1] is not args[1]  # a tensor of its own, as eager's z
    assert minicompile.stats()["graphs"] == 1


def test_the_update_is_stored_in_place(capsys: pytest.CaptureFixture) -> None:
    """The generated code allocates nothing: every parameter and state tensor is written
    by the combo kernel directly (6 parameters, each with exp_avg and exp_avg_sq)."""
    from minicompile import config

    model = make_model(torch.device("cpu"))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    step = minicompile.compile(opt.step, backend="cpp")
    with config.patch(logs=frozenset({"output_code", "fusion"})):
        for k in range(2):
            backward(model, k, torch.device("cpu"))
            step()
    err = capsys.readouterr().err
    call = err[err.index("def call(args):"):]
    assert call.count("# stored in place") == 18
    assert "empty_strided_cpu(" not in call.split("return")[0]  # (CPU buffers)
    # The two biases of 16 share a kernel (vertical fusion); the rest combine with it.
    assert "5 independent pointwise groups" in err
    assert minicompile.stats()["kernels"] == 1
