"""GPU launches: the wrapper launches Triton kernels through runtime/launch.py's Launcher,
which goes through ``triton.jit`` once per specialization and then straight to the compiled
kernel; index checks on the GPU are device-side asserts, never a flag the host waits for."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from minicompile.runtime import launch

from graph_builder import GraphBuilder, compile_graph_text


def embedding_sum(device: str) -> str:
    b = GraphBuilder(device)
    w = b.input("L_w", (10, 8))
    i = b.input("L_i", (4,), torch.int64)
    b.output(b("sum", b("sin", b("embedding", w, i)), (1,), False), b("cos", w))
    return compile_graph_text(b.graph, "triton").code.module


def test_gpu_kernels_launch_through_launchers_and_assert_on_the_device() -> None:
    module = embedding_sum("cuda")
    compile(module, "generated", "exec")  # valid Python
    assert "from minicompile.runtime.launch import Launcher" in module
    # Only the inputs' alignment can change between calls (the sizes are constants).
    # ... and what a call passes (the dtypes and sizes a build ahead of the call needs).
    assert ("triton_red_embedding_sin_sum_0_launch = Launcher(triton_red_embedding_sin_sum_0, "
            "(0, 1), (), (torch.int64, torch.float32, torch.float32, 4, 8), XBLOCK=1, RBLOCK=8, "
            "num_warps=4, debug=True, sanitize_overflow=False)") in module
    assert ("triton_poi_cos_1_launch = Launcher(triton_poi_cos_1, (0,), (), "
            "(torch.float32, torch.float32, 80), XBLOCK=128, num_warps=4)") in module
    # Triton itself is imported only when a kernel must be built.
    assert "from minicompile.runtime.lazy_triton import libdevice, tl, triton" in module
    assert "import triton\n" not in module
    assert "triton_red_embedding_sin_sum_0_launch(4, arg1, arg0, buf0, 4, 8)" in module
    assert 'tl.device_assert(tmp1, "index out of range in triton_red_embedding_sin_sum_0: ' \
        '0 <= index < 10")' in module
    # Nothing reads a flag back (that would wait for the GPU).
    assert "err" not in module and "[(" not in module


def test_pointwise_kernels_launch_with_four_warps() -> None:
    # Four warps over a block of 1024 float32 (eight elements a thread) reach 94% of copy
    # bandwidth on an H200, eight warps 85% (codegen/triton.POINTWISE_WARPS).
    b = GraphBuilder("cuda")
    x = b.input("L_x", (1 << 20,))
    h = b.input("L_h", (1 << 19,), torch.bfloat16)
    b.output(b("add", b("sin", x), b("sin", x)), b("cos", h), b("cos", b.input("L_s", (48,))))
    module = compile_graph_text(b.graph, "triton").code.module
    assert "(torch.float32, torch.float32, 1048576), XBLOCK=1024, num_warps=4)" in module
    assert "(torch.bfloat16, torch.bfloat16, 524288), XBLOCK=1024, num_warps=4)" in module
    assert "(torch.float32, torch.float32, 48), XBLOCK=64, num_warps=4)" in module
    b = GraphBuilder("cpu")  # the interpreter ignores warps: none are written
    b.output(b("sin", b.input("L_x", (1 << 12,))))
    assert "num_warps" not in compile_graph_text(b.graph, "triton").code.module


def test_interpreted_kernels_keep_the_error_flag_and_triton_jit_launches() -> None:
    module = embedding_sum("cpu")
    assert "Launcher" not in module and "device_assert" not in module
    assert "err_ptr" in module and "if err[0]:" in module
    assert "triton_red_embedding_sin_sum_0[(1,)](arg1, arg0, buf0, err, 4, 8, XBLOCK=4" in module


class FakeCompiled:
    """What ``kernel[grid](...)`` returns: a compiled kernel whose ``run`` launches."""

    def __init__(self, log: list, key: str) -> None:
        self.log, self.key = log, key
        self.function, self.packed_metadata = f"function-{key}", f"metadata-{key}"

    def run(self, *args: object) -> None:
        self.log.append(("direct", self.key, args))


class FakeJit:
    arg_names = ["in_ptr0", "out_ptr0", "xnumel", "XBLOCK"]

    def __init__(self) -> None:
        self.log: list = []

    def __getitem__(self, grid: tuple):
        def run(*args: object, **options: object) -> FakeCompiled:
            key = f"jit{len(self.log)}"
            self.log.append(("jit", grid, args, options))
            return FakeCompiled(self.log, key)
        return run


def test_launcher_goes_direct_only_for_a_specialization_it_has_compiled(monkeypatch) -> None:
    """Where launches cannot bypass Triton (an old Triton or PyTorch): Triton's launcher."""
    from minicompile.runtime import triton_build

    monkeypatch.setattr(triton_build, "available", lambda: False)
    monkeypatch.setattr(launch, "_raw_stream", lambda device: 7)
    monkeypatch.setattr(launch, "_current_device", lambda: 0)
    fn = FakeJit()
    launcher = launch.Launcher(fn, (0, 1), (2,), XBLOCK=128, num_warps=4)
    x, out = torch.zeros(64), torch.zeros(64)
    launcher(2, x, out, 64)
    launcher(2, x, out, 64)
    assert fn.log[0] == ("jit", (2,), (x, out, 64), {"XBLOCK": 128, "num_warps": 4})
    # The second call: the compiled kernel, its arguments and then the constexprs.
    kind, key, args = fn.log[1]
    assert (kind, key) == ("direct", "jit0")
    assert args[:9] == (2, 1, 1, 7, "function-jit0", "metadata-jit0", None, None, None)
    assert args[9:] == (x, out, 64, 128)
    # A view that is not 16-byte aligned, a size of 1, a size not a multiple of 16: each is
    # a specialization Triton compiles apart, so each goes through triton.jit first.
    launcher(2, x[1:], out, 63)
    launcher(1, x, out, 1)
    launcher(1, x, out, 17)
    assert [e[0] for e in fn.log[2:]] == ["jit", "jit", "jit"]
    launcher(1, x[1:], out, 63)
    launcher(1, x, out, 1)
    assert [e[:2] for e in fn.log[5:]] == [("direct", "jit2"), ("direct", "jit3")]


