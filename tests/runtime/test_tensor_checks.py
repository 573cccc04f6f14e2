"""The metadata checks of a module's tensors in one C++ call (minicompile/runtime/
tensor_checks.py): the guard function answers exactly as the checks run one by one in
Python, whatever is changed about a parameter or buffer, and a miss still names the check
that failed."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

import minicompile
from minicompile import config
from minicompile.capture import capture_frame, frame_args
from minicompile.runtime.guard_render import render
from minicompile.runtime.tensor_checks import TENSOR_CHECKS


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(8, 8)
        self.b = torch.nn.Linear(8, 8)
        self.norm = torch.nn.BatchNorm1d(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.b(torch.relu(self.a(x))))


def _param(t: torch.Tensor, grad: bool = True) -> torch.nn.Parameter:
    return torch.nn.Parameter(t, requires_grad=grad)


def _inference_tensor() -> torch.Tensor:
    with torch.inference_mode():
        return torch.zeros(8)


# (what changes, module, parameter or buffer, its new value (or the module whose weight
# it becomes), the failure or None).
CHANGES: list[tuple[str, str, str, Callable[[], object] | str, str | None]] = [
    ("another object", "a", "weight", lambda: _param(torch.randn(8, 8)), None),
    ("dtype", "a", "weight", lambda: _param(torch.randn(8, 8, dtype=torch.float64)),
     ("L['self']._modules['a']._parameters['weight'] dtype: expected torch.float32, got "
      "torch.float64")),
    ("size", "b", "bias", lambda: _param(torch.randn(9)),
     "L['self']._modules['b']._parameters['bias'] size mismatch at index 0: expected 8, got 9"),
    ("rank", "b", "bias", lambda: _param(torch.randn(8, 1)),
     "L['self']._modules['b']._parameters['bias'] sizes: expected (8,), got (8, 1)"),
    ("stride", "b", "weight", lambda: _param(torch.randn(8, 8).t()),
     ("L['self']._modules['b']._parameters['weight'] stride mismatch at index 0: expected 8, "
      "got 1")),
    ("device", "a", "bias", lambda: _param(torch.randn(8, device="meta")),
     "L['self']._modules['a']._parameters['bias'] device: expected cpu, got meta"),
    ("requires_grad", "a", "weight", lambda: _param(torch.randn(8, 8), grad=False),
     "L['self']._modules['a']._parameters['weight'] requires_grad: expected True, got False"),
    ("type", "a", "weight", lambda: torch.randn(8, 8, requires_grad=True),
     ("L['self']._modules['a']._parameters['weight'] type: expected torch.nn.parameter."
      "Parameter, got torch.Tensor")),
    ("buffer dtype", "norm", "running_var", lambda: torch.ones(8, dtype=torch.float16),
     ("L['self']._modules['norm']._buffers['running_var'] dtype: expected torch.float32, got "
      "torch.float16")),
    ("buffer missing", "norm", "running_mean", lambda: None,
     ("L['self']._modules['norm']._buffers['running_mean'] type: expected torch.Tensor, got "
      "NoneType")),
    # Stricter in C++ (a tensor twice; other dispatch keys): the Python checks decide.
    ("tied weights", "b", "weight", "a", None),
    ("inference tensor", "norm", "running_mean", _inference_tensor, None),
]


def _captured() -> tuple[Net, tuple, object]:
    torch.manual_seed(0)
    net = Net().eval()
    frame = frame_args(Net.forward, (net, torch.randn(4, 8)), {})
    with torch.no_grad():
        cap = capture_frame(Net.forward, frame)
    return net, frame, cap.guards


def _all_python(guards) -> Callable:  # noqa: ANN001
    """The same checks, one Python comparison each, as they ran before."""
    scope = dict(guards.namespace)
    exec(render(guards.params, guards.checks), scope)
    return scope["check"]


@pytest.mark.parametrize("change", CHANGES, ids=[c[0] for c in CHANGES])
def test_fast_path_agrees_with_python_checks(change) -> None:  # noqa: ANN001
    what, module, name, make, reason = change
    net, frame, guards = _captured()
    python = _all_python(guards)
    holder = getattr(net, module)
    table = holder._parameters if name in holder._parameters else holder._buffers
    old = table[name]
    with torch.no_grad():
        assert guards.check(*frame) and guards.check(*frame)  # (the second in C++)
        table[name] = getattr(net, make).weight if isinstance(make, str) else make()
        for x in (torch.randn(4, 8), torch.randn(4, 8)):  # the second after a first answer
            fr = (net, x)
            assert guards.check(*fr) is python(*fr) is (reason is None), what
            assert guards.explain_failure(*fr) == reason
        table[name] = old
        assert guards.check(*frame) and python(*frame)


def test_tensor_checks_run_in_one_cpp_call() -> None:
    """After a pass, a call with the same tensors never runs the Python tensor checks; a
    changed one falls back to them, which say no."""
    net, frame, guards = _captured()
    tensors = guards.namespace[TENSOR_CHECKS]
    assert len(tensors.paths) == 8 and "L_x" not in tensors.paths  # the input stays in Python
    assert f"{TENSOR_CHECKS}(" in guards.source and "def check_tensors(t0," in guards.source
    slow_calls = []
    slow = tensors.slow
    tensors.slow = lambda *ts: slow_calls.append(1) or slow(*ts)
    with torch.no_grad():
        assert guards.check(*frame) and len(slow_calls) == 1  # builds the C++ check
        for _ in range(3):
            assert guards.check(net, torch.randn(4, 8))
        assert len(slow_calls) == 1
        net.b.bias.requires_grad_(False)
        assert not guards.check(*frame) and len(slow_calls) == 2


def test_changed_parameter_recompiles_with_its_reason(backend, device, capsys) -> None:  # noqa: ANN001
    torch.manual_seed(0)
    net = Net().eval().to(device)
    compiled = minicompile.compile(net, backend=backend)
    with torch.no_grad(), config.patch(logs=frozenset({"recompiles"})):
        for _ in range(2):
            x = torch.randn(4, 8, device=device)
            torch.testing.assert_close(compiled(x), net(x))
        net.a.weight.requires_grad_(False)
        for _ in range(2):
            x = torch.randn(4, 8, device=device)
            torch.testing.assert_close(compiled(x), net(x))
    assert minicompile.stats()["recompiles"] == 1
    assert ("entry 0: L['self']._modules['a']._parameters['weight'] requires_grad: expected "
            "True, got False") in capsys.readouterr().err
