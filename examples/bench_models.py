"""The library models of the test suite (examples/model_zoo.py: torchvision, timm and
transformers, tiny random-init configs) compiled whole, side by side with eager and
torch.compile: graphs, graph breaks, kernels, the cold first call and the median call.

    python examples/bench_models.py            # every model; float32 (and bfloat16 on CUDA)
    python examples/bench_models.py hf_bert    # some of them

"Cold" is the first call of a fresh process-wide cache directory: capture, passes, code
generation and every kernel built.  Models are in eval mode, under no_grad.
"""

import os
import sys
import tempfile
import time

os.environ.setdefault("MINICOMPILE_CACHE_DIR", tempfile.mkdtemp(prefix="bench-models-"))

import torch  # noqa: E402

import minicompile  # noqa: E402
from model_zoo import MODELS, tensors_of  # noqa: E402
from timing import median_seconds  # noqa: E402

TOL = {torch.float32: dict(rtol=1e-3, atol=1e-4), torch.bfloat16: dict(rtol=3e-2, atol=3e-2)}


def first_call(fn, cuda: bool):  # noqa: ANN001, ANN201
    start = time.perf_counter()
    out = fn()
    if cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - start, out


def check(actual, expected, dtype: torch.dtype) -> None:  # noqa: ANN001
    for a, e in zip(tensors_of(actual), tensors_of(expected), strict=True):
        if isinstance(e, torch.Tensor):
            torch.testing.assert_close(a, e, **TOL[dtype])


def bench(case, dtype: torch.dtype, device: torch.device) -> str:  # noqa: ANN001
    cuda = device.type == "cuda"
    torch.manual_seed(0)
    model = case.build().eval().to(device=device, dtype=dtype)
    args, kwargs = case.inputs(device)
    if case.float_inputs:
        args = tuple(a.to(dtype) for a in args)
    call = lambda m: (lambda: m(*args, **kwargs))  # noqa: E731
    expected = model(*args, **kwargs)
    minicompile.reset()
    compiled = minicompile.compile(model)
    cold, out = first_call(call(compiled), cuda)
    check(out, expected, dtype)
    stats = minicompile.stats()
    eager_ms = median_seconds(call(model), cuda) * 1e3
    mc_ms = median_seconds(call(compiled), cuda) * 1e3
    try:
        torch._dynamo.reset()
        inductor = torch.compile(model)
        tc_cold, tc_out = first_call(call(inductor), cuda)
        check(tc_out, expected, dtype)
        tc = f"{median_seconds(call(inductor), cuda) * 1e3:9.3f} {tc_cold:8.1f}"
    except Exception as e:  # no toolchain for Inductor here, say
        tc = f"  skipped ({type(e).__name__})"
    name = f"{case.name} {str(dtype).removeprefix('torch.')}"
    return (f"{name:30s} {stats['graphs']:6d} {stats['graph_breaks']:6d} {stats['kernels']:7d} "
            f"{stats['eager_fallbacks']:9d} {cold:8.2f} {eager_ms:9.3f} {mc_ms:9.3f} {tc}")


def main() -> None:
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    dtypes = (torch.float32, torch.bfloat16) if cuda else (torch.float32,)
    wanted = set(sys.argv[1:])
    where = torch.cuda.get_device_name() if cuda else "CPU"
    print(f"{where}, torch {torch.__version__}; ms are medians of one call")
    print(f"{'model':30s} {'graphs':>6s} {'breaks':>6s} {'kernels':>7s} {'fallbacks':>9s} "
          f"{'cold s':>8s} {'eager ms':>9s} {'mc ms':>9s} {'tc ms':>9s} {'tc cold':>8s}")
    with torch.no_grad():
        for case in MODELS:
            if wanted and case.name not in wanted:
                continue
            for dtype in dtypes:
                print(bench(case, dtype, device), flush=True)


if __name__ == "__main__":
    main()
