"""Cases of issue #4 for the differential suite: views and shape ops, index ops, and extern
kernels (matmul, convolution, attention) with pointwise work around them.

Every view is taken twice: returned directly (the output must be a view of the input
exactly where eager's is: same storage, offset and strides, which ``assert_same`` checks)
and followed by a pointwise op (the compiler must read through the view).  Run by
``test_reductions.py`` with the checks of ``test_ops.py``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.nn.functional as F

from op_cases import (
    OpCase,
    b8,
    bf16,
    f16,
    f32,
    i64,
    inputs,
    offset,
    rand,
    strided,
    transposed,
)

CASES: list[OpCase] = []

# Matmuls and convolutions sum in another order than a fused prologue's inputs would
# suggest; the prologue's sin/exp may also differ from eager's by an ulp before the sum.
MM_TOL: dict[torch.dtype, dict[str, float]] = {
    f32: dict(rtol=1e-4, atol=1e-4),
    f16: dict(rtol=1e-2, atol=1e-2),
    bf16: dict(rtol=3e-2, atol=3e-2),
}


def case(name: str, fn: Callable, *makers: Callable,
         tol: dict[torch.dtype, dict[str, float]] | None = None) -> None:
    CASES.append(OpCase(name, fn, inputs(*makers), tol=tol))


# -- views: returned directly, and read by a pointwise op --------------------------------

VIEWS: list[tuple[str, Callable, Callable]] = [
    ("view", lambda x: x.view(4, 2, 16), rand((4, 32))),
    ("view_minus1", lambda x: x.view(-1), rand((4, 8))),
    ("reshape", lambda x: x.reshape(2, -1), rand((4, 8))),
    ("reshape_of_transposed", lambda x: x.reshape(-1), transposed((4, 8))),  # a copy
    ("reshape_split_dim_of_transposed", lambda x: x.reshape(2, 4, 4), transposed((4, 8))),
    ("flatten", lambda x: x.flatten(), rand((2, 3, 4))),
    ("flatten_start1", lambda x: torch.flatten(x, 1), rand((2, 3, 4))),
    ("permute", lambda x: x.permute(2, 0, 1), rand((2, 3, 4))),
    ("torch_permute_neg", lambda x: torch.permute(x, (-1, 0, 1)), rand((2, 3, 4))),
    ("transpose", lambda x: x.transpose(0, 1), rand((4, 8))),
    ("torch_transpose_12", lambda x: torch.transpose(x, 1, 2), rand((2, 3, 4))),
    ("dot_T", lambda x: x.T, rand((4, 8))),
    ("expand", lambda x: x.expand(3, 8), rand((8,))),
    ("expand_minus1", lambda x: x.expand(2, -1, -1), rand((1, 4, 8))),
    ("squeeze_all", lambda x: x.squeeze(), rand((4, 1, 8, 1))),
    ("squeeze_dim", lambda x: torch.squeeze(x, 1), rand((4, 1, 8))),
    ("unsqueeze_0", lambda x: x.unsqueeze(0), rand((4, 8))),
    ("unsqueeze_neg", lambda x: torch.unsqueeze(x, -1), rand((4, 8))),
    ("slice_steps", lambda x: x[::2, 1:-1], rand((5, 8))),
    ("slice_step3_cols", lambda x: x[:, ::3], rand((4, 8))),
    ("slice_negative", lambda x: x[-3:, -5:-1], rand((5, 8))),
    ("select_col", lambda x: x[:, 2], rand((4, 8))),
    ("select_negative_row", lambda x: x[-1], rand((4, 8))),
    ("select_method", lambda x: x.select(1, -2), rand((2, 3, 4))),
    ("index_then_slice", lambda x: x[1, ::2], rand((4, 8))),
    ("ellipsis_none", lambda x: x[..., None, 1:], rand((2, 3, 4))),
    ("narrow", lambda x: x.narrow(1, 2, 5), rand((4, 8))),
    ("torch_narrow_dim0", lambda x: torch.narrow(x, 0, 1, 2), rand((4, 8))),
    ("contiguous_of_contiguous", lambda x: x.contiguous(), rand((4, 8))),
    ("contiguous_of_transposed", lambda x: x.contiguous(), transposed((4, 8))),
    # Views of non-contiguous inputs.
    ("T_of_transposed", lambda x: x.T, transposed((4, 8))),
    ("slice_of_strided", lambda x: x[1:, ::2], strided((4, 8))),
    ("select_of_transposed", lambda x: x[:, 1], transposed((4, 8))),
    ("view_chain", lambda x: x.T.unsqueeze(0)[:, 1:].squeeze(0), rand((4, 8))),
]
for _name, _view, _maker in VIEWS:
    case(f"{_name}_returned", _view, _maker)
    case(f"{_name}_then_sin", lambda x, v=_view: v(x).sin() * 2, _maker)


def _split3(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    a, b, c = x.split(3, dim=1)
    return a.sin(), b * 2, c + 1


def _chunk2(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    a, b = torch.chunk(x, 2)
    return a - b, b.exp()


case("split_returned", lambda x: x.split(3, dim=1), rand((4, 8)))
case("split_sizes_returned", lambda x: torch.split(x, [2, 6], 1), rand((4, 8)))
case("chunk_returned", lambda x: x.chunk(3, 1), rand((4, 8)))
case("split_then_pointwise", _split3, rand((4, 8)))
case("chunk_then_pointwise", _chunk2, rand((4, 8)))
case("split_of_transposed", lambda x: x.split(2), transposed((4, 8)))
case("view_and_result", lambda x: (x.view(-1), x.sin()), rand((4, 8)))
case("view_of_computed", lambda x: (x + 1).view(2, 16).T, rand((4, 8)))
case("select_expand_add", lambda x, y: x[:, 2].unsqueeze(1).expand(4, 3) + y,
     rand((4, 8)), rand((4, 3)))

# cat and stack: new tensors, never views.
case("cat_dim1", lambda x, y: torch.cat([x, y], 1), rand((4, 8)), rand((4, 3)))
case("cat_dim0_tuple", lambda x, y: torch.cat((x, y)), rand((2, 8)), rand((3, 8)))
case("cat_then_sin", lambda x, y: torch.cat([x.exp(), y], -1).sin(), rand((4, 8)),
     transposed((4, 3)))
case("cat_f16_f32", lambda x, y: torch.cat([x, y]), rand((2, 8), f16), rand((2, 8)))
case("stack", lambda x, y: torch.stack([x, y]), rand((4, 8)), rand((4, 8)))
case("stack_dim1_then_mul", lambda x, y: torch.stack((x, y), dim=1) * 3, rand((4, 8)),
     strided((4, 8)))
case("stack_of_views", lambda x: torch.stack([x[0], x[1].sin(), x[2] * 2], -1), rand((3, 5)))

# cat and stack lower to one expression that reads each input at its place (no copy):
# every dim, several pieces, mixed dtypes, empty pieces, strided inputs, and consumers of
# every kind (pointwise, reductions, views, several at once).
case("cat_dim0_then_sin", lambda x, y: torch.cat([x, y], 0).sin(), rand((2, 8)), rand((3, 8)))
case("cat_dim1_of_pointwise", lambda x, y: torch.cat([x.sin(), y], 1).relu(), rand((4, 3)),
     rand((4, 5)))
case("cat_dim_minus1_three", lambda x, y, z: torch.cat([x, y.cos(), z * 2], -1) - 1,
     rand((2, 3, 4)), rand((2, 3, 1)), rand((2, 3, 5)))
# a chunk's gradient: two cats along the inner dim, each zero where the other is not (the
# C++ backend cuts the inner loop at the pieces' edges: codegen/cpp.cat_spans)
case("cat_halves_added", lambda x, y: torch.cat([x.exp(), torch.zeros_like(y)], -1)
     + torch.cat([torch.zeros_like(x), y.sin()], -1), rand((5, 7)), rand((5, 9)))
case("chunk_gate_inner_dim", lambda x: F.silu(x.chunk(2, -1)[0]) * x.chunk(2, -1)[1],
     rand((6, 10)))
# F.pad with constant fill: a cat of the fill value along each padded dim (lower_pad),
# fused into its consumers; crops and other modes stay the library call
case("pad_constant_2d", lambda x: F.pad(x, (2, 1, 1, 0)) * 2, rand((2, 3, 4, 5)))
case("pad_value_inner", lambda x: F.pad(x.sin(), (0, 3), value=-1.5) + 1, rand((3, 4)))
case("pad_transposed_half", lambda x: F.pad(x, (1, 2)).exp(), transposed((4, 6), f16))
case("pad_then_windows", lambda x, g: sum((g * F.pad(x, (1, 1, 1, 1))[:, :, i:i + 4, j:j + 4])
                                          .sum((0, 2, 3)) for i in range(3) for j in range(3)),
     rand((2, 3, 4, 4)), rand((2, 3, 4, 4)))
case("pad_crop", lambda x: F.pad(x, (-1, 2)) + 1, rand((3, 5)))
case("pad_reflect", lambda x: F.pad(x, (1, 1), mode="reflect") * 2, rand((2, 3, 5)))
case("pad_int", lambda x: F.pad(x, (1, 1), value=7) + 1, rand((3, 4), i64, "small_int"))
case("cat_middle_dim_three", lambda x, y, z: torch.cat((x, y, z), dim=1).exp(),
     rand((2, 1, 4)), rand((2, 3, 4)), rand((2, 2, 4)))
case("cat_negative_dim0", lambda x, y: torch.cat([x, y], -2) * 3, rand((2, 5)), rand((1, 5)))
case("concat_alias", lambda x, y: torch.concat([x, y], dim=1).abs(), rand((3, 2)), rand((3, 4)))
case("concatenate_axis", lambda x, y: torch.concatenate([x, y], axis=0) + 1, rand((2, 4)),
     rand((2, 4)))
case("cat_transposed_and_strided", lambda x, y, z: torch.cat([x, y, z], 1) * 2,
     transposed((4, 3)), strided((4, 5)), offset((4, 2)))
case("cat_of_views", lambda x: torch.cat([x[:, 4:], x[:, :4].T.reshape(4, 4)], 0).sin(),
     rand((4, 8)))
case("cat_int_and_float", lambda x, y: torch.cat([x, y], 1), rand((3, 4), i64),
     rand((3, 2)))
case("cat_f16_and_bf16", lambda x, y: torch.cat([x, y]) * 2, rand((2, 4), f16),
     rand((3, 4), bf16))
case("cat_bool_and_int", lambda x, y: torch.cat([x, y], -1) + 1, rand((3, 2), b8),
     rand((3, 3), i64))
case("cat_f16_pointwise", lambda x, y: torch.cat([x.sin(), y + 1], 1).exp(), rand((4, 3), f16),
     rand((4, 5), f16))
case("stack_bf16_last", lambda x, y: torch.stack([x * 2, y], -1).sigmoid(), rand((4, 3), bf16),
     rand((4, 3), bf16))
case("cat_empty_piece", lambda x, y, z: torch.cat([x, y, z], 1).sin(), rand((4, 3)),
     rand((4, 0)), rand((4, 5)))
case("cat_legacy_empty_1d", lambda x, e: torch.cat([e, x, e], 0) * 2, rand((2, 3)),
     rand((0,), torch.float64))
case("cat_single_input", lambda x: torch.cat([x]).neg(), rand((3, 4)))
case("cat_returned_and_consumed", lambda x, y: (torch.cat([x, y], 1),
                                                torch.cat([x, y], 1).sum(1)),
     rand((4, 3)), rand((4, 5)))
case("cat_read_twice", lambda x, y, z: (lambda c: (c.sin(), c.cos() * 2))(
    torch.cat([x, y.exp(), z], 0)), rand((2, 4)), rand((1, 4)), rand((3, 4)))
case("cat_of_cat", lambda x, y, z: torch.cat([torch.cat([x, y], 1), z], 0).tanh(),
     rand((2, 3)), rand((2, 2)), rand((1, 5)))
case("cat_then_transpose", lambda x, y: torch.cat([x, y], 1).T * 2, rand((3, 4)), rand((3, 2)))
case("cat_then_reshape", lambda x, y: torch.cat([x, y], 0).reshape(-1, 2) + 1, rand((2, 4)),
     rand((1, 4)))
case("stack_then_sum0", lambda x, y, z: torch.stack([x, y, z]).sum(0), rand((4, 5)),
     rand((4, 5)), rand((4, 5)), tol=MM_TOL)
case("softmax_of_cat", lambda x, y: F.softmax(torch.cat([x, y.sin()], -1), -1), rand((4, 5)),
     rand((4, 7)), tol=MM_TOL)
case("cat_sum_other_dim", lambda x, y: torch.cat([x, y], 1).sum(0), rand((6, 3)),
     rand((6, 4)), tol=MM_TOL)
case("layer_norm_of_cat", lambda x, y: F.layer_norm(torch.cat([x, y * 2], 1), (9,)),
     rand((3, 4)), transposed((3, 5)), tol=MM_TOL)
case("cat_of_embedding", lambda i, w, x: torch.cat([F.embedding(i, w), x], 1) * 2,
     lambda d: torch.randint(0, 10, (4,), device=d), rand((10, 3)), rand((4, 2)))
case("cat_transposed_returned", lambda x, y: torch.cat([x, y], 1), transposed((4, 3)),
     transposed((4, 5)))
case("cat_channels_last_returned", lambda x, y: torch.cat([x, y * 2], 1),
     lambda d: rand((2, 3, 4, 5))(d).to(memory_format=torch.channels_last),
     lambda d: rand((2, 2, 4, 5))(d).to(memory_format=torch.channels_last))
case("stack_of_scalars", lambda x, y: torch.stack([x.sum(), y.amax(), x[0, 0]]) * 2,
     rand((3, 4)), rand((5,)), tol=MM_TOL)
case("cat_piece_reads_row_max", lambda x: torch.cat([x[:, :4] - x.amax(1, keepdim=True),
                                                     x[:, 4:].exp()], 1),
     rand((4, 8)))
case("cat_sum_all", lambda x, y: torch.cat([x, y.cos()], 1).sum(), rand((3, 4)), rand((3, 2)),
     tol=MM_TOL)
case("cat_then_expand", lambda x, y: torch.cat([x, y], 1).expand(3, 5) * 2, rand((1, 3)),
     rand((1, 2)))
case("embedding_of_cat_weight", lambda i, w, v: F.embedding(i, torch.cat([w, v.sin()])) * 2,
     lambda d: torch.randint(0, 7, (5,), device=d), rand((3, 4)), rand((4, 4)))
case("gather_of_stack", lambda x, i: torch.gather(torch.stack([x, x.exp()], 1), 1, i),
     rand((3, 4)), lambda d: torch.randint(0, 2, (3, 2, 4), device=d))
case("cat_nine_pieces_library", lambda x: torch.cat([x[k:k + 1] for k in range(9)], 1).sin(),
     rand((9, 2)))
case("stack_nine_pieces_int", lambda x: torch.stack([x[k % 3] for k in range(9)], 0) * 2,
     rand((3, 4), i64))

# -- index ops ----------------------------------------------------------------------------


def indices(shape: tuple[int, ...], high: int) -> Callable:
    return lambda device: torch.randint(0, high, shape, device=device)


@functools.cache
def _embedding_module(device: torch.device) -> torch.nn.Embedding:
    return torch.nn.Embedding(10, 6, device=device).requires_grad_(False)


def embedding_module(device: torch.device) -> torch.nn.Embedding:
    """One module per device (a new module would be a new guard), with fresh weights."""
    m = _embedding_module(device)
    m.weight.copy_(torch.randn(10, 6, device=device))
    return m


case("embedding", lambda i, w: F.embedding(i, w), indices((3, 4), 10), rand((10, 6)))
case("embedding_pointwise", lambda i, w: F.embedding(i, w.sin()) * 2 + 1,
     indices((5,), 10), rand((10, 6)))
case("embedding_transposed_weight", lambda i, w: F.embedding(i, w), indices((2, 3), 10),
     transposed((10, 6)))
case("embedding_f16", lambda i, w: F.embedding(i, w).float().relu(), indices((4,), 10),
     rand((10, 6), f16))
case("nn_embedding", lambda m, i: m(i).tanh(), embedding_module, indices((3, 4), 10))
case("gather_dim1", lambda x, i: torch.gather(x, 1, i), rand((4, 8)), indices((4, 3), 8))
case("gather_dim0_method", lambda x, i: x.gather(0, i), rand((4, 8)), indices((2, 8), 4))
case("gather_pointwise", lambda x, i: torch.gather(x.exp(), 1, i) * 2 - 1,
     transposed((4, 8)), indices((4, 5), 8))
case("index_select_dim0", lambda x, i: torch.index_select(x, 0, i), rand((4, 8)),
     indices((6,), 4))
case("index_select_dim1_transposed", lambda x, i: x.index_select(1, i).sin(),
     transposed((4, 8)), indices((3,), 8))
case("index_select_i32_index", lambda x, i: torch.index_select(x, 1, i.int()) + x[:, :1],
     rand((4, 8)), indices((5,), 8))
# A 0-dim input is a row of one element: index 0 (a 0-dim or a one-element index).
case("index_select_0dim", lambda x, i: torch.index_select(x, 0, i) * 2, rand(()),
     indices((1,), 1))
case("index_select_0dim_0dim_index", lambda x, i: x.index_select(-1, i), rand(()),
     indices((), 1))
case("index_select_0dim_index", lambda x, i: torch.index_select(x, 1, i).exp(), rand((4, 8)),
     indices((), 8))
case("gather_0dim", lambda x, i: torch.gather(x, 0, i) + 1, rand(()), indices((), 1))
case("gather_0dim_1d_index", lambda x, i: x.gather(-1, i), rand(()), indices((3,), 1))

# Out-of-range indices: eager raises and so must the compiled function (checked in
# test_reductions.py, not here: there is no result to compare).
OUT_OF_RANGE: list[tuple[str, Callable, Callable]] = [
    ("embedding", lambda i, w: F.embedding(i, w) * 2,
     lambda d, bad: (torch.tensor([0, 3, 10 if bad else 9], device=d),
                     torch.randn(10, 4, device=d))),
    ("embedding_negative", lambda i, w: F.embedding(i, w) + 1,
     lambda d, bad: (torch.tensor([0, -1 if bad else 1], device=d), torch.randn(10, 4, device=d))),
    ("gather", lambda x, i: torch.gather(x.sin(), 1, i),
     lambda d, bad: (torch.randn(3, 4, device=d),
                     torch.tensor([[0], [4 if bad else 3], [1]], device=d))),
    ("embedding_in_a_cat", lambda i, w, x: torch.cat([x, F.embedding(i, w)], 1),
     lambda d, bad: (torch.tensor([0, 10 if bad else 9], device=d),
                     torch.randn(10, 4, device=d), torch.randn(2, 3, device=d))),
    ("index_select", lambda x, i: torch.index_select(x, 0, i) * 3,
     lambda d, bad: (torch.randn(3, 4, device=d), torch.tensor([2, 3 if bad else 0], device=d))),
    ("index_select_0dim", lambda x, i: torch.index_select(x, 0, i) + 1,
     lambda d, bad: (torch.randn((), device=d), torch.tensor([1 if bad else 0], device=d))),
    # Along a size-1 dim the loads read index 0 whatever the index: it is checked anyway.
    ("index_select_size1_dim", lambda x, i: torch.index_select(x, 0, i) * 2,
     lambda d, bad: (torch.randn(1, 4, device=d), torch.tensor([0, 1 if bad else 0], device=d))),
    ("embedding_one_row", lambda i, w: F.embedding(i, w) - 1,
     lambda d, bad: (torch.tensor([0, -1 if bad else 0], device=d), torch.randn(1, 4, device=d))),
    # Loss targets are gathered (decompose_losses.py): a target out of [0, C) that is not
    # ignore_index raises, as eager's "Target 4 is out of bounds" does.
    ("cross_entropy_target", lambda x, t: F.cross_entropy(x, t, label_smoothing=0.1),
     lambda d, bad: (torch.randn(3, 4, device=d),
                     torch.tensor([0, 4 if bad else 3, -100], device=d))),
    ("nll_loss_negative_target", lambda x, t, w: F.nll_loss(x, t, w, ignore_index=2),
     lambda d, bad: (torch.randn(3, 4, device=d), torch.tensor([0, -1 if bad else 1, 2], device=d),
                     torch.rand(4, device=d))),
]

# -- extern kernels with a pointwise prologue and epilogue ---------------------------------

case("mm", lambda x, w: torch.mm(x, w), rand((4, 8)), rand((8, 5)), tol=MM_TOL)
case("mm_prologue_epilogue", lambda x, w, b: F.gelu(x.sin() @ w + b), rand((4, 8)),
     rand((8, 5)), rand((5,)), tol=MM_TOL)
case("mm_transposed_inputs", lambda x, w: torch.mm(x.exp(), w).relu(), transposed((4, 8)),
     transposed((8, 5)), tol=MM_TOL)
case("bmm", lambda a, b: torch.bmm(a * 2, b).tanh(), rand((2, 3, 4)), rand((2, 4, 5)),
     tol=MM_TOL)
case("matmul_batched_broadcast", lambda a, b: torch.matmul(a.cos(), b) - 1, rand((2, 3, 4)),
     rand((4, 5)), tol=MM_TOL)
case("matmul_vector", lambda a, v: torch.matmul(a, v.sigmoid()) * 3, rand((3, 4)), rand((4,)),
     tol=MM_TOL)
case("matmul_operator_f16", lambda a, b: (a + 1) @ b, rand((4, 8), f16), rand((8, 3), f16),
     tol=MM_TOL)
case("linear", lambda x, w, b: F.linear(x.relu(), w, b).sigmoid(), rand((4, 8)), rand((5, 8)),
     rand((5,)), tol=MM_TOL)
case("linear_no_bias_3d", lambda x, w: F.linear(x, w) * 2, rand((2, 3, 8)), rand((5, 8)),
     tol=MM_TOL)
case("linear_bf16", lambda x, w, b: F.silu(F.linear(x * 0.5, w, b)), rand((4, 8), bf16),
     rand((5, 8), bf16), rand((5,), bf16), tol=MM_TOL)
case("addmm", lambda c, a, b: torch.addmm(c.exp(), a, b) / 2, rand((5,)), rand((4, 8)),
     rand((8, 5)), tol=MM_TOL)
case("addmm_alpha_beta", lambda c, a, b: torch.addmm(c, a.abs(), b, beta=0.5, alpha=2).neg(),
     rand((4, 5)), rand((4, 8)), rand((8, 5)), tol=MM_TOL)
case("baddbmm", lambda c, a, b: torch.baddbmm(c, a.sin(), b).relu(), rand((2, 3, 5)),
     rand((2, 3, 4)), rand((2, 4, 5)), tol=MM_TOL)
case("conv1d", lambda x, w, b: F.conv1d(x.relu(), w, b, padding=1).tanh(), rand((2, 3, 9)),
     rand((4, 3, 3)), rand((4,)), tol=MM_TOL)
case("conv2d", lambda x, w, b: F.gelu(F.conv2d(x * 2, w, b, stride=2) + 1), rand((2, 3, 7, 7)),
     rand((4, 3, 3, 3)), rand((4,)), tol=MM_TOL)
case("conv2d_no_bias_padding_same", lambda x, w: F.conv2d(x.sin(), w, padding="same").exp(),
     rand((1, 2, 5, 5)), rand((3, 2, 3, 3)), tol=MM_TOL)
for _causal in (False, True):
    case(f"sdpa_causal_{_causal}",
         lambda q, k, v, c=_causal: F.scaled_dot_product_attention(
             q * 0.5, k.sin(), v, is_causal=c).relu() + q,
         rand((2, 2, 5, 8)), rand((2, 2, 5, 8)), rand((2, 2, 5, 8)), tol=MM_TOL)
case("sdpa_transposed_q", lambda q, k, v: F.scaled_dot_product_attention(q, k, v) * 2,
     lambda d: rand((2, 5, 2, 8))(d).transpose(1, 2), rand((2, 2, 5, 8)), rand((2, 2, 5, 8)),
     tol=MM_TOL)
