"""A whole training step compiled as one function: forward and loss, ``loss.backward()``,
``opt.step()``, ``sched.step()`` and ``opt.zero_grad()`` inside it, as users write it for
``torch.compile``.  The backward and the optimizer calls are graph breaks; the forward
and its backward run compiled, and ``opt.step()`` runs the compiled update
(``minicompile.compile(opt.step)``'s).  Compared with the same loop run eagerly on a deep
copy: losses, parameters, optimizer state and learning rates, step after step."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

import minicompile
from minicompile import api

TOL = {"rtol": 1e-5, "atol": 1e-6}


def make(device: torch.device, opt_cls: type, **opt_kwargs: object) -> tuple:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(),
                                torch.nn.Linear(16, 4)).to(device)
    return model, opt_cls(model.parameters(), **opt_kwargs)


@pytest.mark.parametrize("opt_cls, opt_kwargs", [
    (torch.optim.AdamW, {"lr": 1e-2, "weight_decay": 0.1}),
    (torch.optim.SGD, {"lr": 0.1, "momentum": 0.9}),
], ids=["adamw", "sgd_momentum"])
def test_train_step_with_the_optimizer_inside(backend: str, device: torch.device,
                                              opt_cls: type, opt_kwargs: dict) -> None:
    minicompile.reset()
    model, opt = make(device, opt_cls, **opt_kwargs)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    ref_model = copy.deepcopy(model)
    ref_opt = opt_cls(ref_model.parameters(), **opt_kwargs)
    ref_sched = torch.optim.lr_scheduler.StepLR(ref_opt, step_size=2, gamma=0.5)

    def train_step(model, opt, sched, x, y):
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    compiled = minicompile.compile(train_step, backend=backend)
    for _ in range(6):
        x = torch.randn(5, 8, device=device)
        y = torch.randint(0, 4, (5,), device=device)
        got = compiled(model, opt, sched, x, y)
        want = train_step(ref_model, ref_opt, ref_sched, x, y)
        torch.testing.assert_close(got, want, **TOL)
        for p, q in zip(model.parameters(), ref_model.parameters()):
            torch.testing.assert_close(p, q, **TOL)
            assert p.grad is None and q.grad is None
        assert opt.param_groups[0]["lr"] == ref_opt.param_groups[0]["lr"]
        for p, q in zip(model.parameters(), ref_model.parameters()):
            for key, value in ref_opt.state[q].items():
                torch.testing.assert_close(opt.state[p][key], value, **TOL)
    stats = minicompile.stats()
    # SGD's first momentum step makes its buffers eagerly (README: the optimizer step)
    assert stats["eager_fallbacks"] == (opt_cls is torch.optim.SGD), stats
    (steps,) = api._compiled_steps[opt].values()  # opt.step() ran the compiled update
    assert steps.compiled.entries and stats["kernels"] > 0
