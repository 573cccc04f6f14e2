"""GPU launches: the wrapper launches Triton kernels through runtime/launch.py's Launcher,
which goes through ``triton.jit`` once per specialization and then straight to the compiled
kernel; index checks on the GPU are device-side asserts, never a flag the host waits for."""

from __future__ import annotations

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
    assert ("triton_red_embedding_sin_sum_0_launch = Launcher(triton_red_embedding_sin_sum_0, "
            "(0, 1), (), XBLOCK=4, RBLOCK=8, num_warps=4, debug=True, sanitize_overflow=False)"
            ) in module
    assert "triton_poi_cos_1_launch = Launcher(triton_poi_cos_1, (0,), (), XBLOCK=128)" in module
    assert "triton_red_embedding_sin_sum_0_launch(1, arg1, arg0, buf0, 4, 8)" in module
    assert 'tl.device_assert(tmp1, "index out of range in triton_red_embedding_sin_sum_0: ' \
        '0 <= index < 10")' in module
    # Nothing reads a flag back (that would wait for the GPU).
    assert "err" not in module and "[(" not in module


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
