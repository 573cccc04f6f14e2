"""Extern kernels (library calls) in the generated wrapper, and fusion around them."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from minicompile import config, ops
from minicompile.runtime import build

from devices import device_for
from graph_builder import GraphBuilder, compile_graph_text


def linear_gelu_split(device: torch.device = torch.device("cpu")) -> GraphBuilder:
    b = GraphBuilder(device)
    x = b.input("L_x", (4, 8), torch.float32)
    w = b.input("L_w", (16, 8), torch.float32)
    bias = b.input("L_b", (16,), torch.float32)
    lin = b(ops.extern_op(F.linear), b("sin", x), w, bias)
    parts = b(ops.extern_op(torch.split), b("gelu", lin), 8, 1)
    b.output(b("mul", b("getitem", parts, 0), b("getitem", parts, 1)), b("permute", lin, (1, 0)))
    return b


def test_extern_calls_are_named_and_pointwise_work_is_fused_around_them() -> None:
    c = compile_graph_text(linear_gelu_split().graph, "cpp")
    module = c.code.module
    # On the CPU the linear is BLAS's addmm on 2-d views, into its buffer
    # (codegen/gemm_calls.py): arg1 read transposed.
    assert ("torch.addmm(arg2, buf0, reinterpret(arg1, (8, 16), (1, 8)), "
            "out=buf1)") in module
    # split is a view: its pieces are slices the consumer indexes, not a library call.
    assert "torch.split(" not in module
    # sin before the linear; gelu, the split and the product after it: two kernels.
    assert len(c.code.kernels) == 2
    # The returned transpose of the linear's result is a view of it, not a copy.
    assert ".as_strided((16, 4), (1, 16)" in module


def test_extern_program_matches_eager_on_both_backends() -> None:
    for backend in ("cpp", "triton"):
        device = device_for(backend)
        c = compile_graph_text(linear_gelu_split(device).graph, backend)
        loaded = build.load(c.code, config.get(), interpret=device.type == "cpu" and backend == "triton")
        x, w, bias = (torch.randn(*s, device=device) for s in ((4, 8), (16, 8), (16,)))
        out, lin_t = loaded.call([x, w, bias])
        lin = F.linear(x.sin(), w, bias)
        a, b = torch.split(F.gelu(lin), 8, 1)
        torch.testing.assert_close(out, a * b)
        torch.testing.assert_close(lin_t, lin.T)
        assert lin_t.stride() == lin.T.stride()


def test_extern_name_is_a_public_path() -> None:
    assert ops.extern_op(F.linear) == "torch.nn.functional.linear"
    assert ops.extern_op(torch.Tensor.reshape) == "torch.Tensor.reshape"
    assert ops.resolve_path("torch.nn.functional.linear") is F.linear


def test_attention_mask_made_in_the_graph_has_dense_rows(backend: str) -> None:
    """A mask built by expanding a few values (transformers makes one while compiling)
    has stride 0 along the keys in eager's layout; the fused attention kernels refuse that,
    so the wrapper writes its rows dense (broadcast dims stay stride 0) and values match."""
    import minicompile

    def attend(q, k, v, limit):
        rows = torch.arange(q.shape[2], device=q.device)[:, None] < limit
        mask = rows.expand(q.shape[0], 1, q.shape[2], k.shape[2])
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    device = device_for(backend)
    fn = minicompile.compile(attend, backend=backend)
    for limit in (5, 3):  # the second call: another limit, the same compiled code
        q, k, v = (torch.randn(2, 4, 8, 16, device=device) for _ in range(3))
        torch.testing.assert_close(fn(q, k, v, limit), attend(q, k, v, limit))
    for entry in fn.entries:
        assert "(2, 1, 8, 8), (0, 64, 8, 1)" in entry.artefact[0].module_path.read_text()
