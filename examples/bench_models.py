"""The library models of the test suite (examples/model_zoo.py: torchvision, timm and
transformers, tiny random-init configs) compiled whole, side by side with eager and
torch.compile: graphs, graph breaks, kernels, the cold first call and the median call.

    python examples/bench_models.py            # every model; float32 (and bfloat16 on CUDA)
    python examples/bench_models.py hf_bert    # some of them
    python examples/bench_models.py --eval-only   # (or --train-only; --float32: no bfloat16)

On CUDA each minicompile figure comes with its host time (until the call returns) and its
GPU's busy time per call, and which of the two bounds it.

"Cold" is the first call of a fresh process-wide cache directory: capture, passes, code
generation and every kernel built.  Eval rows run the model under no_grad; train rows run
the forward, a loss and the backward (dropout off, so that the step is compared with
eager's).
"""

import os
import sys
import tempfile
import time

os.environ.setdefault("MINICOMPILE_CACHE_DIR", tempfile.mkdtemp(prefix="bench-models-"))

import torch  # noqa: E402

import minicompile  # noqa: E402
from model_zoo import MODELS, tensors_of  # noqa: E402
from timing import host_and_device_ms, interleaved_ms  # noqa: E402

TOL = {torch.float32: dict(rtol=1e-3, atol=1e-4), torch.bfloat16: dict(rtol=3e-2, atol=3e-2)}
# float32 convolutions and products in TF32 (PyTorch's default for cuDNN): eager's own
# result is that far from float32's, and another algorithm or layout (channels-last, a
# folded batch norm) rounds differently (resnet18's logits on an H200: 1e-3 apart).
TF32_TOL = dict(rtol=1e-2, atol=1e-3)


def first_call(fn, cuda: bool):  # noqa: ANN001, ANN201
    start = time.perf_counter()
    out = fn()
    if cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - start, out


def check(actual, expected, dtype: torch.dtype, train: bool = False) -> None:  # noqa: ANN001
    """Outputs within TOL of eager's.  A train step (the loss, then every gradient) is
    compared as one vector by relative norm: a gradient that is nearly zero (an attention
    key's bias) is all rounding, and a weight's sums over the batch in cuDNN's algorithms,
    TF32 included, which differ from eager's run to run."""
    pairs = [(a, e) for a, e in zip(tensors_of(actual), tensors_of(expected), strict=True)
             if isinstance(e, torch.Tensor)]
    if train:
        got = torch.cat([a.detach().float().flatten() for a, _ in pairs])
        want = torch.cat([e.detach().float().flatten() for _, e in pairs])
        err = float((got - want).norm() / want.norm().clamp_min(1e-12))
        if err >= (1e-2 if dtype == torch.float32 else 5e-2):
            raise AssertionError(f"off {err:.1e}")
        return
    for a, e in pairs:
        tf32 = e.is_cuda and dtype == torch.float32 and torch.backends.cudnn.allow_tf32
        torch.testing.assert_close(a, e, **(TF32_TOL if tf32 else TOL[dtype]))


def checked(who: str, actual, expected, dtype: torch.dtype, train: bool) -> str:  # noqa: ANN001
    """'' where ``actual`` passes :func:`check`, else a note for the row (still timed)."""
    try:
        check(actual, expected, dtype, train)
        return ""
    except AssertionError as e:
        return f"  [{who} {str(e).splitlines()[0]}]"


def without_dropout(model: torch.nn.Module) -> torch.nn.Module:
    """Dropout off in train mode (nn.Dropout and the float ``dropout`` attributes that
    transformers' attention reads), so that a train step is compared with eager's."""
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
        for attr in ("dropout", "attention_dropout"):
            if isinstance(getattr(m, attr, None), float):
                setattr(m, attr, 0.0)
    return model


