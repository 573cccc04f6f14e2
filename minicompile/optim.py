"""Compiled optimizer steps: ``minicompile.compile(opt.step)`` for SGD, Adam and AdamW.

``torch.optim``'s own ``step`` is not traced (profiler ranges, hooks, lazy state, ``.item()``
on ``state["step"]``, ``lr`` as a baked-in float).  Instead the bound ``step`` is recognised
and an update written below in torch ops (PyTorch's single-tensor formulas, in place) goes
through the ordinary pipeline.  Every scalar eager computes in Python is computed on the
host in double and put in one small table the kernels read, so changing a hyperparameter
never recompiles.  What :func:`unsupported` names (hooks, ``differentiable``/``capturable``/
``fused`` groups, tensor hyperparameters, grad scalers...) runs eagerly, the reason logged.
"""

from __future__ import annotations

import dataclasses
import logging
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.optim import SGD, Adam, AdamW, Optimizer

from minicompile import trace
from minicompile.config import Config
from minicompile.errors import Unsupported

log = logging.getLogger("minicompile")

SUPPORTED = (SGD, Adam, AdamW)
DTYPES = (torch.float32, torch.float64)


def recognise(fn: Any) -> Optimizer | None:
    """The optimizer whose unmodified ``step`` ``fn`` is: a bound ``opt.step``, or the
    wrapper an LR scheduler puts on ``opt.step`` (it holds the optimizer by weak
    reference).  None for anything else (compiled as an ordinary function)."""
    opt = getattr(fn, "__self__", None)
    if isinstance(opt, Optimizer):
        func = getattr(fn, "__func__", None)
    elif getattr(fn, "_wrapped_by_lr_sched", False):
        refs = [c.cell_contents for c in fn.__closure__ or () if _is_ref(c)]
        opt = refs[0]() if refs else None
        func = getattr(fn, "__wrapped__", None)
    else:
        return None
    if type(opt) not in SUPPORTED or func is not type(opt).step:
        return None
    return opt


def _is_ref(cell: Any) -> bool:
    try:
        return isinstance(cell.cell_contents, weakref.ref)
    except ValueError:  # an empty cell
        return False


# -- the updates (traced by capture) ----------------------------------------------------------
# Scalar table rows: SGD [weight_decay, momentum, 1 - dampening, -lr];
# Adam [weight_decay or 1 - lr * wd, 1 - beta1, beta2, 1 - beta2, sqrt(bc2), eps, -lr / bc1].
# flags[i]: SGD (maximize, weight decay on, momentum on, nesterov);
# Adam (maximize, "none" | "coupled" | "decoupled" weight decay, amsgrad, lerp weight < 0.5).


def sgd_update(params: list, grads: list, bufs: list, scalars: torch.Tensor,
               flags: tuple) -> None:
    """torch.optim.sgd._single_tensor_sgd, in place (bufs[i] is None without momentum)."""
    for i in range(len(params)):
        maximize, decay, momentum, nesterov = flags[i]
        s = scalars[i]
        p = params[i]
        g = -grads[i] if maximize else grads[i]
        if decay:
            g = g + s[0] * p  # grad.add(param, alpha=weight_decay)
        if momentum:
            buf = bufs[i]
            buf.mul_(s[1]).add_(s[2] * g)  # buf.mul_(momentum).add_(grad, alpha=1 - damp)
            g = g + s[1] * buf if nesterov else buf  # grad.add(buf, alpha=momentum)
        p.add_(s[3] * g)  # param.add_(grad, alpha=-lr)


def adam_update(params: list, grads: list, exp_avgs: list, exp_avg_sqs: list,
                max_exp_avg_sqs: list, scalars: torch.Tensor, flags: tuple) -> None:
    """torch.optim.adam._single_tensor_adam (capturable=False), in place
    (max_exp_avg_sqs[i] is None without amsgrad)."""
    for i in range(len(params)):
        maximize, decay, amsgrad, small_weight = flags[i]
        s = scalars[i]
        p, m, v = params[i], exp_avgs[i], exp_avg_sqs[i]
        g = -grads[i] if maximize else grads[i]
        if decay == "decoupled":
            p.mul_(s[0])  # param.mul_(1 - lr * weight_decay)
        elif decay == "coupled":
            g = g + s[0] * p  # grad.add(param, alpha=weight_decay)
        if small_weight:  # exp_avg.lerp_(grad, 1 - beta1), ATen's two-sided formula
            m.add_(s[1] * (g - m))
        else:
            m.copy_(g - (g - m) * (1 - s[1]))
        v.mul_(s[2]).add_(s[3] * g * g)  # mul_(beta2).addcmul_(g, g, value=1 - beta2)
        if amsgrad:
            vmax = max_exp_avg_sqs[i]
            vmax.copy_(torch.maximum(vmax, v))
            v = vmax
        denom = torch.sqrt(v) / s[4] + s[5]  # (v.sqrt() / bias_correction2_sqrt).add_(eps)
        p.add_(s[6] * m / denom)  # param.addcdiv_(m, denom, value=-step_size)


