"""Library models compiled whole: torchvision, timm and transformers, as their users call them.

Each model is compiled with ``fullgraph=True`` (any graph break raises), called twice with
fresh random inputs, and compared with eager PyTorch on every returned tensor (ModelOutput
fields, the KV cache); the stats must show one graph, no break, no eager fallback and no
recompile.  bfloat16 runs on the GPU, where the Triton backend runs real kernels.
"""

from __future__ import annotations

import pytest
import torch

import minicompile

from devices import CUDA, device_for
from model_zoo import MODELS, ModelCase, tensors_of

DTYPES = (torch.float32, torch.bfloat16) if CUDA else (torch.float32,)
TOLERANCES = {torch.float32: {"rtol": 1e-3, "atol": 1e-4}, torch.bfloat16: {"rtol": 3e-2, "atol": 3e-2}}


def assert_same(actual: object, expected: object, dtype: torch.dtype) -> None:
    got, want = tensors_of(actual), tensors_of(expected)
    assert len(got) == len(want)
    for a, e in zip(got, want):
        if isinstance(e, torch.Tensor):
            torch.testing.assert_close(a, e, **TOLERANCES[dtype])
        else:
            assert a == e


# CI time: models checked on the C++ backend only where Triton's interpreter (no GPU)
# takes too long; on a GPU they run on both.
INTERPRETER_TOO_SLOW = {"timm_densenet121": "121 layers: 50 s under Triton's interpreter"}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", MODELS, ids=str)
@torch.no_grad()
def test_model_compiles_whole_and_matches_eager(
    case: ModelCase, backend: str, dtype: torch.dtype
) -> None:
    device = device_for(backend)
    if backend == "triton" and not CUDA and case.name in INTERPRETER_TOO_SLOW:
        pytest.skip(INTERPRETER_TOO_SLOW[case.name])
    torch.manual_seed(0)
    model = case.build().eval().to(device=device, dtype=dtype)
    compiled = minicompile.compile(model, backend=backend, fullgraph=True)
    for seed in (1, 2):
        torch.manual_seed(seed)
        args, kwargs = case.inputs(device)
        if case.float_inputs:
            args = tuple(a.to(dtype) for a in args)
        assert_same(compiled(*args, **kwargs), model(*args, **kwargs), dtype)
    stats = minicompile.stats()
    assert (stats["graphs"], stats["graph_breaks"]) == (1, 0), stats
    assert (stats["eager_fallbacks"], stats["recompiles"]) == (0, 0), stats
    assert stats["kernels"] > 0


@torch.no_grad()
def test_mixtral_in_bfloat16_asks_transformers_version_probes_while_tracing(backend: str) -> None:
    """In bfloat16 Mixtral's experts ask transformers' is_torch_less_or_equal (a probe marked
    as Dynamo's assume_constant_result) on the way to F.grouped_mm: answered and guarded."""
    case = next(c for c in MODELS if c.name == "hf_mixtral")
    device = device_for(backend)
    torch.manual_seed(0)
    model = case.build().eval().to(device=device, dtype=torch.bfloat16)
    compiled = minicompile.compile(model, backend=backend, fullgraph=True)
    for seed in (1, 2):
        torch.manual_seed(seed)
        args, kwargs = case.inputs(device)
        assert_same(compiled(*args, **kwargs), model(*args, **kwargs), torch.bfloat16)
    stats = minicompile.stats()
    assert (stats["graphs"], stats["graph_breaks"], stats["eager_fallbacks"]) == (1, 0, 0)
