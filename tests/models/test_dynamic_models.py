"""Library models under dynamic shapes (issue #33): each model of the zoo compiles once with
``dynamic=True`` over several batch sizes and lengths (image sizes for CNNs; the batch
alone where the model fixes the size, as a ViT's patches do), and at most three times with
automatic dynamic shapes (static, then the batch symbolic, then the length too).  Every
call is compared with eager on fresh inputs.

By default (CI time) a CNN, a decoder and an encoder-decoder run under ``dynamic=True``
and the decoder under automatic dynamic shapes; ``MINICOMPILE_TEST_ZOO=1`` runs the whole
zoo both ways (long on a 2-core CPU).  tests/dynamic/test_symbolic_views.py has the small
cases: reshapes over products of symbols, convolutions and pooling over symbolic sizes.
"""

from __future__ import annotations

import os

import pytest
import torch

import minicompile

from devices import device_for, expect_one_compile
from model_zoo import MODELS, ModelCase, tensors_of

ZOO = os.environ.get("MINICOMPILE_TEST_ZOO") == "1"
CASES = [c for c in MODELS if ZOO or c.name in ("torchvision_squeezenet1_1", "hf_gpt2", "hf_t5")]
AUTOMATIC = [c for c in MODELS if ZOO or c.name == "hf_gpt2"]


def assert_close(actual: object, expected: object) -> None:
    """Every returned tensor as test_models compares them, with the absolute tolerance
    grown with the tensor's scale: timm's mobilenetv3 at 80x80 returns logits near 2000,
    where eager's float32 itself is 0.01 off its float64 result."""
    got, want = tensors_of(actual), tensors_of(expected)
    assert len(got) == len(want)
    for a, e in zip(got, want):
        if isinstance(e, torch.Tensor) and e.is_floating_point() and e.numel():
            torch.testing.assert_close(a, e, rtol=1e-3, atol=1e-4 + 1e-5 * e.abs().max())
        elif isinstance(e, torch.Tensor):
            torch.testing.assert_close(a, e)
        else:
            assert a == e


def call_over_sizes(case: ModelCase, backend: str, dynamic: bool | None,
                    sizes: tuple = ()) -> dict[str, int]:
    """Compile ``case`` and call it over ``sizes`` (its own by default), each call checked
    against eager; the stats after."""
    device = device_for(backend)
    torch.manual_seed(0)
    model = case.build().eval().to(device)
    compiled = minicompile.compile(model, backend=backend, dynamic=dynamic)
    for batch, length in sizes or case.sizes:
        extra = {} if length is None else {"length": length}
        args, kwargs = case.inputs(device, batch=batch, **extra)
        with torch.no_grad():
            assert_close(compiled(*args, **kwargs), model(*args, **kwargs))
    stats = minicompile.stats()
    assert stats["graph_breaks"] == 0 and stats["eager_fallbacks"] == 0, stats
    return stats


@pytest.mark.parametrize("case", CASES, ids=str)
def test_dynamic_true_compiles_once(case: ModelCase, backend: str) -> None:
    stats = call_over_sizes(case, backend, dynamic=True)
    expect_one_compile(case.float_inputs, stats)  # (images: pooling)
    assert stats["recompiles"] == 0, stats


@pytest.mark.parametrize("case", AUTOMATIC, ids=str)
def test_automatic_dynamic_compiles_at_most_three_times(case: ModelCase, backend: str) -> None:
    stats = call_over_sizes(case, backend, dynamic=None)
    assert stats["frames"] <= 3, stats
