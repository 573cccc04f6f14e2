"""Models that people run, built from the libraries they come from, with tiny random-init
configs (no weights to download), and the inputs their users pass.

Each :class:`ModelCase` builds the model (seeded) and makes fresh inputs on each call, as
``(args, kwargs)``: the transformers models are called with keyword arguments
(``model(**encoded_input)``), exactly as in the PyTorch 2.0 tutorial.

Used by the model tests (``tests/models``) and ``bench_models.py``.  torchvision is imported
through ``model_report.import_torchvision``: PyPI's torchvision wheels are CUDA builds whose
C++ operators cannot load beside the CPU build of torch that CI installs; the models here
use none of them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from model_report import import_torchvision

Inputs = tuple[tuple, dict[str, Any]]


@dataclasses.dataclass(frozen=True)
class ModelCase:
    name: str
    build: Callable[[], torch.nn.Module]
    inputs: Callable[..., Inputs]  # fresh random inputs on each call: (device, [batch, length])
    float_inputs: bool = True  # inputs to cast to a low-precision dtype with the model
    # (batch, length) pairs it is called with under dynamic shapes; the length is an image's
    # height and width, or None where the model fixes it (a ViT's patches, a mixer's MLP)
    sizes: tuple[tuple[int, int | None], ...] = ((2, 12), (3, 12), (4, 16), (5, 9))

    def __str__(self) -> str:
        return self.name


def _images(size: int = 64) -> Callable[..., Inputs]:
    """Images of ``length`` (default ``size``) pixels a side."""

    def inputs(device: torch.device, batch: int = 2, length: int | None = None) -> Inputs:
        side = length or size
        return (torch.randn(batch, 3, side, side, device=device),), {}

    return inputs


IMAGE_SIZES = ((2, 64), (3, 64), (4, 80), (5, 72))  # (48 would end at 1x1, specialised)
BATCHES_ONLY = ((2, None), (3, None), (4, None), (5, None))


def _tokens(vocab: int, batch: int = 2, length: int = 12) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, length))


def _bert_inputs(device: torch.device, batch: int = 2, length: int = 12) -> Inputs:
    """What a tokenizer returns for ``batch`` sentences, the last one padded."""
    ids = _tokens(100, batch, length)
    mask = torch.ones_like(ids)
    mask[-1, length * 2 // 3:] = 0
    ids[-1, length * 2 // 3:] = 0
    encoded = {"input_ids": ids, "token_type_ids": torch.zeros_like(ids), "attention_mask": mask}
    return (), {k: v.to(device) for k, v in encoded.items()}


def _roberta_inputs(device: torch.device, batch: int = 2, length: int = 12) -> Inputs:
    """What RoBERTa's tokenizer returns: no token types, and padding id 1 (RoBERTa numbers
    positions from the tokens that are not padding)."""
    _, kwargs = _bert_inputs(device, batch, length)
    ids, mask = kwargs["input_ids"], kwargs["attention_mask"]
    return (), {"input_ids": ids + (mask == 0).to(ids.dtype), "attention_mask": mask}


def _distilbert_inputs(device: torch.device, batch: int = 2, length: int = 12) -> Inputs:
    """What DistilBERT's tokenizer returns: no token types."""
    _, kwargs = _bert_inputs(device, batch, length)
    return (), {k: kwargs[k] for k in ("input_ids", "attention_mask")}


def _causal_lm_inputs(device: torch.device, batch: int = 2, length: int = 12) -> Inputs:
    return (), {"input_ids": _tokens(100, batch, length).to(device)}


def _seq2seq_inputs(device: torch.device, batch: int = 2, length: int = 12) -> Inputs:
    return (), {"input_ids": _tokens(100, batch, length).to(device),
                "decoder_input_ids": _tokens(100, batch, length - 5).to(device)}