# -- per-step planning (on the host, as eager computes it) ----------------------------------


def unsupported(opt: Optimizer) -> str | None:
    """Why this step must run eagerly, or None."""
    if getattr(opt, "grad_scale", None) is not None or getattr(opt, "found_inf", None) is not None:
        return "a gradient scaler's grad_scale/found_inf is set"
    from torch.optim import optimizer as optimizer_module

    hooks = (opt._optimizer_step_pre_hooks, opt._optimizer_step_post_hooks,
             optimizer_module._global_optimizer_pre_hooks,
             optimizer_module._global_optimizer_post_hooks)
    if any(hooks):
        return "optimizer step hooks are registered"
    devices, dtypes = set(), set()
    for group in opt.param_groups:
        for key in ("differentiable", "capturable", "fused"):
            if group.get(key):
                return f"{key}=True is not compiled"
        for key, value in group.items():
            if key != "params" and (torch.is_tensor(value) or (
                    isinstance(value, tuple) and any(torch.is_tensor(v) for v in value))):
                return f"tensor hyperparameter {key!r} is not compiled"
        for p in (p for p in group["params"] if p.grad is not None):
            if p.grad.is_sparse or p.is_complex():
                return "sparse gradients and complex parameters are not compiled"
            if p.grad.dtype != p.dtype or p.grad.layout != torch.strided:
                return "a gradient of another dtype or layout than its parameter"
            devices.add(p.device)
            dtypes.add(p.dtype)
    if len(devices) > 1 or len(dtypes) > 1:
        return "parameters on several devices or of several dtypes"
    if dtypes and not dtypes <= set(DTYPES):
        return f"parameters of dtype {dtypes.pop()} (float32 and float64 are compiled)"
    return None


def _stepped(opt: Optimizer) -> Iterator[tuple[dict, torch.Tensor]]:
    """(group, parameter) for each parameter with a gradient, in eager's order."""
    for group in opt.param_groups:
        for p in group["params"]:
            if p.grad is not None:
                yield group, p


def needs_state(opt: Optimizer) -> bool:
    """Whether eager's step would create state (lazily): that step then runs eagerly."""
    key = "momentum_buffer" if isinstance(opt, SGD) else "exp_avg"
    return any(opt.state[p].get(key) is None for group, p in _stepped(opt)
               if not (isinstance(opt, SGD) and group["momentum"] == 0))  # plain SGD: no state


def create_adam_state(opt: Adam) -> None:
    """The state Adam's first step creates for each parameter with a gradient, as
    ``Adam._init_group`` makes it: a CPU step counter at 0 and zeroed moments (the update
    from zero state is the ordinary one, so that step is compiled too)."""
    scalar = torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32
    for group, p in _stepped(opt):
        state = opt.state[p]
        if len(state) != 0:
            continue
        state["step"] = torch.tensor(0.0, dtype=scalar, device="cpu")
        moments = ("exp_avg", "exp_avg_sq") + (("max_exp_avg_sq",) if group["amsgrad"] else ())
        for key in moments:
            state[key] = torch.zeros_like(p, memory_format=torch.preserve_format)


def plan_sgd(opt: SGD, table: ScalarTable) -> tuple:
    """sgd_update's arguments for this step."""
    params, grads, bufs, rows, flags = [], [], [], [], []
    for group, p in _stepped(opt):
        wd, momentum, damp = group["weight_decay"], group["momentum"], group["dampening"]
        params.append(p)
        grads.append(p.grad)
        bufs.append(opt.state[p]["momentum_buffer"] if momentum != 0 else None)
        rows.append([wd, momentum, 1 - damp, -group["lr"]])
        flags.append((group["maximize"], wd != 0, momentum != 0, group["nesterov"]))
    scalars = table(rows, params)
    return params, grads, bufs, scalars, tuple(flags)


def plan_adam(opt: Adam, table: ScalarTable) -> tuple:
    """adam_update's arguments for this step (the step counters are incremented)."""
    params, grads, ms, vs, vmaxes, steps, group_of = [], [], [], [], [], [], []
    for group, p in _stepped(opt):
        state = opt.state[p]
        params.append(p)
        grads.append(p.grad)
        ms.append(state["exp_avg"])
        vs.append(state["exp_avg_sq"])
        vmaxes.append(state["max_exp_avg_sq"] if group["amsgrad"] else None)
        steps.append(state["step"])
        group_of.append(group)
    if steps:
        torch._foreach_add_(steps, 1)  # step_t += 1 (CPU tensors: capturable is off)
    rows, flags = [], []
    made: dict[tuple[int, float], tuple[list[float], tuple]] = {}  # one per group and step
    values = torch.stack(steps).tolist() if steps else []  # _get_value(step_t), each
    for group, step in zip(group_of, values):
        if (id(group), step) not in made:
            lr, wd, eps = group["lr"], group["weight_decay"], group["eps"]
            beta1, beta2 = group["betas"]
            bias_correction1 = 1 - beta1**step
            bias_correction2 = 1 - beta2**step
            step_size = lr / bias_correction1
            decoupled = group.get("decoupled_weight_decay", isinstance(opt, AdamW))
            decay = "none" if wd == 0 else ("decoupled" if decoupled else "coupled")
            row = [1 - lr * wd if decay == "decoupled" else wd, 1 - beta1, beta2, 1 - beta2,
                   bias_correction2**0.5, eps, -step_size]
            made[id(group), step] = row, (group["maximize"], decay, group["amsgrad"],
                                          abs(1 - beta1) < 0.5)
        row, flag = made[id(group), step]
        rows.append(row)
        flags.append(flag)
    scalars = table(rows, params)
    return params, grads, ms, vs, vmaxes, scalars, tuple(flags)


