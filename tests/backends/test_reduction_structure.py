"""Structure of issue #4's reductions beside their values: a normalisation is one kernel,
pointwise work feeding or reading it fuses into it, and reductions of one input over the
same rows share a kernel.  Every value is still compared with eager."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

import minicompile

TOL = dict(rtol=1e-5, atol=1e-5)


def residual_layer_norm(x: torch.Tensor, r: torch.Tensor, w: torch.Tensor,
                        b: torch.Tensor) -> torch.Tensor:
    return F.layer_norm(x + r, (x.shape[-1],), w, b)


def sum_and_amax(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return x.sum(1), x.amax(1)


ONE_KERNEL: list[tuple[str, Callable, tuple[tuple[int, ...], ...]]] = [
    ("softmax", lambda x: F.softmax(x, -1), ((4, 33),)),
    ("log_softmax", lambda x: F.log_softmax(x, -1), ((4, 33),)),
    ("layer_norm", lambda x, w, b: F.layer_norm(x, (33,), w, b), ((4, 33), (33,), (33,))),
    ("layer_norm_no_affine", lambda x: F.layer_norm(x, (33,)), ((4, 33),)),
    ("rms_norm", lambda x, w: F.rms_norm(x, (33,), w), ((4, 33), (33,))),
    ("residual_layer_norm", residual_layer_norm, ((4, 33), (4, 33), (33,), (33,))),
    ("sum_and_amax_share", sum_and_amax, ((4, 33),)),
    ("softmax_with_prologue_epilogue", lambda x: F.softmax(x.sin() * 2, -1) + 1, ((4, 33),)),
    # Statistics over (N, H, W) per channel: the output's dims interleave the kept and the
    # reduced ones (spaces._interleaving), and still fuse with the reduction.
    ("batch_norm_train", lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True),
     ((2, 6, 5, 3), (6,), (6,))),
    ("channel_centering", lambda x: x - x.mean((0, 2, 3), keepdim=True), ((2, 6, 5, 3),)),
]


def batch_norm_relu(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, rm: torch.Tensor,
                    rv: torch.Tensor) -> torch.Tensor:
    return F.relu(F.batch_norm(x, rm, rv, w, b, training=True)) + 1


@pytest.mark.parametrize("shape", [(2, 8, 4, 4), (3, 5, 7, 6), (2, 4, 4, 4)],
                         ids=["unique_order", "odd_sizes", "ambiguous_order"])
def test_batch_norm_train_values(shape: tuple, device: torch.device, backend: str) -> None:
    """Values and running statistics equal eager's, contiguous and channels-last, twice
    (channels 4 beside 4x4 images: the dims' order is ambiguous, the kernels stay apart)."""
    compiled = minicompile.compile(batch_norm_relu, backend=backend)
    c = shape[1]
    for memory_format in (torch.contiguous_format, torch.channels_last, torch.channels_last):
        x = torch.randn(shape, device=device).to(memory_format=memory_format)
        w, b = torch.randn(c, device=device), torch.randn(c, device=device)
        rm, rv = torch.randn(c, device=device), torch.rand(c, device=device) + 0.5
        rm2, rv2 = rm.clone(), rv.clone()
        torch.testing.assert_close(compiled(x, w, b, rm, rv), batch_norm_relu(x, w, b, rm2, rv2),
                                   **TOL)
        torch.testing.assert_close((rm, rv), (rm2, rv2), **TOL)


@pytest.mark.parametrize("name, fn, shapes", ONE_KERNEL, ids=[c[0] for c in ONE_KERNEL])
def test_is_one_kernel(name: str, fn: Callable, shapes: tuple, device: torch.device,
                       backend: str) -> None:
    compiled = minicompile.compile(fn, backend=backend)
    args = [torch.randn(s, device=device) for s in shapes]
    torch.testing.assert_close(compiled(*args), fn(*args), **TOL)
    stats = minicompile.stats()
    assert stats["eager_fallbacks"] == 0 and stats["graphs"] == 1, stats
    assert stats["kernels"] == 1, f"{name}: {stats['kernels']} kernels, expected 1"


# -- decomposed library calls: no extern left, and few kernels ------------------------------


def _targets(n: int, c: int) -> Callable[[torch.device], torch.Tensor]:
    return lambda d: torch.randint(0, c, (n,), device=d)


def _randn(*shape: int) -> Callable[[torch.device], torch.Tensor]:
    return lambda d: torch.randn(shape, device=d)


# name, fn, input makers, most kernels: the row reductions and the pick of each target's
# class share a kernel; a loss reduced over the batch adds one.
DECOMPOSED: list[tuple[str, Callable, tuple[Callable, ...], int]] = [
    ("group_norm", lambda x, w, b: F.group_norm(x, 2, w, b),
     (_randn(2, 4, 3, 3), _randn(4), _randn(4)), 2),
    ("cross_entropy_mean", lambda x, t: F.cross_entropy(x, t), (_randn(6, 5), _targets(6, 5)), 2),
    ("cross_entropy_none", lambda x, t: F.cross_entropy(x, t, reduction="none"),
     (_randn(6, 5), _targets(6, 5)), 1),
    ("cross_entropy_smoothing_weight", lambda x, t, w: F.cross_entropy(x, t, w, label_smoothing=0.1),
     (_randn(6, 5), _targets(6, 5), _randn(5)), 2),
    ("cross_entropy_probs", lambda x, p: F.cross_entropy(x, p.softmax(1)),
     (_randn(6, 5), _randn(6, 5)), 2),
    ("nll_loss_weight", lambda x, t, w: F.nll_loss(x, t, w), (_randn(6, 5), _targets(6, 5),
                                                              _randn(5)), 1),
    # The maximum and the first position holding it: two passes over the row, one kernel.
    ("argmax", lambda x: x.argmax(-1), (_randn(4, 33),), 1),
    ("argmin_all", lambda x: torch.argmin(x), (_randn(3, 5, 7),), 1),
    ("max_dim_values_indices", lambda x: x.max(1), (_randn(4, 33),), 1),
    ("min_dim_named_indices", lambda x: x.min(dim=0).indices + 1, (_randn(4, 33),), 1),
]


def _library_calls(fn: Callable, args: list) -> list[str]:
    """The extern ops left in ``fn``'s graphs after the graph passes."""
    from minicompile import ops
    from minicompile.passes.pipeline import run_graph_passes

    graphs = minicompile.explain(fn)(*args).graphs
    return [n.target for g in graphs for n in run_graph_passes(g)[0].calls()
            if ops.OPS[n.target].family in ("extern", "tuple")]


@pytest.mark.parametrize("name, fn, makers, most", DECOMPOSED, ids=[c[0] for c in DECOMPOSED])
def test_decomposed_has_no_library_call(name: str, fn: Callable, makers: tuple, most: int,
                                        device: torch.device, backend: str) -> None:
    args = [m(device) for m in makers]
    assert _library_calls(fn, args) == [], f"{name} still calls a library kernel"
    compiled = minicompile.compile(fn, backend=backend)
    torch.testing.assert_close(compiled(*args), fn(*args), **TOL)
    stats = minicompile.stats()
    assert stats["eager_fallbacks"] == 0 and stats["graphs"] == 1, stats
    assert stats["kernels"] <= most, f"{name}: {stats['kernels']} kernels, expected <= {most}"
