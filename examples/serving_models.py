"""The models the serving benchmark (bench_serving.py) and the CUDA export tests
(tests/export/test_export_cuda.py) export: resnet18 (torchvision, random weights), a small
GPT (gpt.py) and a tiny transformers BERT, each in eval mode.

``SERVED[name]()`` gives (module, the function to export (the module, or a function of
tensors calling it), ``inputs(batch)``: a tuple of fresh CPU tensors).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from model_report import import_torchvision

Served = tuple[torch.nn.Module, Callable, Callable[[int], tuple]]


def resnet18() -> Served:
    import_torchvision()
    import torchvision

    model = torchvision.models.resnet18(weights=None).eval()
    return model, model, lambda b: (torch.randn(b, 3, 64, 64),)


def gpt() -> Served:
    from gpt import GPT, GPTConfig

    config = GPTConfig(n_layer=2, n_embd=128)
    model = GPT(config).eval()
    return model, model, lambda b: (torch.randint(0, config.vocab_size, (b, config.block_size)),)


def bert() -> Served:
    import_torchvision()
    from transformers import BertConfig, BertModel

    model = BertModel(BertConfig(vocab_size=100, hidden_size=64, num_hidden_layers=2,
                                 num_attention_heads=4, intermediate_size=128,
                                 max_position_embeddings=64)).eval()

    def encode(ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return model(input_ids=ids, attention_mask=mask).last_hidden_state

    def inputs(b: int) -> tuple:
        mask = torch.ones(b, 12, dtype=torch.long)
        mask[-1, 8:] = 0  # the last sentence padded
        return torch.randint(0, 100, (b, 12)), mask

    return model, encode, inputs


SERVED: dict[str, Callable[[], Served]] = {"resnet18": resnet18, "gpt": gpt, "bert": bert}
