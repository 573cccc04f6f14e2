"""Which library models compile whole: 53 timm, torchvision and transformers models (tiny
random-init configurations, beside the model suite's 8) compiled with ``fullgraph=True``,
called twice on fresh inputs and compared with eager on every returned tensor.

    python examples/library_coverage.py                   # all, C++ backend on the CPU
    python examples/library_coverage.py --only hf_bart,timm_swin_tiny
    python examples/library_coverage.py --backend triton  # CUDA if present
    python examples/library_coverage.py --train           # a training step each

One row per model: "whole" (one graph, no break, no eager fallback; recompiles counted),
else the break's reason or the fallback; the largest difference from eager over both calls,
the kernels, and the time of the first call.  A difference beyond float32 rounding is
flagged: a compiler must never give another answer than eager.
"""

from __future__ import annotations

import argparse
import copy
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch

import minicompile
from model_report import import_torchvision
from model_zoo import tensors_of

Inputs = Callable[[torch.device], tuple[tuple, dict]]


def images(size: int = 64) -> Inputs:
    return lambda d: ((torch.randn(2, 3, size, size, device=d),), {})


def pixels(size: int = 32) -> Inputs:
    return lambda d: ((), {"pixel_values": torch.randn(2, 3, size, size, device=d)})


def tokens(length: int = 12) -> Inputs:
    return lambda d: ((), {"input_ids": torch.randint(0, 100, (2, length), device=d)})


def timm_model(name: str, **kw: Any) -> Callable[[], torch.nn.Module]:
    def build() -> torch.nn.Module:
        import timm

        return timm.create_model(name, pretrained=False, num_classes=10, **kw)
    return build


def torchvision_model(name: str, **kw: Any) -> Callable[[], torch.nn.Module]:
    def build() -> torch.nn.Module:
        import torchvision

        return getattr(torchvision.models, name)(**kw)
    return build


def hf(config: str, model: str, **kw: Any) -> Callable[[], torch.nn.Module]:
    def build() -> torch.nn.Module:
        import transformers

        return getattr(transformers, model)(getattr(transformers, config)(**kw))
    return build


SMALL = dict(vocab_size=100, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
             intermediate_size=128, max_position_embeddings=64)
GQA = dict(SMALL, num_key_value_heads=2)
SEQ2SEQ = dict(vocab_size=100, d_model=64, encoder_layers=2, decoder_layers=2,
               encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128,
               decoder_ffn_dim=128)

