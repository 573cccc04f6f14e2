"""The wrapper reuses the memory of buffers no longer read (codegen/wrapper.py's
reuse_memory): a kernel's output of the same layout takes the dead buffer's tensor instead
of allocating.  Only buffers the wrapper allocated or matrix products made, and only those
kernels and matrix products read: other library calls may keep or return their arguments."""

from __future__ import annotations

import torch

import minicompile
from minicompile import ops

from devices import device_for
from graph_builder import GraphBuilder, compile_graph_text


def chain(extern: object) -> str:
    b = GraphBuilder("cpu")
    x, w = b.input("L_x", (64, 64)), b.input("L_w", (64, 64))
    a = b("sin", x)
    m1 = b(ops.extern_op(torch.mm), a, w)
    c = b("cos", m1)
    m2 = b(ops.extern_op(extern), c, 0)  # cumsum (keeps nothing) stands for any library call
    b.output(b("exp", m2), b("tanh", m2))
    return compile_graph_text(b.graph, "cpp").code.module


def test_dead_buffers_of_kernels_and_matrix_products_are_reused() -> None:
    module = chain(torch.cumsum)
    # sin's output, read only by mm, is dead once mm has run: nothing else holds it...
    assert "buf2 = buf0  # the memory of buf0, no longer read" in module, module
    # ...but cos's output goes to cumsum, a library call that might keep or return it:
    # exp's and tanh's outputs get new memory, not buf2's.
    assert "= buf2  #" not in module
    assert module.count("empty_strided_cpu(") == 2, module  # (buf0, buf5: CPU buffers)


def test_reused_memory_gives_the_same_values(backend: str) -> None:
    def f(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        h = torch.sin(x) @ w
        h = torch.cos(h) @ w
        return torch.exp(h) @ w + torch.tanh(h)

    compiled = minicompile.compile(f, backend=backend)
    device = device_for(backend)
    for seed in (0, 1):
        torch.manual_seed(seed)
        x, w = torch.randn(32, 32, device=device), torch.randn(32, 32, device=device) / 8
        torch.testing.assert_close(compiled(x, w), f(x, w), rtol=1e-5, atol=1e-5)
    assert minicompile.stats()["eager_fallbacks"] == 0
