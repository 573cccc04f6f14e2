"""Start-up time: the cold and warm first call of minicompile and torch.compile, each in a
fresh process, side by side.

    python examples/bench_startup.py                      # every workload, CUDA if present
    python examples/bench_startup.py --workloads pointwise,layer_norm --repeat 3
    python examples/bench_startup.py --device cpu --workloads pointwise
    python examples/bench_startup.py --bytecode-cache /tmp/pyc   # Python without .pyc files

For each workload and compiler a child process imports torch, then the compiler, builds the
inputs, runs the function eagerly once (the warm-up), and times the first compiled call
(synchronised on CUDA), checking it against eager.  *Cold* runs on empty caches (a fresh
MINICOMPILE_CACHE_DIR, TORCHINDUCTOR_CACHE_DIR and TRITON_CACHE_DIR); *warm* is the next
process on the same caches.  Workloads:

- ``pointwise``: ``sin(x) + sin(y)`` (a function: minicompile keeps warm entries of it)
- ``layer_norm``: ``F.layer_norm`` over [64, 1024] with weight and bias (a function)
- ``nanogpt``: the GPT forward of examples/gpt.py (a module, under no_grad)
- ``resnet``: timm ``resnet50``, random init (bf16 on CUDA; float32, 64x64 on CPU)

The table gives medians over ``--repeat`` pairs of processes; beside each warm first
call, the time of the next call (the work itself, nothing left to load), and at the end
``import minicompile`` beyond ``import torch``.  Modules have warm entries when their
fingerprint allows (runtime/fingerprints.py); the notes say which loaded one.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parent
ROOT = EXAMPLES.parent
WORKLOADS = ("pointwise", "layer_norm", "nanogpt", "resnet")
COMPILERS = ("minicompile", "torch.compile")


# -- the child: one first call in a fresh process ------------------------------------------


def pointwise(x, y):  # noqa: ANN001, ANN201
    import torch

    return torch.sin(x) + torch.sin(y)


def layer_norm(x, w, b):  # noqa: ANN001, ANN201
    import torch.nn.functional as F

    return F.layer_norm(x, (x.shape[-1],), w, b)


def make_workload(name: str, device: str):  # noqa: ANN201
    """(function or module, args, tolerance) for ``name`` on ``device``."""
    import torch

    torch.manual_seed(0)
    cuda = device == "cuda"
    if name == "pointwise":
        x, y = torch.randn(1 << 20, device=device), torch.randn(1 << 20, device=device)
        return pointwise, (x, y), 1e-5
    if name == "layer_norm":
        x = torch.randn(64, 1024, device=device)
        w, b = torch.randn(1024, device=device), torch.randn(1024, device=device)
        return layer_norm, (x, w, b), 1e-4
    if name == "nanogpt":
        from gpt import GPT, GPTConfig

        config = GPTConfig(n_layer=4 if cuda else 2, n_embd=256 if cuda else 128)
        model = GPT(config).to(device).eval()
        idx = torch.randint(0, config.vocab_size, (8, config.block_size), device=device)
        return model, (idx,), 1e-3
    if name == "resnet":
        from model_report import import_torchvision

        import_torchvision()
        import timm

        dtype = torch.bfloat16 if cuda else torch.float32
        model = timm.create_model("resnet50", pretrained=False).to(device, dtype).eval()
        size, batch = (224, 8) if cuda else (64, 1)
        x = torch.randn(batch, 3, size, size, device=device, dtype=dtype)
        return model, (x,), 5e-2 if cuda else 1e-3
    raise SystemExit(f"unknown workload {name!r}; known: {', '.join(WORKLOADS)}")


def child(workload: str, compiler: str, device: str) -> dict:
    start = time.perf_counter()
    import torch

    import_torch = time.perf_counter() - start
    start = time.perf_counter()
    if compiler == "minicompile":
        import minicompile

        compile_fn = minicompile.compile
    else:
        compile_fn = torch.compile
    import_compiler = time.perf_counter() - start
    fn, args, tol = make_workload(workload, device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    with torch.no_grad():
        expected = fn(*args)  # the eager warm-up
        sync()
        start = time.perf_counter()
        compiled = compile_fn(fn)
        out = compiled(*args)
        sync()
        first = time.perf_counter() - start
        start = time.perf_counter()
        again = compiled(*args)
        sync()
        second = time.perf_counter() - start
    # Checked against eager; a mismatch is reported beside the times, not raised.
    matches = all(torch.allclose(v.float(), expected.float(), rtol=tol, atol=tol)
                  for v in (out, again))
    result = {"import_torch": import_torch, "import_compiler": import_compiler,
              "first_call": first, "second_call": second, "matches": matches}
    if compiler == "minicompile":
        import minicompile

        result["stats"] = minicompile.stats()
    return result


# -- the parent: fresh processes, cold then warm ------------------------------------------


BYTECODE: Path | None = None  # --bytecode-cache: Python's own .pyc files, kept there


def run_child(workload: str, compiler: str, device: str, cache: Path, timeout: float) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MINICOMPILE_", "TORCHINDUCTOR_"))}
    env.pop("TRITON_INTERPRET", None)
    if BYTECODE is not None:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(BYTECODE)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(EXAMPLES), env.get("PYTHONPATH", "")])
    env["MINICOMPILE_CACHE_DIR"] = str(cache / "minicompile")
    env["TORCHINDUCTOR_CACHE_DIR"] = str(cache / "inductor")
    env["TRITON_CACHE_DIR"] = str(cache / "triton")
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", workload, compiler, device]
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timeout ({timeout:.0f} s)"}
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["?"])[-1]
        return {"error": f"exit {proc.returncode}: {tail[:120]}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def measure(workload: str, compiler: str, device: str, repeat: int, timeout: float) -> dict:
    """Medians of ``repeat`` (cold, warm) pairs, each pair on caches of its own."""
    cold, warm, steady, imports, kernels, matches, hits = [], [], [], [], None, True, []
    if BYTECODE is not None:  # one untimed run writes the .pyc files of what the cell imports
        with tempfile.TemporaryDirectory(prefix="bench-startup-") as tmp:
            run_child(workload, compiler, device, Path(tmp), timeout)
    for _ in range(repeat):
        with tempfile.TemporaryDirectory(prefix="bench-startup-") as tmp:
            first = run_child(workload, compiler, device, Path(tmp), timeout)
            if "error" in first:
                return {"error": first["error"]}
            second = run_child(workload, compiler, device, Path(tmp), timeout)
            if "error" in second:
                return {"error": second["error"]}
        matches = matches and first["matches"] and second["matches"]
        cold.append(first["first_call"])
        warm.append(second["first_call"])
        steady.append(second["second_call"])
        imports += [first["import_compiler"], second["import_compiler"]]
        if "stats" in first:
            kernels = first["stats"]["kernels"]
            hits.append(second["stats"]["frames"] == 0)
    out = {"cold": statistics.median(cold), "warm": statistics.median(warm),
           "steady": statistics.median(steady), "import": statistics.median(imports),
           "matches": matches}
    if kernels is not None:
        out["kernels"], out["warm_entry"] = kernels, all(hits)
    return out


def seconds(r: dict, key: str) -> str:
    if not r:
        return "-"
    if "error" in r:
        return r["error"]
    if key == "warm":  # and what the call itself takes, once everything is loaded
        return f"{r[key]:.2f} s (call {r['steady'] * 1e3:.0f} ms)"
    return f"{r[key]:.2f} s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--compilers", default=",".join(COMPILERS))
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda if present)")
    parser.add_argument("--repeat", type=int, default=1, help="pairs of processes per cell")
    parser.add_argument("--timeout", type=float, default=1200, help="seconds per process")
    parser.add_argument("--bytecode-cache", metavar="DIR", default=None, help=(
        "keep Python's .pyc files in DIR (PYTHONPYCACHEPREFIX), written by an untimed run "
        "of each cell first: for machines whose Python writes none (PYTHONDONTWRITEBYTECODE)"
        " and so compiles every imported module's source in every process"))
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(*args.child)))
        return
    global BYTECODE
    BYTECODE = Path(args.bytecode_cache).resolve() if args.bytecode_cache else None
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    where = torch.cuda.get_device_name() if device == "cuda" else f"CPU ({os.cpu_count()} cores)"
    print(f"start-up on {where}: PyTorch {torch.__version__}, Python "
          f"{sys.version.split()[0]}; medians of {args.repeat} pair(s) of fresh processes"
          + (f"; Python bytecode cached in {BYTECODE}" if BYTECODE else ""))
    print("| workload | minicompile cold | minicompile warm | torch.compile cold | "
          "torch.compile warm | cold: torch.compile / minicompile | notes |")
    print("|---|---|---|---|---|---|---|")
    rows = []
    for workload in args.workloads.split(","):
        found = {c: measure(workload, c, device, args.repeat, args.timeout)
                 for c in args.compilers.split(",")}
        rows.append((workload, found))
        mc, tc = found.get("minicompile", {}), found.get("torch.compile", {})
        ratio = f"{tc['cold'] / mc['cold']:.1f}x" if "cold" in mc and "cold" in tc else "-"
        notes = "".join(f"{c} DIFFERS FROM EAGER; " for c, r in found.items()
                        if not r.get("matches", True))
        if "kernels" in mc:
            notes += f"{mc['kernels']} kernels, " + (
                "warm entry loaded" if mc["warm_entry"] else "no warm entry: traced again")
        cells = [seconds(mc, "cold"), seconds(mc, "warm"), seconds(tc, "cold"),
                 seconds(tc, "warm")]
        print(f"| {workload} | {' | '.join(cells)} | {ratio} | {notes} |", flush=True)
    imports = [f["minicompile"]["import"] for _, f in rows if "import" in f.get("minicompile", {})]
    if imports:
        print(f"import minicompile beyond import torch: {statistics.median(imports) * 1e3:.0f} ms")


if __name__ == "__main__":
    main()
