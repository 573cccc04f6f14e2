"""Tensor indexing with integer tensors (gathers; positions from an ``iota`` read directly),
``new_ones``/``new_zeros`` and integer ``cumsum`` of short rows (a masked-row sum) compile
into kernels, not library calls: transformers' padding mask, RoBERTa's position ids, an
MoE's routing.  Every function is checked against eager twice, with fresh inputs."""

from __future__ import annotations

import pytest
import torch

import minicompile
from minicompile import config


def _compiled_code(fn, make_args, backend: str, capsys: pytest.CaptureFixture) -> str:
    """Compile ``fn``, check two calls on fresh inputs against eager; the generated code."""
    capsys.readouterr()
    with config.patch(logs=frozenset({"output_code"})):
        compiled = minicompile.compile(fn, backend=backend)
        for _ in range(2):
            args = make_args()
            torch.testing.assert_close(compiled(*args), fn(*args))
    return capsys.readouterr().err


def _library_calls(code: str, *names: str) -> list[str]:
    return [line for line in code.splitlines() if any(f"{n}(" in line for n in names)
            and not line.strip().startswith(("#", "//"))]


def padding_mask(pm: torch.Tensor) -> torch.Tensor:
    """transformers' sdpa_mask without vmap (masking_utils.py): and_masks of the
    bidirectional mask and ``padding_mask[batch_idx, kv_idx]`` over broadcast aranges."""
    b, n = pm.shape
    batch = torch.arange(b, device=pm.device)[:, None, None, None]
    q = (torch.arange(n, device=pm.device) + 0)[None, None, :, None]
    kv = (torch.arange(n, device=pm.device) + 0)[None, None, None, :]
    result = q.new_ones((), dtype=torch.bool)
    result = result & (q >= 0)
    result = result & pm.to(torch.bool)[batch, kv]
    return result.expand(b, -1, n, n)


def test_padding_mask_is_one_kernel(backend: str, device: torch.device,
                                    capsys: pytest.CaptureFixture) -> None:
    code = _compiled_code(padding_mask, lambda: (torch.randint(0, 2, (2, 12), device=device),),
                          backend, capsys)
    assert not _library_calls(code, "__getitem__", "new_ones")
    assert minicompile.stats()["kernels"] == 1
    assert "index out of range" not in code  # iota positions: provably in range, unchecked


def routing(x: torch.Tensor, idx: torch.Tensor, j: torch.Tensor) -> tuple:
    """Mixtral's MoE indexing: rows by a data index (negatives wrap), two broadcast
    indices, a 2-d int32 index, and a row gather of a computed value."""
    return x[idx], x[idx[:, None], j], x[j.to(torch.int32)[None, :].expand(2, -1)], \
        (x.sin() * 2)[idx // 2]


@pytest.mark.parametrize("length", [7, 1])
def test_tensor_indices_match_eager(backend: str, device: torch.device, length: int,
                                    capsys: pytest.CaptureFixture) -> None:
    def make() -> tuple:
        return (torch.randn(12, 5, device=device), torch.randint(-12, 12, (length,), device=device),
                torch.randint(-5, 5, (3,), device=device))

    code = _compiled_code(routing, make, backend, capsys)
    assert not _library_calls(code, "__getitem__")
    if device.type == "cuda":  # a device-side assert, as eager's: it would leave the
        return  # process's CUDA context unusable (test_reductions checks it in a process)
    compiled = minicompile.compile(routing, backend=backend)
    x, idx, j = make()
    with pytest.raises(IndexError):  # as eager: an index out of range raises
        compiled(x, torch.full_like(idx, 12), j)


def positions(mask: torch.Tensor, counts: torch.Tensor) -> tuple:
    """RoBERTa's position ids, an MoE's expert offsets (float counts, int32 sums), a bool
    cumsum, and a float one (the library call: another summation order)."""
    ids = (torch.cumsum(mask, dim=1).type_as(mask) + 0) * mask + 1
    return (ids, torch.cumsum(counts, dim=0, dtype=torch.int32), (mask > 0).cumsum(0),
            counts.cumsum(-1), mask.new_zeros(2, 3, dtype=torch.float32) + 1)


def test_integer_cumsum_is_a_reduction(backend: str, device: torch.device,
                                       capsys: pytest.CaptureFixture) -> None:
    def make() -> tuple:
        return (torch.randint(0, 2, (3, 12), device=device),
                torch.randint(0, 9, (4,), device=device).float())

    code = _compiled_code(positions, make, backend, capsys)
    assert len(_library_calls(code, "cumsum")) == 1  # the float one
    assert not _library_calls(code, "new_zeros")


def indexed_loss(x: torch.Tensor, idx: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
    return (x[idx] * 2).sum() + x[idx[:, None], j].pow(2).sum() + torch.cumsum(j, 0).sum()


def test_gradients_flow_through_tensor_indices(backend: str, device: torch.device) -> None:
    """The gathers' backward (a scatter-add, repeated rows summed) gives eager's gradient."""
    compiled = minicompile.compile(indexed_loss, backend=backend)
    for _ in range(2):
        x = torch.randn(12, 5, device=device, requires_grad=True)
        idx = torch.randint(-12, 12, (7,), device=device)
        j = torch.randint(-5, 5, (3,), device=device)
        x2 = x.detach().clone().requires_grad_()
        compiled(x, idx, j).backward()
        indexed_loss(x2, idx, j).backward()
        torch.testing.assert_close(x.grad, x2.grad)