def test_launcher_without_cuda_always_goes_through_triton_jit(monkeypatch) -> None:
    monkeypatch.setattr(launch, "_raw_stream", None)
    fn = FakeJit()
    launcher = launch.Launcher(fn, (0, 1), (2,), XBLOCK=128)
    x = torch.zeros(4)
    for _ in range(3):
        launcher(1, x, x, 4)
    assert [e[0] for e in fn.log] == ["jit", "jit", "jit"]


def test_an_adopted_build_is_the_launch_of_a_call_like_the_example(
        monkeypatch, static_launches) -> None:
    """A launcher handed its example's build (at load) launches it at the first call like
    the example (aligned tensors, the example's sizes) with no lookup; another call looks
    its own up as before."""
    from minicompile.runtime import triton_build

    static, builds = static_launches, []
    monkeypatch.setattr(triton_build, "find_or_build", lambda *a: builds.append(a[1]))
    fn = FakeJit()
    launcher = launch.Launcher(fn, (0,), (2,), (torch.float32, torch.float32, 64), XBLOCK=128)
    built = triton_build.Built(Path("k64.cubin"), "k64", 4, 0, "OOiOO")
    launcher.adopt(built, 0)
    assert launcher.build is built and len(launcher.static) == 1 and static.log == []
    x, out = torch.zeros(64), torch.zeros(64)
    launcher(2, x, out, 64)
    assert static.log[-1][0] == "fn-k64" and fn.log == [] and builds == []
    launcher(1, x, out, 17)  # another size class: looked up (here: needs Triton's launcher)
    assert len(builds) == 1 and [e[0] for e in fn.log] == ["jit"]
    unknown = launch.Launcher(fn, (0,), (2,), (torch.float32, torch.float32, None), XBLOCK=128)
    unknown.adopt(built, 0)  # (a dynamic size without a hint: no example, nothing kept)
    assert unknown.build is None and unknown.static == {}