def step(model, args, kwargs, train: bool):  # noqa: ANN001, ANN201
    """One call: the forward (eval), or forward, a loss over every float output and the
    backward (train); returns the outputs, or the loss and the parameters' gradients."""
    if not train:
        return lambda: model(*args, **kwargs)
    params = [p for p in model.parameters() if p.requires_grad]

    def run():  # noqa: ANN202
        outs = [t for t in tensors_of(model(*args, **kwargs))
                if isinstance(t, torch.Tensor) and t.is_floating_point()]
        loss = sum(t.float().square().mean() for t in outs)
        grads = torch.autograd.grad(loss, params, allow_unused=True)
        return [loss] + [g for g in grads if g is not None]
    return run


def host_device(fn, cuda: bool) -> str:  # noqa: ANN001
    """On CUDA: the host and device ms of a call and which bounds it."""
    if not cuda:
        return ""
    host, device = host_and_device_ms(fn)
    return f" {host:7.3f} {device:7.3f} {'host' if host > device else 'gpu':>5s}"


def bench(case, dtype: torch.dtype, device: torch.device, train: bool) -> str:  # noqa: ANN001
    """One row: both compilers' first calls, then eager, minicompile and torch.compile
    timed in turns (timing.interleaved_ms)."""
    cuda = device.type == "cuda"
    torch.manual_seed(0)
    model = case.build().to(device=device, dtype=dtype)
    model = without_dropout(model.train()) if train else model.eval()
    args, kwargs = case.inputs(device)
    if case.float_inputs:
        args = tuple(a.to(dtype) for a in args)
    expected = step(model, args, kwargs, train)()
    minicompile.reset()
    compiled = minicompile.compile(model)
    cold, out = first_call(step(compiled, args, kwargs, train), cuda)
    flags = [checked("mc", out, expected, dtype, train)]
    stats = minicompile.stats()
    fns = {"eager": step(model, args, kwargs, train), "mc": step(compiled, args, kwargs, train)}
    try:
        torch._dynamo.reset()
        inductor = torch.compile(model)
        tc_cold, tc_out = first_call(step(inductor, args, kwargs, train), cuda)
        flags.append(checked("tc", tc_out, expected, dtype, train))
        fns["tc"] = step(inductor, args, kwargs, train)
    except Exception as e:  # no toolchain for Inductor here, say
        tc_skipped = f"  skipped ({type(e).__name__})"
    ms = interleaved_ms(fns, cuda)
    tc = (f"{ms['tc']:9.3f} {tc_cold:8.1f} {ms['mc'] / ms['tc']:6.2f}" if "tc" in ms
          else tc_skipped)
    mode = "train" if train else "eval"
    name = f"{case.name} {mode} {str(dtype).removeprefix('torch.')}"
    return (f"{name:36s} {stats['graphs']:6d} {stats['graph_breaks']:6d} {stats['kernels']:7d} "
            f"{stats['eager_fallbacks']:9d} {cold:8.2f} {ms['eager']:9.3f} {tc} "
            f"{ms['mc']:9.3f}{host_device(fns['mc'], cuda)}" + "".join(f for f in flags if f))


def main() -> None:
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    dtypes = (torch.float32, torch.bfloat16) if cuda and "--float32" not in sys.argv else (
        torch.float32,)
    only = [m for m in ("eval", "train") if f"--{m}-only" in sys.argv]
    modes = only or ["eval", "train"]
    wanted = {a for a in sys.argv[1:] if not a.startswith("--")}
    where = torch.cuda.get_device_name() if cuda else "CPU"
    print(f"{where}, torch {torch.__version__}; ms are medians of one call, the three timed "
          "in turns (eval: forward under no_grad; train: forward, loss and backward)")
    host = f" {'host ms':>7s} {'gpu ms':>7s} {'bound':>5s}" if cuda else ""
    print(f"{'model':36s} {'graphs':>6s} {'breaks':>6s} {'kernels':>7s} {'fallbacks':>9s} "
          f"{'cold s':>8s} {'eager ms':>9s} {'tc ms':>9s} {'tc cold':>8s} {'mc/tc':>6s} "
          f"{'mc ms':>9s}{host}")
    for mode in modes:
        for case in MODELS:
            if wanted and case.name not in wanted:
                continue
            for dtype in dtypes:
                with torch.set_grad_enabled(mode == "train"):
                    print(bench(case, dtype, device, mode == "train"), flush=True)


if __name__ == "__main__":
    main()
