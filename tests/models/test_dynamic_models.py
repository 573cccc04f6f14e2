"""Library models under dynamic shapes (issue #33): each model of the zoo compiles once with
``dynamic=True`` over several batch sizes and lengths (image sizes for CNNs; the batch
alone where the model fixes the size, as a ViT's patches do), and at most three times with
automatic dynamic shapes (static, then the batch symbolic, then the length too).  Every
call is compared with eager on fresh inputs.

One small model of each family runs by default (for automatic dynamic shapes, a CNN and
two decoders); ``MINICOMPILE_TEST_ZOO=1`` runs the whole zoo (long on a 2-core CPU).
"""

from __future__ import annotations

import os

import pytest
import torch

import minicompile

from devices import device_for
from model_zoo import MODELS, ModelCase
from test_models import assert_same

# one of each family: CNN, ViT (batch only), encoder, decoder, encoder-decoder
FAMILIES = ("torchvision_squeezenet1_1", "torchvision_vit", "hf_bert", "hf_gpt2", "hf_t5")
ZOO = os.environ.get("MINICOMPILE_TEST_ZOO") == "1"
CASES = [c for c in MODELS if ZOO or c.name in FAMILIES]
AUTOMATIC = [c for c in MODELS if ZOO or c.name in (
    "torchvision_squeezenet1_1", "hf_gpt2", "hf_llama")]


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
            assert_same(compiled(*args, **kwargs), model(*args, **kwargs), torch.float32)
    stats = minicompile.stats()
    assert stats["graph_breaks"] == 0 and stats["eager_fallbacks"] == 0, stats
    return stats


@pytest.mark.parametrize("case", CASES, ids=str)
def test_dynamic_true_compiles_once(case: ModelCase, backend: str) -> None:
    stats = call_over_sizes(case, backend, dynamic=True)
    assert (stats["frames"], stats["recompiles"]) == (1, 0), stats


@pytest.mark.parametrize("case", AUTOMATIC, ids=str)
def test_automatic_dynamic_compiles_at_most_three_times(case: ModelCase, backend: str) -> None:
    stats = call_over_sizes(case, backend, dynamic=None)
    assert stats["frames"] <= 3, stats