def test_a_warm_load_takes_its_recorded_builds_then_starts_the_plans_then_builds_the_rest(
        monkeypatch, static_launches) -> None:
    """A warm entry records each launcher's build; loading it, those the cache holds are
    loaded before the convolution plans start, and those it lost (or built for another
    GPU) go through precompile, which builds them ahead.  A launcher without a record had
    no build ahead when it was compiled: its first call does as before."""
    from minicompile.runtime import build, library_plans, triton_build

    events: list = []
    monkeypatch.setattr(library_plans, "_skip_reason", lambda: None)
    monkeypatch.setattr(triton_build, "target", lambda device: ("cuda", 90, 32))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    cache = {"ka": triton_build.Built(Path("/c/ka.cubin"), "ka", 4, 0, "OOiOO")}
    monkeypatch.setattr(triton_build, "recorded",
                        lambda key: events.append(("found", key)) or cache.get(key))
    monkeypatch.setattr(triton_build, "precompile", lambda launchers: events.append(
        ("precompile", sorted(l.name for l in launchers))))
    plans = library_plans.LibraryPlans(
        [(lambda x: events.append("plans"), (library_plans.Like((1,), (1,), torch.float32,
                                                                 torch.device("cpu")),), {})])
    start = plans.start
    plans.start = lambda: events.append("plans start") or start()
    namespace: dict = {"library_plans": plans}
    for name in ("k_a", "k_b", "k_c", "k_d"):
        namespace[name] = launch.Launcher(FakeJit(), (0,), (2,),
                                          (torch.float32, torch.float32, 64), XBLOCK=128)
        namespace[name].name = name
    exec("def call(args):\n    return ()", namespace)
    loaded = build.Loaded(namespace["call"], Path("mc_x.py"), True)
    here, elsewhere = ["cuda", 90, 32], ["cuda", 80, 32]
    build.ready_launches(loaded, {"k_a": [here, "ka"], "k_b": [here, "kb"],
                                  "k_c": [elsewhere, "kc"]})
    plans.wait()
    assert events[:2] == [("found", "ka"), ("found", "kb")]  # (k_c's GPU is another)
    assert [e for e in events[2:] if e != "plans"] == ["plans start", ("precompile",
                                                                       ["k_b", "k_c"])]
    assert events.count("plans") == 1  # (in a thread: any time after the start)
    assert namespace["k_a"].build is cache["ka"] and namespace["k_b"].build is None
    assert build.launch_builds(loaded) == {"k_a": [here, "ka"]}
    events.clear()
    build.ready_launches(loaded, {"k_a": [here, "ka"]})  # (the same module again)
    assert events == ["plans start"] and plans.threads == []  # (started once)
    build.ready_launches(loaded)  # (as a new module: every launcher without its build)
    assert events[1:] == ["plans start", ("precompile", ["k_b", "k_c", "k_d"])]


def test_only_what_can_change_is_in_the_key() -> None:
    """Inputs, library results and in-place outputs may be misaligned; buffers the wrapper
    allocates never are.  Symbolic sizes and extents change; integer ones never do."""
    from types import SimpleNamespace

    import sympy

    from minicompile.codegen.wrapper import _changing_args
    from minicompile.ir import ExternKernel

    s0 = sympy.Symbol("s0", integer=True, positive=True)
    program = SimpleNamespace(buffers=[
        SimpleNamespace(name="buf0"), SimpleNamespace(name="buf2"), SimpleNamespace(name="buf3"),
        ExternKernel("buf1", "torch.mm", (), {}, None, (), ()),
    ])
    plan = SimpleNamespace(inputs=(("arg0", None), ("buf0", None), ("buf1", None)),
                           outputs=("buf2", "buf3"), size_args=(s0,), numel=s0 * 8,
                           rnumel=sympy.Integer(16), is_reduction=True)
    # arg0 (input), buf1 (library result), buf3 (stored in place into an input); then the
    # size s0 and the extent 8 * s0 (positions 5, 6), not the constant row length 16.
    assert _changing_args(program, plan, {"buf3": "arg1"}) == ((0, 2, 4), (5, 6))


# -- builds ahead of the first launch, and static launches (runtime/triton_build.py) -------


