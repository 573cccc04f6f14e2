"""Build one Triton kernel to a cubin: the job of runtime/triton_build.py's worker processes.

Run as a script, it imports Triton and nothing of minicompile or PyTorch and answers each
JSON job line on stdin with a result line.  A build writes ``<out>.cubin`` then
``<out>.json``: a reader that finds the JSON finds the cubin complete.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import sys
import time
from typing import Any

# Triton's signature types -> the argument codes of torch._C._StaticCudaLauncher.
ARG_CODES = {"i1": "i", "i8": "b", "i16": "h", "i32": "i", "i64": "l", "u1": "I", "u8": "B",
             "u16": "H", "u32": "I", "u64": "K", "fp16": "f", "bf16": "f", "fp32": "f",
             "fp64": "d"}


def _write_atomic(path: str, data: bytes) -> None:  # (cache.py's needs minicompile)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def _unsupported(meta: Any) -> str | None:
    """Why a launch of this compiled kernel needs Triton's own launcher (None: none)."""
    if getattr(meta, "num_ctas", 1) != 1:
        return "it runs on thread-block clusters"
    for name in ("global_scratch_size", "profile_scratch_size"):
        if getattr(meta, name, 0):
            return f"it needs {name.removesuffix('_size').replace('_', ' ')} memory"
    for name in ("launch_cooperative_grid", "launch_pdl"):
        if getattr(meta, name, False):
            return f"it is launched with {name.removeprefix('launch_')}"
    return None


def build(job: dict) -> dict:
    """Compile ``job``; write the cubin and its launch data; ``{"ok": ...[, "reason": ...]}``."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.compiler.compiler import make_backend

    path = job["kernel_file"]
    name = "mc_kernels_" + hashlib.sha256(path.encode()).hexdigest()[:16]
    module = sys.modules.get(name)
    if module is None:
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # Triton's JIT looks a kernel's module up
        spec.loader.exec_module(module)
    fn = getattr(module, job["name"])
    signature = job["signature"]
    target = GPUTarget(*job["target"])
    backend = make_backend(target)
    src = ASTSource(fn, signature, {tuple(p): v for p, v in job["constexprs"]},
                    {tuple(p): backend.parse_attr(a) for p, a in job["attrs"]})
    kernel = triton.compile(src, target=target, options=job["options"])
    meta = kernel.metadata
    reason = _unsupported(meta)
    if reason is not None:
        return {"ok": False, "reason": f"{job['name']}: {reason}"}
    types = [t for t in signature.values() if t != "constexpr"]
    codes = "".join("O" if t.startswith("*") else ARG_CODES[t] for t in types)
    # Triton's CUDA kernels take a scratch pointer for each of these fields it declares.
    codes += "O" * sum(hasattr(meta, f) for f in ("global_scratch_size", "profile_scratch_size"))
    out = job["out"]
    _write_atomic(out + ".cubin", kernel.asm["cubin"])
    launch = {"name": meta.name, "num_warps": meta.num_warps, "shared": meta.shared,
              "arg_codes": codes, "cubin_sha256": hashlib.sha256(kernel.asm["cubin"]).hexdigest()}
    _write_atomic(out + ".json", json.dumps(launch).encode())
    return {"ok": True}


def _stamp(root: str) -> str:
    """Triton's files as they are now: each one's path, size and modification time."""
    h = hashlib.sha256()
    for folder, dirs, files in os.walk(root):
        dirs.sort()
        for name in sorted(files):
            if name.endswith((".py", ".so")):
                st = os.stat(os.path.join(folder, name))
                h.update(f"{folder}/{name}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


def _warm_up() -> None:
    """Import Triton, and key its own cache by a stamp of its files (paths, sizes, times:
    milliseconds, changed by any reinstall) instead of a hash of their contents (0.35 s
    a worker on the GPU machine)."""
    import triton
    import triton.compiler  # noqa: F401

    try:
        import triton.runtime.cache as triton_cache
    except ImportError:  # (another Triton: its first build computes what it needs)
        return
    stamp = _stamp(os.path.dirname(triton.__file__))
    key = f"minicompile-{triton.__version__}-{stamp}"
    triton_cache.triton_key = lambda: key


# The warm-up build: the smallest kernel that goes through every stage of Triton's compiler
# (its cost is the compiler's first-use work, which the real builds then skip).
WARM_UP_KERNEL = """\
import triton
import triton.language as tl


@triton.jit
def warm_up(in_ptr, out_ptr, xnumel, XBLOCK: tl.constexpr):
    xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
    mask = xindex < xnumel
    tl.store(out_ptr + xindex, tl.load(in_ptr + xindex, mask) + 1.0, mask)
"""


def _build_once(target: list) -> bool:
    """Build WARM_UP_KERNEL for ``target`` in a scratch cache folder: a first build loads
    the compiler's libraries and finds its tools, which the real builds then do not wait
    for.  Whether it built (the real builds report failures)."""
    import shutil
    import tempfile

    try:
        from triton import knobs

        scope = knobs.cache.scope
    except (ImportError, AttributeError):
        return False
    folder = tempfile.mkdtemp(prefix="minicompile-warm-up-")
    try:
        with scope():
            knobs.cache.dir = os.path.join(folder, "triton")
            path = os.path.join(folder, "warm_up.py")
            with open(path, "w") as f:
                f.write(WARM_UP_KERNEL)
            build({"kernel_file": path, "name": "warm_up",
                   "signature": {"in_ptr": "*fp32", "out_ptr": "*fp32", "xnumel": "i32",
                                 "XBLOCK": "constexpr"},
                   "constexprs": [[[3], 128]], "attrs": [],
                   "options": {"num_warps": 4}, "target": target,
                   "out": os.path.join(folder, "warm_up")})
        return True
    except Exception:  # noqa: BLE001 (the real builds report what is wrong)
        return False
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def main() -> None:
    results = sys.stdout
    sys.stdout = sys.stderr  # whatever Triton prints stays out of the results
    try:  # the first line: whether Triton imports
        _warm_up()
    except Exception as e:  # noqa: BLE001 (Triton does not import: said, and no jobs)
        results.write(json.dumps({"imported": False, "problem": f"{type(e).__name__}: {e}"}))
        results.write("\n")
        return
    results.write('{"imported": true}\n')
    results.flush()
    if len(sys.argv) > 1:  # the target the builds are for: one build ahead of them
        _build_once(json.loads(sys.argv[1]))
    results.write('{"ready": true}\n')  # the second line: jobs can come
    results.flush()
    for line in sys.stdin:
        start = time.perf_counter()
        try:
            result = build(json.loads(line))
        except BaseException as e:  # noqa: BLE001 (reported to the launching process)
            result = {"ok": False, "reason": f"{type(e).__name__}: {e}"[-2000:]}
        result["seconds"] = time.perf_counter() - start
        results.write(json.dumps(result) + "\n")
        results.flush()


if __name__ == "__main__":
    main()