MODELS: dict[str, tuple[Callable[[], torch.nn.Module], Inputs]] = {
    "timm_convnext_atto": (timm_model("convnext_atto"), images()),
    "timm_mobilenetv3_small_050": (timm_model("mobilenetv3_small_050"), images()),
    "timm_regnetx_002": (timm_model("regnetx_002"), images()),
    "timm_deit_tiny": (timm_model("deit_tiny_patch16_224", img_size=64), images()),
    "timm_poolformer_s12": (timm_model("poolformer_s12"), images()),
    "timm_ghostnet_050": (timm_model("ghostnet_050"), images()),
    "timm_swin_tiny": (timm_model("swin_tiny_patch4_window7_224"), images(224)),
    "timm_levit_128s": (timm_model("levit_128s"), images(224)),
    "timm_mixer_s16": (timm_model("mixer_s16_224", img_size=64), images()),
    "timm_convmixer": (timm_model("convmixer_1024_20_ks9_p14"), images()),
    "timm_nfnet_l0": (timm_model("nfnet_l0"), images()),
    "timm_cait_xxs24": (timm_model("cait_xxs24_224", img_size=64), images()),
    "timm_pvt_v2_b0": (timm_model("pvt_v2_b0"), images()),
    "timm_edgenext_xx_small": (timm_model("edgenext_xx_small"), images()),
    "timm_repvgg_a0": (timm_model("repvgg_a0"), images()),
    "timm_dla34": (timm_model("dla34"), images()),
    "timm_xcit_nano": (timm_model("xcit_nano_12_p16_224", img_size=64), images()),
    "timm_beit_base": (timm_model("beit_base_patch16_224", img_size=64, depth=2), images()),
    "timm_maxvit_nano": (timm_model("maxvit_nano_rw_256", img_size=64), images()),
    "timm_eva02_tiny": (timm_model("eva02_tiny_patch14_224", img_size=56), images(56)),
    "timm_coatnet_nano": (timm_model("coatnet_nano_rw_224", img_size=64), images()),
    "timm_hrnet_w18_small": (timm_model("hrnet_w18_small"), images()),
    "tv_mobilenet_v2": (torchvision_model("mobilenet_v2", num_classes=10), images()),
    "tv_densenet121": (torchvision_model("densenet121", num_classes=10), images()),
    "tv_squeezenet": (torchvision_model("squeezenet1_1", num_classes=10), images()),
    "tv_vit": (torchvision_model("VisionTransformer", image_size=64, patch_size=16,
                                 num_layers=2, num_heads=4, hidden_dim=64, mlp_dim=128,
                                 num_classes=10), images()),
    "hf_distilbert": (hf("DistilBertConfig", "DistilBertModel", vocab_size=100, dim=64,
                         n_layers=2, n_heads=4, hidden_dim=128, max_position_embeddings=64),
                      tokens()),
    "hf_roberta": (hf("RobertaConfig", "RobertaModel", **SMALL), tokens()),
    "hf_albert": (hf("AlbertConfig", "AlbertModel", embedding_size=32, **SMALL), tokens()),
    "hf_electra": (hf("ElectraConfig", "ElectraModel", embedding_size=32, **SMALL), tokens()),
    "hf_deberta_v2": (hf("DebertaV2Config", "DebertaV2Model", **SMALL), tokens()),
    "hf_mobilebert": (hf("MobileBertConfig", "MobileBertModel", vocab_size=100,
                         hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                         intermediate_size=64, embedding_size=32, intra_bottleneck_size=32,
                         true_hidden_size=32), tokens()),
    "hf_mistral": (hf("MistralConfig", "MistralForCausalLM", **GQA), tokens()),
    "hf_qwen2": (hf("Qwen2Config", "Qwen2ForCausalLM", **GQA), tokens()),
    "hf_gemma": (hf("GemmaConfig", "GemmaForCausalLM", head_dim=16, **GQA), tokens()),
    "hf_phi": (hf("PhiConfig", "PhiForCausalLM", **SMALL), tokens()),
    "hf_phi3": (hf("Phi3Config", "Phi3ForCausalLM", pad_token_id=0, **GQA), tokens()),
    "hf_starcoder2": (hf("Starcoder2Config", "Starcoder2ForCausalLM", **GQA), tokens()),
    "hf_gpt_neox": (hf("GPTNeoXConfig", "GPTNeoXForCausalLM", **SMALL), tokens()),
    "hf_gptj": (hf("GPTJConfig", "GPTJForCausalLM", vocab_size=100, n_embd=64, n_layer=2,
                   n_head=4, rotary_dim=8, n_positions=64), tokens()),
    "hf_opt": (hf("OPTConfig", "OPTForCausalLM", vocab_size=100, hidden_size=64,
                  num_hidden_layers=2, num_attention_heads=4, ffn_dim=128,
                  max_position_embeddings=64, word_embed_proj_dim=64), tokens()),
    "hf_bloom": (hf("BloomConfig", "BloomForCausalLM", vocab_size=100, hidden_size=64,
                    n_layer=2, n_head=4), tokens()),
    "hf_falcon": (hf("FalconConfig", "FalconForCausalLM", vocab_size=100, hidden_size=64,
                     num_hidden_layers=2, num_attention_heads=4), tokens()),
    "hf_mixtral": (hf("MixtralConfig", "MixtralForCausalLM", num_local_experts=4,
                      num_experts_per_tok=2, **GQA), tokens()),
    "hf_qwen2_moe": (hf("Qwen2MoeConfig", "Qwen2MoeForCausalLM", num_experts=4,
                        num_experts_per_tok=2, moe_intermediate_size=32,
                        shared_expert_intermediate_size=64, **GQA), tokens()),
    "hf_bart": (hf("BartConfig", "BartModel", max_position_embeddings=64, **SEQ2SEQ),
                tokens()),
    "hf_whisper": (hf("WhisperConfig", "WhisperModel", num_mel_bins=16,
                      max_source_positions=32, max_target_positions=32, pad_token_id=0,
                      bos_token_id=1, eos_token_id=2, decoder_start_token_id=1, **SEQ2SEQ),
                   lambda d: ((), {"input_features": torch.randn(2, 16, 64, device=d),
                                   "decoder_input_ids": torch.randint(0, 100, (2, 5),
                                                                      device=d)})),
    "hf_vit": (hf("ViTConfig", "ViTModel", image_size=64, patch_size=16, hidden_size=64,
                  num_hidden_layers=2, num_attention_heads=4, intermediate_size=128),
               pixels(64)),
    "hf_clip_text": (hf("CLIPTextConfig", "CLIPTextModel", **SMALL), tokens()),
    "hf_clip_vision": (hf("CLIPVisionConfig", "CLIPVisionModel", image_size=32, patch_size=8,
                          hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                          intermediate_size=128), pixels()),
    "hf_swin": (hf("SwinConfig", "SwinModel", image_size=32, patch_size=4, embed_dim=16,
                   depths=[1, 1], num_heads=[2, 2], window_size=4), pixels()),
    "hf_convnext": (hf("ConvNextConfig", "ConvNextModel", hidden_sizes=[16, 32],
                       depths=[1, 1], num_stages=2), pixels()),
    "hf_segformer": (hf("SegformerConfig", "SegformerModel", num_encoder_blocks=2,
                        depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[16, 32],
                        num_attention_heads=[1, 2], patch_sizes=[7, 3], strides=[4, 2],
                        mlp_ratios=[2, 2]), pixels()),
}