def gpu_module(tmp_path, monkeypatch):  # noqa: ANN001, ANN201
    """The embedding-sum graph's GPU module, imported from a file as build.load does."""
    import importlib.util

    path = tmp_path / "mc_generated_gpu.py"
    path.write_text(embedding_sum("cuda"))
    spec = importlib.util.spec_from_file_location("mc_generated_gpu", path)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(__import__("sys").modules, "mc_generated_gpu", module)
    spec.loader.exec_module(module)
    return module


def test_a_gpu_module_imports_without_triton(tmp_path) -> None:
    import subprocess
    import sys

    path = tmp_path / "mc_generated_gpu.py"
    path.write_text(embedding_sum("cuda"))
    code = (f"import runpy, sys; runpy.run_path({str(path)!r}); "
            "print('triton' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_kernels_build_ahead_to_cubins_in_worker_processes(tmp_path, monkeypatch) -> None:
    """Without a GPU, Triton still compiles for one: the build of each kernel of a module
    (in two worker processes), its launch data, and one build for identical kernels."""
    from minicompile import config
    from minicompile.runtime import triton_build

    monkeypatch.setattr(triton_build, "target", lambda device: ("cuda", 90, 32))
    monkeypatch.setattr(config, "_config", dataclasses.replace(config.get(),
                                                               cache_dir=tmp_path / "cache"))
    module = gpu_module(tmp_path, monkeypatch)
    red, cos = module.triton_red_embedding_sin_sum_0_launch, module.triton_poi_cos_1_launch
    prepared = [triton_build.Prepared(l.fn, l.example_args(), l.options, 0) for l in (red, cos)]
    assert [p.built() for p in prepared] == [None, None]
    assert triton_build.build_all(prepared, threads=2) == [None, None]
    built = [p.built() for p in prepared]
    assert [b.name for b in built] == ["triton_red_embedding_sin_sum_0", "triton_poi_cos_1"]
    assert built[0].cubin.read_bytes()[:4] == b"\x7fELF"
    # Pointers, then the two int32 extents (4 and 8); Triton's scratch pointers last.
    assert built[0].arg_codes.startswith("OOOii") and set(built[0].arg_codes[5:]) <= {"O"}
    assert built[1].arg_codes.startswith("OOi")
    # Another specialization (an extent of 1 is a constant of the kernel) is another build.
    one = triton_build.Prepared(cos.fn, [*cos.example_args()[:2], 1], cos.options, 0)
    assert one.key != prepared[1].key and one.built() is None
    # The same kernel under another name is the same build.
    twin = prepared[1].text.replace("triton_poi_cos_1", "triton_poi_cos_7")
    assert triton_build.digest(twin, "triton_poi_cos_7", triton_build.describe(
        cos.example_args()), cos.options, 0) == prepared[1].key
    # A cubin that no longer matches its checksum is not loaded (and built again).
    built[1].cubin.write_bytes(b"garbage")
    import pytest

    with pytest.warns(RuntimeWarning, match="is corrupted"):
        assert prepared[1].built() is None
    # precompile hands each launcher its example's build: cos's, lost, is built again.
    monkeypatch.setattr(triton_build, "available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(triton_build, "load", lambda cubin, name, shared, device: name)
    for launcher in (red, cos):
        launcher.direct = True
    triton_build.precompile([red, cos])
    assert red.build == built[0] and cos.build.cubin == built[1].cubin
    assert cos.build.cubin.read_bytes()[:4] == b"\x7fELF"
    for launcher, name in ((red, "triton_red_embedding_sin_sum_0"), (cos, "triton_poi_cos_1")):
        (static,) = launcher.static.values()  # (the example's key: loaded, not looked up)
        assert static[0] == name and static[3] == launcher.build.arg_codes


class FakeStatic:
    def __init__(self) -> None:
        self.log: list = []

    def _launch_kernel(self, *args: object) -> None:
        self.log.append(args)


@pytest.fixture()
def static_launches(monkeypatch: pytest.MonkeyPatch) -> FakeStatic:
    """A machine where launches go through the static launcher (a recording stand-in),
    device 0 and stream 7, with each cubin "loaded" as ``fn-<its name>``."""
    from minicompile.runtime import triton_build

    static = FakeStatic()
    monkeypatch.setattr(launch, "_static_launcher", static)
    monkeypatch.setattr(launch, "_raw_stream", lambda device: 7)
    monkeypatch.setattr(launch, "_current_device", lambda: 0)
    monkeypatch.setattr(triton_build, "available", lambda: True)
    monkeypatch.setattr(triton_build, "load", lambda cubin, name, shared, device: f"fn-{name}")
    return static


def test_static_launches_drop_constant_ones_and_add_scratch(monkeypatch,
                                                           static_launches) -> None:
    from minicompile.runtime import triton_build

    static, builds = static_launches, []

    def find_or_build(kernel, args, options, device):  # noqa: ANN001, ANN202
        builds.append(args)
        if args[2] == 17:  # a kernel that needs Triton's launcher
            return None
        codes = "OO" + "i" * (args[2] != 1) + "OO"
        return triton_build.Built(None, f"k{len(builds)}", 4, 0, codes)

    monkeypatch.setattr(triton_build, "find_or_build", find_or_build)
    fn = FakeJit()
    launcher = launch.Launcher(fn, (0,), (2,), (torch.float32, torch.float32, 64), XBLOCK=128)
    x, out = torch.zeros(64), torch.zeros(64)
    launcher(2, x, out, 64)
    launcher(2, x, out, 64)
    assert len(builds) == 1 and fn.log == []  # found once, launched twice, never via Triton
    ptrs = (x.data_ptr(), out.data_ptr())
    assert static.log[1] == ("fn-k1", 2, 1, 1, 4, 0, "OOiOO", (*ptrs, 64, None, None), 7)
    launcher(1, x, out, 1)  # a size of 1: another build, and the 1 is not passed
    assert static.log[2] == ("fn-k2", 1, 1, 1, 4, 0, "OOOO", (*ptrs, None, None), 7)
    launcher(1, x[1:], out, 48)  # misaligned: another key
    assert len(builds) == 3
    launcher(1, x, out, 17)
    launcher(1, x, out, 17)  # no static build: Triton's path, asked once
    assert len(builds) == 4 and [e[0] for e in fn.log] == ["jit", "direct"]

    def refuse(*args: object) -> None:
        raise RuntimeError("CUDA driver error: invalid argument")

    monkeypatch.setattr(static, "_launch_kernel", refuse)
    launcher(2, x, out, 64)  # a launch the driver refuses: Triton's path from then on
    launcher(2, x, out, 64)
    assert [e[0] for e in fn.log[2:]] == ["jit", "direct"] and len(builds) == 4


def test_lazy_kernels_become_triton_functions_on_demand(tmp_path, monkeypatch) -> None:
    """A launch that must go through Triton imports it into the module: the kernel then
    runs (here under the interpreter, on CPU tensors)."""
    import os

    import pytest

    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("runs the kernel under Triton's interpreter")
    from minicompile.runtime.lazy_triton import LazyKernel

    module = gpu_module(tmp_path, monkeypatch)
    lazy = module.triton_poi_cos_1_launch.fn
    assert isinstance(lazy, LazyKernel) and lazy.arg_names[:3] == ["in_ptr0", "out_ptr0", "xnumel"]
    real = lazy.real()
    assert module.triton_poi_cos_1 is real and module.tl.__name__ == "triton.language"
    from minicompile.runtime.triton_interp import libdevice

    module.libdevice = libdevice  # the interpreter's (as build.load gives CPU kernels)
    x = torch.randn(80)
    out = torch.empty(80)
    lazy[(1,)](x, out, 80, XBLOCK=128)
    torch.testing.assert_close(out, torch.cos(x))
    x = torch.randn(80)
    lazy[(1,)](x, out, 80, XBLOCK=128)  # new values, the same kernel
    torch.testing.assert_close(out, torch.cos(x))


def test_build_workers_belong_to_the_process_that_started_them(monkeypatch) -> None:
    """A forked child never writes to its parent's workers' pipes: it starts its own."""
    from minicompile.runtime import triton_build

    closed: list = []

    class FakeWorker:
        def __init__(self, device: int | None) -> None:
            assert device is None  # no GPU in use here: no build ahead
            self.closed = False

        def alive(self) -> bool:
            return not self.closed

        def close(self) -> None:
            self.closed = True
            closed.append(self)

    monkeypatch.setattr(triton_build, "_Worker", FakeWorker)
    monkeypatch.setattr(triton_build, "_workers", [])
    monkeypatch.setattr(triton_build, "_registered", True)
    triton_build.start_workers(2)
    parents = list(triton_build._workers)
    assert len(parents) == 2
    triton_build.start_workers(2)
    assert triton_build._workers == parents  # alive: kept, none started
    monkeypatch.setattr(triton_build, "_workers_pid", -1)  # as seen from a forked child
    triton_build.start_workers(1)
    assert len(triton_build._workers) == 1 and triton_build._workers[0] not in parents
    triton_build.stop_workers()
    assert len(closed) == 1 and triton_build._workers == []


def test_workers_key_tritons_cache_by_a_stamp_of_its_files(tmp_path) -> None:
    """A worker does not hash the contents of Triton's files for its cache key (0.35 s on
    the GPU machine): the key is a stamp of their paths, sizes and times, which a changed
    file changes."""
    import os
    import subprocess
    import sys

    from minicompile.runtime import triton_worker

    root = tmp_path / "triton"
    (root / "language").mkdir(parents=True)
    source = root / "language" / "core.py"
    source.write_text("x = 1\n")
    (root / "notes.txt").write_text("not a file of code")
    first = triton_worker._stamp(str(root))
    assert triton_worker._stamp(str(root)) == first
    (root / "notes.txt").write_text("changed, but not code")
    assert triton_worker._stamp(str(root)) == first
    source.write_text("x = 22\n")  # another size
    second = triton_worker._stamp(str(root))
    assert second != first
    stat = source.stat()
    os.utime(source, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1))  # same size, touched
    assert triton_worker._stamp(str(root)) != second
    code = ("import sys; sys.path.insert(0, {folder!r}); import triton_worker, triton, "
            "triton.runtime.cache as c; triton_worker._warm_up(); print(c.triton_key()); "
            "print(triton.__version__)").format(folder=str(Path(triton_worker.__file__).parent))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out[0].startswith(f"minicompile-{out[1]}-")  # Triton's own cache keyed by it


def test_a_worker_told_its_gpu_builds_one_kernel_ahead_and_leaves_nothing(tmp_path) -> None:
    """With a target on its command line, a worker builds a kernel for it before its first
    job (in a cache folder of its own, deleted after), then answers jobs as before."""
    import json
    import os
    import subprocess
    import sys

    from minicompile.runtime import triton_worker

    (tmp_path / "tmp").mkdir()
    (tmp_path / "kernel.py").write_text(triton_worker.WARM_UP_KERNEL)
    env = {**os.environ, "TMPDIR": str(tmp_path / "tmp"),
           "TRITON_CACHE_DIR": str(tmp_path / "triton")}
    env.pop("TRITON_INTERPRET", None)
    job = {"kernel_file": str(tmp_path / "kernel.py"), "name": "warm_up",
           "signature": {"in_ptr": "*fp32", "out_ptr": "*fp32", "xnumel": "i32",
                         "XBLOCK": "constexpr"},
           "constexprs": [[[3], 64]], "attrs": [], "options": {"num_warps": 2},
           "target": ["cuda", 90, 32], "out": str(tmp_path / "built")}
    proc = subprocess.run(
        [sys.executable, triton_worker.__file__, json.dumps(["cuda", 90, 32])], input=json.dumps(job) + "\n", env=env,
        capture_output=True, text=True, timeout=600, check=True)
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["ok"] and result["seconds"] > 0
    assert (tmp_path / "built.cubin").read_bytes()[:4] == b"\x7fELF"
    assert list((tmp_path / "tmp").iterdir()) == []  # the warm-up's folder is gone
    # Only the real job's build went to Triton's cache (the warm-up's had a folder of its own).
    assert len(list((tmp_path / "triton").rglob("*.cubin"))) == 1
    # The warm-up itself builds (a failure would only be silent).
    code = ("import sys; sys.path.insert(0, {folder!r}); import triton_worker; "
            "print(triton_worker._build_once(['cuda', 90, 32]))").format(
        folder=str(Path(triton_worker.__file__).parent))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=600, check=True)
    assert out.stdout.strip().splitlines()[-1] == "True"


