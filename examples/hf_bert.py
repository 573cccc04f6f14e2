"""The PyTorch 2.0 tutorial's BERT example: a transformers ``BertModel`` (random weights,
no download) called as ``model(**encoded_input)`` on a padded batch, under no_grad.

    python examples/hf_bert.py
    MINICOMPILE_LOGS=graph_breaks python examples/hf_bert.py   # why each graph ends

On the CPU a small BERT (2 layers, hidden 64) in float32; on CUDA the bert-base shape
(hidden 768, 12 heads) with 4 layers, in float32 and bfloat16.  Prints the graphs, the
graph breaks with their reasons, the kernels, the cold first call and the median call of
eager, minicompile and torch.compile; last_hidden_state and pooler_output are checked
against eager.
"""

import torch

from model_report import import_torchvision, report

CLS, SEP, PAD = 101, 102, 0  # bert-base-uncased's special token ids


def bert(cuda: bool) -> torch.nn.Module:
    import_torchvision()
    from transformers import BertConfig, BertModel

    if cuda:
        config = BertConfig(num_hidden_layers=4)  # bert-base: hidden 768, 12 heads
    else:
        config = BertConfig(vocab_size=1024, hidden_size=64, num_hidden_layers=2,
                            num_attention_heads=2, intermediate_size=256,
                            max_position_embeddings=128)
    torch.manual_seed(0)
    return BertModel(config).eval()


def encode(vocab_size: int, batch: int, length: int, device: str) -> dict[str, torch.Tensor]:
    """What a tokenizer gives for ``batch`` sentence pairs padded to ``length`` tokens:
    [CLS] first sentence [SEP] second sentence [SEP] [PAD]..., the longest unpadded."""
    lengths = torch.randint(length // 2, length + 1, (batch,))
    lengths[0] = length
    position = torch.arange(length)
    real = position < lengths[:, None]
    input_ids = torch.randint(1000, vocab_size, (batch, length))
    input_ids[:, 0] = CLS
    middle = lengths // 2
    input_ids[position == middle[:, None]] = SEP
    input_ids[position == lengths[:, None] - 1] = SEP
    input_ids[~real] = PAD
    token_type_ids = ((position > middle[:, None]) & real).long()
    encoded = dict(input_ids=input_ids, token_type_ids=token_type_ids,
                   attention_mask=real.long())
    return {k: v.to(device) for k, v in encoded.items()}


def main() -> None:
    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    model = bert(cuda).to(device)
    batch, length = (8, 128) if cuda else (4, 32)
    encoded_input = encode(model.config.vocab_size, batch, length, device)
    name = torch.cuda.get_device_name() if cuda else "CPU"
    print(f"BertModel: {model.config.num_hidden_layers} layers, hidden "
          f"{model.config.hidden_size}, input [{batch}, {length}] on {name}")
    tolerances = {torch.float32: dict(rtol=1e-4, atol=1e-4),
                  torch.bfloat16: dict(rtol=5e-2, atol=5e-2)}

    for dtype in (torch.float32, torch.bfloat16) if cuda else (torch.float32,):
        model = model.to(dtype)

        def check(actual, expected, tol=tolerances[dtype]):  # noqa: ANN001
            for field in ("last_hidden_state", "pooler_output"):
                torch.testing.assert_close(getattr(actual, field), getattr(expected, field),
                                           **tol, msg=lambda m, f=field: f"{f}: {m}")

        with torch.no_grad():
            report(f"BERT {str(dtype).removeprefix('torch.')}", model, encoded_input,
                   check, cuda)


if __name__ == "__main__":
    main()
