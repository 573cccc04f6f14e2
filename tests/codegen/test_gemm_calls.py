"""CPU matrix products called as ``torch.mm`` / ``torch.addmm`` on 2-d views, into their
buffer (codegen/gemm_calls.py), where the batch dims fold into rows; the library call
where they do not.  Values equal eager's (two calls, fresh values; forward and gradients),
and the generated code says which road each product took; the profile still times them."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import minicompile
from minicompile import config

CASES = {  # fn, input shapes, the call the wrapper makes
    "linear_3d_bias": (lambda x, w, b: F.linear(x, w, b), ((2, 5, 8), (6, 8), (6,)),
                       "torch.addmm("),
    "linear_no_bias": (lambda x, w, b: F.linear(x, w) * 2, ((3, 8), (6, 8), (6,)), "torch.mm("),
    "matmul_batched": (lambda x, w, b: x @ w + b, ((2, 3, 5, 8), (8, 6), (6,)), "torch.mm("),
    "matmul_sliced": (lambda x, w, b: x[:, 1:] @ w, ((2, 6, 8), (8, 6), (6,)),
                      "torch.matmul("),  # rows of two batches do not fold
    "transposed_batch": (lambda x, w, b: x.transpose(0, 1) @ w, ((5, 2, 8), (8, 6), (6,)),
                         "torch.matmul("),
    "linear_of_a_view": (lambda x, w, b: F.linear(x.sin().transpose(1, 2), w, b),
                         ((2, 8, 5), (6, 8), (6,)), ""),  # (whichever road: values checked)
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("case", list(CASES))
def test_products_match_eager(case: str, dtype: torch.dtype,
                              capsys: pytest.CaptureFixture) -> None:
    fn, shapes, road = CASES[case]
    compiled = minicompile.compile(fn, backend="cpp")
    with config.patch(logs=frozenset({"output_code"})):
        for _ in range(2):
            values = [torch.randn(s, dtype=dtype) for s in shapes]
            results = []
            for f in (fn, compiled):
                leaves = [v.clone().requires_grad_() for v in values]
                out = f(*leaves)
                grads = torch.autograd.grad((out * out.detach().cos()).sum(), leaves,
                                            allow_unused=True)
                results.append([out, *[g for g in grads if g is not None]])
            for got, want in zip(results[1], results[0], strict=True):
                torch.testing.assert_close(got, want)
            with torch.no_grad():
                torch.testing.assert_close(compiled(*values), fn(*values))
    code = capsys.readouterr().err
    assert road in code
    stats = minicompile.stats()
    assert stats["graph_breaks"] == stats["eager_fallbacks"] == 0


def test_a_profiled_product_is_timed_as_a_library_call() -> None:
    x, w, b = torch.randn(4, 16, 32), torch.randn(24, 32), torch.randn(24)
    with config.patch(logs=frozenset({"profile"})):
        compiled = minicompile.compile(lambda x, w, b: F.linear(x, w, b).relu(), backend="cpp")
        for _ in range(4):
            torch.testing.assert_close(compiled(x, w, b), F.linear(x, w, b).relu())
    (graph,) = minicompile.profile_report()
    names = [s.name for s in graph.steps]
    assert any("addmm" in n for n in names), names
    assert graph.library_s > 0