def test_jobs_go_to_the_workers_ready_first(monkeypatch) -> None:
    """A worker still making its warm-up build takes no job while another is ready, and
    the build does not wait for it."""
    import threading
    import time

    from minicompile.runtime import triton_build

    class FakeWorker:
        def __init__(self, warm_up: float) -> None:
            self.warm_up, self.lock, self.seconds, self.jobs = warm_up, threading.Lock(), [], []

        def wait_ready(self) -> bool:
            time.sleep(self.warm_up)
            return True

        def alive(self) -> bool:
            return True

        def run(self, job: dict) -> None:
            self.jobs.append(job)
            self.seconds.append(0.01)

    class FakePrepared:
        def __init__(self, k: int) -> None:
            self.k = k

        def job(self) -> dict:
            return {"k": self.k}

    slow, quick = FakeWorker(3.0), FakeWorker(0.0)
    monkeypatch.setattr(triton_build, "_workers", [slow, quick])
    monkeypatch.setattr(triton_build, "_workers_pid", __import__("os").getpid())
    start = time.perf_counter()
    assert triton_build.build_all([FakePrepared(0), FakePrepared(1)], threads=2) == [None, None]
    assert time.perf_counter() - start < 2.0
    assert quick.jobs == [{"k": 0}, {"k": 1}] and slow.jobs == []