class ScalarTable:
    """The per-parameter scalars in the parameters' dtype (as eager rounds a Python scalar),
    on their device.  A CUDA table is copied from two pinned buffers that take turns, each
    refilled once the copy out of it (an event) is done: pinning new memory each step would
    synchronize whenever the host runs a step ahead of the GPU, as it should."""

    def __init__(self) -> None:
        self.pinned: list[torch.Tensor] = []
        self.copied: list[Any] = [None, None]  # the event after each buffer's last copy
        self.turn = 0

    def __call__(self, rows: list[list[float]], params: list[torch.Tensor]) -> torch.Tensor:
        if not params:
            return torch.zeros((0, 0))
        values = torch.tensor(rows, dtype=params[0].dtype)
        device = params[0].device
        if device.type != "cuda":
            return values.to(device)
        if not self.pinned or self.pinned[0].shape != values.shape or (
                self.pinned[0].dtype != values.dtype):
            self.pinned = [torch.empty_like(values).pin_memory() for _ in range(2)]
            self.copied = [None, None]
        k, self.turn = self.turn, 1 - self.turn
        if self.copied[k] is not None:
            self.copied[k].synchronize()  # the copy of two steps ago: long done
        self.pinned[k].copy_(values)
        table = torch.empty(values.shape, dtype=values.dtype, device=device)
        table.copy_(self.pinned[k], non_blocking=True)
        self.copied[k] = torch.cuda.Event()
        self.copied[k].record()
        return table


class CompiledStep:
    """``minicompile.compile(opt.step)``: call it as ``opt.step`` is called.  The update is
    compiled by ``compile_function(update, cfg)`` (a CompiledFunction) with combo kernels,
    in-place stores and static sizes: another set of parameters is another structure, not a
    size."""

    def __init__(self, fn: Callable, opt: Optimizer, cfg: Config,
                 compile_function: Callable[[Callable, Config], Any],
                 stats: dict[str, int]) -> None:
        self.fn = fn  # what eager runs: the bound step, or the scheduler's wrapper of it
        self.opt = opt
        self.stats = stats
        self.fullgraph = cfg.fullgraph  # raise for what is not compiled (state-making steps run)
        update_cfg = dataclasses.replace(cfg, dynamic=False, horizontal_fusion=True,
                                         store_in_place=True)
        update = sgd_update if isinstance(opt, SGD) else adam_update
        self.compiled = compile_function(update, update_cfg)
        self.eager_reason: str | None = None  # why the last step ran eagerly
        self.table = ScalarTable()

    def __call__(self, closure: Callable | None = None) -> Any:
        opt = self.opt
        reason = self.unsupported()
        if reason is not None:
            return self.eager(reason, closure)
        loss = None
        if closure is not None:  # as eager: the closure first, then the update
            with torch.enable_grad():
                loss = closure()
            reason = self.unsupported()  # the gradients it made
        if reason is None and not isinstance(opt, SGD):
            with torch.no_grad():
                create_adam_state(opt)
        if reason is None and needs_state(opt):
            reason = "this step creates momentum buffers (eager's first step copies the gradient)"
        if reason is not None:
            self.eager(reason, None)
            return loss
        self.eager_reason = None
        opt._opt_called = True  # what an LR scheduler's wrapper of opt.step records
        with torch.no_grad():
            plan = plan_sgd if isinstance(opt, SGD) else plan_adam
            args = plan(opt, self.table)  # type: ignore[arg-type]
            if args[0]:  # some parameter has a gradient
                self.compiled(*args)
        return loss

    def unsupported(self) -> str | None:
        reason = unsupported(self.opt)
        if reason is not None and self.fullgraph:
            raise Unsupported(f"{type(self.opt).__name__}.step: {reason}")
        return reason

    def eager(self, reason: str, closure: Callable | None) -> Any:
        if reason != self.eager_reason:
            name = type(self.opt).__name__
            trace.emit("graph_breaks", f"{name}.step", f"running {name}.step eagerly: {reason}")
            log.info("minicompile: running %s.step eagerly: %s", name, reason)
        self.eager_reason = reason
        self.stats["eager_fallbacks"] += 1
        opt = self.opt
        opt._opt_called = True
        return self.fn(closure) if closure is not None else self.fn()

    def __repr__(self) -> str:
        return f"<minicompile.CompiledStep {type(self.opt).__name__}.step>"