def largest_difference(got: Any, want: Any) -> float:
    worst = 0.0
    for a, e in zip(tensors_of(got), tensors_of(want), strict=True):
        if isinstance(e, torch.Tensor) and e.is_floating_point():
            worst = max(worst, (a.float() - e.float()).abs().max().item() if e.numel() else 0.0)
        elif isinstance(e, torch.Tensor):
            worst = max(worst, 0.0 if torch.equal(a, e) else float("inf"))
    return worst


def check(name: str, backend: str, device: torch.device) -> tuple[str, str, str, str, str]:
    build, inputs = MODELS[name]
    torch.manual_seed(0)
    model = build().eval().to(device)
    minicompile.reset()
    compiled = minicompile.compile(model, backend=backend, fullgraph=True)
    worst, first = 0.0, 0.0
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for seed in (1, 2):
                torch.manual_seed(seed)
                args, kwargs = inputs(device)
                start = time.perf_counter()
                got = compiled(*args, **kwargs)
                first = first or time.perf_counter() - start
                worst = max(worst, largest_difference(got, model(*args, **kwargs)))
    except Exception as e:  # noqa: BLE001 (the row says why)
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return name, f"break: {reason[:110]}", "", "", ""
    stats = minicompile.stats()
    if stats["eager_fallbacks"]:
        result = "eager fallback"
    else:
        result = "whole" + (f", {stats['recompiles']} recompile(s)" if stats["recompiles"] else "")
    flag = "  <-- differs from eager" if worst > 1e-3 else ""
    return name, result, f"{worst:.1e}{flag}", str(stats["kernels"]), f"{first:.1f} s"


def _no_dropout(model: torch.nn.Module) -> None:
    """Dropout probabilities to 0 (modules and the rates models pass to F.dropout), so that
    a training step is deterministic."""
    for mod in model.modules():
        for key, value in vars(mod).items():
            if key in ("p", "drop_rate", "drop_prob", "dropout", "attention_dropout") and (
                    type(value) is float):
                setattr(mod, key, 0.0)


def _gradients(model: torch.nn.Module, args: tuple, kwargs: dict) -> tuple[float, list]:
    """A loss over every output that takes a gradient, and each parameter's gradient."""
    model.zero_grad()
    outs = [t for t in tensors_of(model(*args, **kwargs))
            if isinstance(t, torch.Tensor) and t.requires_grad]
    loss = sum(o.double().square().mean() for o in outs)
    loss.backward()
    return loss.item(), [p.grad for p in model.parameters()]