def test_the_specialization_of_launch_arguments_is_tritons_own() -> None:
    """The launching process specializes arguments without importing Triton: what it
    computes is what ``triton.jit`` would, for every dtype it knows, aligned or not, and
    integers of every class."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import make_backend
    from triton.runtime.jit import native_specialize_impl

    from minicompile.runtime import triton_build

    backend = type(make_backend(GPUTarget("cuda", 90, 32)))
    args: list = [0, 1, 2, 15, 16, 17, -16, -17, 2**31 - 1, 2**31, 2**33, 2**63, -(2**40)]
    for name in triton_build.TRITON_TYPES:
        dtype = getattr(torch, name, None)
        if dtype is None:  # (a float8 type this PyTorch lacks)
            continue
        base = torch.zeros(8, dtype=dtype)
        args += [base, base[1:]]  # 16-byte aligned, and not
    for arg in args:
        want = native_specialize_impl(backend, arg, False, True, True)
        got = triton_build.specialization(arg)
        assert got == tuple(want), (arg if isinstance(arg, int) else arg.dtype, got, want)
    # A dtype it does not know: None, and Triton's specializer is asked instead.
    assert triton_build.specialization(torch.zeros(2, dtype=torch.complex64)) is None


def test_kernel_files_read_by_code_positions_match_inspect(tmp_path, monkeypatch) -> None:
    """A kernel's source is read from its file's lines by its code object's positions (not
    ``inspect.getsource``, which tokenizes the file): the same text for generated kernels,
    and worked out once per kernel."""
    import inspect

    from minicompile.runtime import triton_build

    module = gpu_module(tmp_path, monkeypatch)
    kernels = [v for v in vars(module).values() if hasattr(v, "arg_names") and hasattr(v, "fn")]
    assert len(kernels) >= 2
    for kernel in kernels:
        assert triton_build.source(kernel.fn) == inspect.getsource(kernel.fn)
        first = triton_build.kernel_file(kernel)
        assert triton_build.kernel_file(kernel) is first  # remembered
        assert first.startswith(triton_build.HEADER) and f"def {kernel.fn.__name__}(" in first


def test_rows_of_1024_or_more_are_a_program_each_on_the_gpu() -> None:
    # An H200: softmax over [65536, 1024] float32 0.131 ms a row a program with 4 warps
    # (copy 0.131), 0.135 four rows a program with 8 warps.
    from minicompile.codegen.triton_reduction import reduction_blocks

    assert reduction_blocks(65536, 1024, interpret=False) == (1, 1024, 4, True)
    assert reduction_blocks(65536, 2048, interpret=False) == (1, 2048, 8, True)
    assert reduction_blocks(65536, 256, interpret=False)[:3] == (16, 256, 8)  # short rows