def _torchvision_vit() -> torch.nn.Module:
    """torchvision's ViT: nn.MultiheadAttention in each encoder block."""
    import_torchvision()
    import torchvision

    return torchvision.models.VisionTransformer(image_size=32, patch_size=8, num_layers=2,
                                                num_heads=4, hidden_dim=32, mlp_dim=64,
                                                num_classes=10)


def _torchvision(name: str) -> Callable[[], torch.nn.Module]:
    def build() -> torch.nn.Module:
        import_torchvision()
        import torchvision

        return getattr(torchvision.models, name)(num_classes=10)

    return build


def _as_trained(build: Callable[[], torch.nn.Module]) -> Callable[[], torch.nn.Module]:
    """The model with what training would give it where random init leaves outputs that
    test nothing: its batch norms' running statistics taken from a batch (the defaults,
    mean 0 and variance 1, shrink mobilenet_v2's logits in eval to 1e-9, below any
    tolerance), and zero-initialised linear layers (the classifier of timm's mixer: zero
    logits and zero gradients) given small random weights."""

    def build_it() -> torch.nn.Module:
        model = build()
        with torch.no_grad():
            for m in model.modules():
                if isinstance(m, torch.nn.Linear) and not m.weight.any():
                    torch.nn.init.normal_(m.weight, std=0.02)
        norms = [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
        momenta = [m.momentum for m in norms]
        for m in norms:
            m.momentum = 1.0  # running statistics := the batch's
        if norms:
            with torch.no_grad():
                model.train()(torch.randn(2, 3, 64, 64))
        for m, momentum in zip(norms, momenta):
            m.momentum = momentum
        return model

    return build_it


def _timm(name: str, **kwargs: Any) -> Callable[[], torch.nn.Module]:
    def build() -> torch.nn.Module:
        import_torchvision()  # timm and transformers import it
        import timm

        return timm.create_model(name, pretrained=False, **kwargs)

    return build


def _bert() -> torch.nn.Module:
    import_torchvision()
    from transformers import BertConfig, BertModel

    return BertModel(BertConfig(vocab_size=100, hidden_size=64, num_hidden_layers=2,
                                num_attention_heads=4, intermediate_size=128,
                                max_position_embeddings=64))


def _roberta() -> torch.nn.Module:
    import_torchvision()
    from transformers import RobertaConfig, RobertaModel

    return RobertaModel(RobertaConfig(vocab_size=100, hidden_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, intermediate_size=128,
                                      max_position_embeddings=64))


def _distilbert() -> torch.nn.Module:
    import_torchvision()
    from transformers import DistilBertConfig, DistilBertModel

    return DistilBertModel(DistilBertConfig(vocab_size=100, dim=64, n_layers=2, n_heads=4,
                                            hidden_dim=128, max_position_embeddings=64))


def _gpt2() -> torch.nn.Module:
    import_torchvision()
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(GPT2Config(vocab_size=100, n_embd=64, n_layer=2, n_head=4,
                                      n_positions=64, bos_token_id=0, eos_token_id=0))


def _t5() -> torch.nn.Module:
    import_torchvision()
    from transformers import T5Config, T5ForConditionalGeneration

    return T5ForConditionalGeneration(T5Config(vocab_size=100, d_model=64, d_kv=16, d_ff=128,
                                               num_layers=2, num_heads=4,
                                               decoder_start_token_id=0))


def _bart() -> torch.nn.Module:
    """BART: its decoder copies and edits the config in ``forward`` (huggingface_hub's
    validated dataclasses run in the trace)."""
    import_torchvision()
    from transformers import BartConfig, BartModel

    return BartModel(BartConfig(vocab_size=100, d_model=64, encoder_layers=2, decoder_layers=2,
                                encoder_attention_heads=4, decoder_attention_heads=4,
                                encoder_ffn_dim=128, decoder_ffn_dim=128,
                                max_position_embeddings=64))


def _llama() -> torch.nn.Module:
    import_torchvision()
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(LlamaConfig(vocab_size=100, hidden_size=64, intermediate_size=128,
                                        num_hidden_layers=2, num_attention_heads=4,
                                        num_key_value_heads=2, max_position_embeddings=64))


def _mixtral() -> torch.nn.Module:
    """Mixtral: under a compiler (and in float32) its experts run transformers' custom
    operator ``torch.ops.transformers.grouped_mm_fallback``, a library call of the graph."""
    import_torchvision()
    from transformers import MixtralConfig, MixtralForCausalLM

    return MixtralForCausalLM(MixtralConfig(
        vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        num_local_experts=4, num_experts_per_tok=2))


MODELS: tuple[ModelCase, ...] = (
    ModelCase("torchvision_resnet18", _torchvision("resnet18"), _images(), sizes=IMAGE_SIZES),
    ModelCase("torchvision_vit", _torchvision_vit, _images(size=32), sizes=BATCHES_ONLY),
    ModelCase("timm_resnext26ts", _timm("resnext26ts", num_classes=2), _images(),
              sizes=IMAGE_SIZES),
    ModelCase("timm_vit_tiny", _timm("vit_tiny_patch16_224", img_size=64, num_classes=10),
              _images(), sizes=BATCHES_ONLY),
    ModelCase("timm_efficientnet_b0", _timm("efficientnet_b0", num_classes=10), _images(),
              sizes=IMAGE_SIZES),
    ModelCase("torchvision_mobilenet_v2", _as_trained(_torchvision("mobilenet_v2")), _images(),
              sizes=IMAGE_SIZES),
    ModelCase("torchvision_squeezenet1_1", _torchvision("squeezenet1_1"), _images(),
              sizes=IMAGE_SIZES),
    ModelCase("timm_convnext_atto", _timm("convnext_atto", num_classes=10), _images(),
              sizes=IMAGE_SIZES),
    ModelCase("timm_mobilenetv3_small_100",
              _as_trained(_timm("mobilenetv3_small_100", num_classes=10)), _images(),
              sizes=IMAGE_SIZES),
    ModelCase("timm_densenet121", _timm("densenet121", num_classes=10), _images(),
              sizes=IMAGE_SIZES),
    ModelCase("timm_mixer_s16", _as_trained(_timm("mixer_s16_224", img_size=64, num_classes=10)),
              _images(), sizes=BATCHES_ONLY),
    ModelCase("hf_bert", _bert, _bert_inputs, float_inputs=False),
    ModelCase("hf_roberta", _roberta, _roberta_inputs, float_inputs=False),
    ModelCase("hf_distilbert", _distilbert, _distilbert_inputs, float_inputs=False),
    ModelCase("hf_gpt2", _gpt2, _causal_lm_inputs, float_inputs=False),
    ModelCase("hf_t5", _t5, _seq2seq_inputs, float_inputs=False),
    ModelCase("hf_bart", _bart, _seq2seq_inputs, float_inputs=False),
    ModelCase("hf_llama", _llama, _causal_lm_inputs, float_inputs=False),
    ModelCase("hf_mixtral", _mixtral, _causal_lm_inputs, float_inputs=False),
)


def tensors_of(value: Any) -> list[Any]:
    """Every tensor (and other leaf) a model returned, in a fixed order: ModelOutput and
    dict values by key, tuple items, and the attributes of other objects (a KV cache)."""
    if isinstance(value, torch.Tensor) or value is None or isinstance(value, (int, float, str)):
        return [value]
    if isinstance(value, dict):
        return [("key", k) for k in value] + [x for v in value.values() for x in tensors_of(v)]
    if isinstance(value, (tuple, list)):
        return [x for v in value for x in tensors_of(v)]
    if hasattr(value, "__dict__"):
        attrs = vars(value)
        return [type(value)] + [x for k in sorted(attrs) for x in tensors_of(attrs[k])]
    return [value]