def _nudged(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """The float tensors moved by a few units of float32 rounding."""
    def nudge(v: Any) -> Any:
        if isinstance(v, torch.Tensor) and v.is_floating_point():
            return v * (1 + 1e-6 * torch.randn_like(v))
        return v
    return tuple(nudge(a) for a in args), {k: nudge(v) for k, v in kwargs.items()}


def _exact_gradients(ref: torch.nn.Module, args: tuple, kwargs: dict) -> list | None:
    """The gradients of the float64 copy ``ref``; None where a kernel has no float64 form
    (transformers' grouped matmul)."""
    args = tuple(a.double() if a.is_floating_point() else a for a in args)
    kwargs = {k: v.double() if v.is_floating_point() else v for k, v in kwargs.items()}
    try:
        return [g if g is None else g.double() for g in _gradients(ref, args, kwargs)[1]]
    except RuntimeError:
        return None


def check_training(name: str, backend: str, device: torch.device) -> tuple[str, ...]:
    """One training step compiled (forward and backward) against eager: the loss and every
    gradient, each measured against a float64 copy of the model; flagged where the compiled
    gradients are further from float64's than eager's are, on the same inputs or on inputs
    moved by float32 rounding (an ill-conditioned model is not flagged while eager is as
    far off).  The difference shown is the compiled gradients' largest
    from eager's, relative to the largest gradient."""
    build, inputs = MODELS[name]
    torch.manual_seed(0)
    model = build().train().to(device)
    _no_dropout(model)
    twin, ref = copy.deepcopy(model), copy.deepcopy(model).double()
    minicompile.reset()
    compiled = minicompile.compile(twin, backend=backend, fullgraph=True)
    worst, first, flag = 0.0, 0.0, ""
    ours = eager = 0.0  # the gradients' largest difference from float64's, and eager's
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for seed in (1, 2):
                torch.manual_seed(seed)
                args, kwargs = inputs(device)
                want_loss, want = _gradients(model, args, kwargs)
                start = time.perf_counter()
                got_loss, got = _gradients(compiled, args, kwargs)
                first = first or time.perf_counter() - start
                exact = _exact_gradients(ref, args, kwargs) or want  # (no float64: eager)
                # How far eager moves when its float inputs move by float32 rounding: a
                # model whose gradients amplify rounding moves as far (HRNet's small batch
                # norms), whichever order of operations rounds.
                _, nudged = _gradients(model, *_nudged(args, kwargs))
                scale = max(g.abs().max().item() for g in exact if g is not None) or 1.0
                for g, w, n, e in zip(got, want, nudged, exact):
                    if (g is None) != (w is None):
                        raise AssertionError("a parameter's gradient is missing")
                    if g is None:
                        continue
                    worst = max(worst, (g - w).abs().max().item() / scale)
                    ours = max(ours, (g.double() - e).abs().max().item() / scale)
                    eager = max(eager, (w.double() - e).abs().max().item() / scale,
                                (n.double() - e).abs().max().item() / scale)
                if abs(got_loss - want_loss) > 1e-4 * max(abs(want_loss), 1e-6):
                    flag = "  <-- loss differs from eager"
        if ours > 4 * eager + 1e-5:  # further from float64 than eager is
            flag = flag or f"  <-- differs from eager ({ours:.1e} from float64, eager {eager:.1e})"
    except Exception as e:  # noqa: BLE001 (the row says why)
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return name, f"break: {reason[:110]}", "", "", ""
    stats = minicompile.stats()
    result = "eager fallback" if stats["eager_fallbacks"] else "whole" + (
        f", {stats['recompiles']} recompile(s)" if stats["recompiles"] else "")
    return name, result, f"{worst:.1e}{flag}", str(stats["kernels"]), f"{first:.1f} s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default="", help="comma-separated model names")
    parser.add_argument("--backend", default="cpp", choices=("cpp", "triton"))
    parser.add_argument("--train", action="store_true", help=(
        "one training step each (train mode, dropout off): the forward and its backward "
        "compiled, the loss and every gradient against eager and float64"))
    opts = parser.parse_args()
    names = [n for n in opts.only.split(",") if n] or list(MODELS)
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(MODELS)}")
    device = torch.device("cuda" if opts.backend == "triton" and torch.cuda.is_available()
                          else "cpu")
    import_torchvision()
    import transformers

    transformers.logging.set_verbosity_error()  # (the tiny configs' token ids)
    print(f"backend {opts.backend} on {device}; PyTorch {torch.__version__}\n")
    if opts.train:
        print("training: forward and backward; gradient differences relative to the "
              "largest gradient\n")
    print("| model | result | max abs diff | kernels | first call |")
    print("|---|---|---|---|---|")
    whole = 0
    for name in names:
        row = (check_training if opts.train else check)(name, opts.backend, device)
        whole += row[1].startswith("whole")
        print("| " + " | ".join(row) + " |", flush=True)
    print(f"\n{whole} of {len(names)} compile whole")


if __name__ == "__main__":
    main()
