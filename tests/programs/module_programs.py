"""``nn.Module`` cases: library layers (Linear, LayerNorm, Embedding, Dropout in eval,
activations), containers (Sequential, ModuleList, ModuleDict), user modules with
``super()``, configs, buffers, Python attributes, and an optimizer step between calls.

Each case is a factory; the harness seeds torch, builds the module, deep-copies it for the
eager run, and calls both under ``torch.no_grad()`` (inference: parameters require grad).
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from programs import ModelConfig, Program, const, ints, inputs, program, randn

MODULE_CASES: list[Program] = []


def module_case(sample, **options):
    """Register a module factory (a function returning the module, or the class itself)."""

    def register(factory):
        MODULE_CASES.append(Program(factory.__name__, sample, module=factory, **options))
        return factory

    return register


# -- layers and containers ------------------------------------------------------------------


@module_case(inputs(randn(3, 8)))
def mlp_sequential():
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


# -- PyTorch's attention modules (their fused inference paths, and the Python one) ----------

_PAD = [[False, False, False, True, True], [False] * 5]  # the last two keys of row 0 padded


class PaddedSelfAttention(nn.Module):
    def __init__(self, batch_first):
        super().__init__()
        self.batch_first = batch_first
        self.mha = nn.MultiheadAttention(16, 4, batch_first=batch_first)

    def forward(self, x, pad):
        seq = x if self.batch_first else x.transpose(0, 1)
        out, weights = self.mha(seq, seq, seq, key_padding_mask=pad)
        return out, weights


@module_case(inputs(randn(2, 5, 16), const(_PAD, torch.bool)))
def multihead_attention_batch_first():
    return PaddedSelfAttention(batch_first=True)


@module_case(inputs(randn(2, 5, 16), const(_PAD, torch.bool)))
def multihead_attention_sequence_first():
    return PaddedSelfAttention(batch_first=False)


class EncoderLayers(nn.Module):
    def __init__(self, batch_first):
        super().__init__()
        self.first = nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=batch_first)
        self.second = nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=batch_first,
                                                 norm_first=True, activation="gelu")

    def forward(self, x):
        causal = nn.Transformer.generate_square_subsequent_mask(x.shape[1], device=x.device)
        return self.second(self.first(x), src_mask=causal, is_causal=True)


@module_case(inputs(randn(2, 5, 16)))
def transformer_encoder_layers_batch_first():
    return EncoderLayers(batch_first=True)


# In eval mode, under no_grad, PyTorch takes the modules' fused kernels (library calls).
@module_case(inputs(randn(2, 5, 16), const(_PAD, torch.bool)))
def multihead_attention_fused_in_eval():
    return PaddedSelfAttention(batch_first=True).eval()


@module_case(inputs(randn(2, 5, 16)))
def transformer_encoder_layers_fused_in_eval():
    return EncoderLayers(batch_first=True).eval()


@module_case(inputs(randn(5, 5, 16)))
def transformer_encoder_layers_sequence_first():
    return EncoderLayers(batch_first=False)


class ChildrenInOrder(nn.Module):
    """Runs its children in order (timm's RegNet stages), one of them registered twice and
    one entry None: children() yields each module once and skips None."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Tanh()
        self.again = self.a
        self.gone = None
        self.c = nn.Linear(8, 8)

    def forward(self, x):
        for block in self.children():
            x = block(x)
        names = [name for name, _ in self.named_children()]
        return x, len(names), names[-1]


def replace_a_child(m):
    g = torch.Generator().manual_seed(7)  # (the same new child for eager and compiled)
    lin = nn.Linear(8, 8, device=m.a.weight.device)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(8, 8, generator=g))
        lin.bias.copy_(torch.randn(8, generator=g))
    m.c = nn.Sequential(lin, nn.ReLU())  # (another child: the next call recompiles)


@module_case(inputs(randn(3, 8)))
def children_in_order():
    return ChildrenInOrder()


@module_case(inputs(randn(3, 8)), between=replace_a_child, max_recompiles=1)
def children_replaced_between_calls():
    return ChildrenInOrder()


class PartialActivation(nn.Module):
    """An activation chosen at construction as a functools.partial (timm's habit)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.act = functools.partial(F.gelu, approximate="tanh")

    def forward(self, x):
        return self.act(self.fc(x)) + x


def switch_partial_activation(m):
    m.act.keywords["approximate"] = "none"  # (a guarded keyword: the next call recompiles)


@module_case(inputs(randn(3, 8)))
def partial_activation():
    return PartialActivation()


@module_case(inputs(randn(3, 8)), between=switch_partial_activation, max_recompiles=1)
def partial_activation_changed_between_calls():
    return PartialActivation()


@module_case(inputs(randn(3, 8)))
def gelu_mlp_with_dropout_eval():
    return nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Dropout(0.1), nn.Linear(16, 8)).eval()


class ResidualBlock(nn.Module):
    def __init__(self, dim: int = 8, hidden: int = 16, p: float = 0.1) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU(approximate="tanh")
        self.fc2 = nn.Linear(hidden, dim)
        self.drop = nn.Dropout(p)

    def forward(self, x):
        return x + self.drop(self.fc2(self.act(self.fc1(self.norm(x)))))


@module_case(inputs(randn(2, 5, 8)))
def layernorm_residual_block():
    return ResidualBlock().eval()


class TinyLM(nn.Module):
    def __init__(self, vocab: int = 20, dim: int = 8, max_len: int = 16) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(max_len, dim)
        self.norm = nn.LayerNorm(dim)

    def forward(self, ids):
        positions = torch.arange(ids.shape[1], device=ids.device)
        h = self.norm(self.tok(ids) + self.pos(positions))
        return h @ self.tok.weight.t()  # tied output projection


@module_case(inputs(ints(20, 2, 5)))
def embedding_tied_lm_head():
    return TinyLM()


class Stack(nn.Module):
    def __init__(self, depth: int = 3, dim: int = 8) -> None:
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(dim, dim) for _ in range(depth)])

    def forward(self, x):
        for layer in self.layers:
            x = x + layer(x).relu()
        return x


@module_case(inputs(randn(3, 8)))
def module_list_loop():
    return Stack()


class Heads(nn.Module):
    def __init__(self, dim: int = 8) -> None:
        super().__init__()
        self.trunk = nn.Linear(dim, dim)
        self.heads = nn.ModuleDict({"cls": nn.Linear(dim, 3), "reg": nn.Linear(dim, 1)})

    def forward(self, x, task="cls"):
        h = torch.tanh(self.trunk(x))
        outs = {name: head(h) for name, head in self.heads.items()}
        return self.heads[task](h) * 2, outs


@module_case(inputs(randn(3, 8), task="reg"))
def module_dict_heads():
    return Heads()


class Blocks(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(
            [nn.Sequential(nn.Linear(8, 8), nn.SiLU()) for _ in range(3)]
        )
        self.out = nn.Linear(8, 2)

    def forward(self, x):
        for block in self.blocks[:2]:
            x = block(x)
        x = self.blocks[-1](x) * len(self.blocks)
        return self.out(x)


@module_case(inputs(randn(3, 8)))
def module_list_index_and_slice():
    return Blocks()


# -- user modules ---------------------------------------------------------------------------


class Base(nn.Module):
    def __init__(self, dim: int = 8) -> None:
        super().__init__()
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        return F.relu(self.proj(x))


class Scaled(Base):
    def __init__(self, dim: int = 8, scale: float = 0.5) -> None:
        super().__init__(dim)
        self.scale = scale

    def forward(self, x):
        return super().forward(x) * self.scale + x


@module_case(inputs(randn(3, 8)))
def super_forward():
    return Scaled()


class SelfAttention(nn.Module):
    def __init__(self, dim: int = 8, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x):
        b, n, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=-1)
        q = q.view(b, n, self.heads, d // self.heads).transpose(1, 2)
        k = k.view(b, n, self.heads, d // self.heads).transpose(1, 2)
        v = v.view(b, n, self.heads, d // self.heads).transpose(1, 2)
        scores = q @ k.transpose(-2, -1) / math.sqrt(d // self.heads)
        attn = scores.softmax(dim=-1)
        y = (attn @ v).transpose(1, 2).reshape(b, n, d)
        return self.out(y)


@module_case(inputs(randn(2, 4, 8)))
def self_attention():
    return SelfAttention()


class TransformerBlock(nn.Module):
    def __init__(self, dim: int = 8) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = SelfAttention(dim)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
        self.drop = nn.Dropout(0.1)

    def forward(self, x):
        x = x + self.drop(self.attn(self.ln1(x)))
        return x + self.drop(self.mlp(self.ln2(x)))


@module_case(inputs(randn(2, 4, 8)))
def transformer_block_eval():
    return TransformerBlock().eval()


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class SwiGLU(nn.Module):
    def __init__(self, dim: int = 8, hidden: int = 16) -> None:
        super().__init__()
        self.norm = RMSNorm(dim)
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        h = self.norm(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


@module_case(inputs(randn(2, 3, 8)))
def rmsnorm_swiglu():
    return SwiGLU()


class Configured(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.fc = nn.Linear(cfg.hidden, cfg.hidden)

    def forward(self, x):
        h = self.fc(x)
        h = F.gelu(h) if self.cfg.act == "gelu" else F.silu(h)
        if self.cfg.residual:
            h = h + x
        return h * self.cfg.scale


@module_case(inputs(randn(3, 8)))
def dataclass_config_module():
    return Configured(ModelConfig(act="silu"))


class Affine(nn.Module):
    def __init__(self, dim: int = 8) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(dim))
        self.bias = nn.Parameter(torch.zeros(dim))
        self.register_buffer("scale", torch.full((dim,), 0.5))

    def forward(self, x):
        return (x * self.weight + self.bias) * self.scale


@module_case(inputs(randn(3, 8)))
def parameters_and_buffer():
    return Affine()


class RunningMean(nn.Module):
    """A batch-norm-like running statistic, updated in place in training mode."""

    def __init__(self, dim: int = 8, momentum: float = 0.1) -> None:
        super().__init__()
        self.momentum = momentum
        self.register_buffer("running_mean", torch.zeros(dim))
        self.register_buffer("steps", torch.zeros((), dtype=torch.int64))

    def forward(self, x):
        if self.training:
            self.running_mean.mul_(1 - self.momentum).add_(self.momentum * x.mean(0))
            self.steps += 1
        return x - self.running_mean


@module_case(inputs(randn(5, 8)))
def buffer_update_in_training():
    return RunningMean()


class Counted(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.calls = 0
        self.history: list = []

    def forward(self, x):
        self.calls += 1
        y = self.fc(x)
        self.history.append(y.shape[0])
        return y


# The second call reads calls == 1: a guarded Python int may recompile once.
@module_case(inputs(randn(3, 8)), max_recompiles=1)
def python_attribute_counter():
    return Counted()


class Named(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        for i in range(3):
            setattr(self, f"layer{i}", nn.Linear(8, 8))
        self.proj = None

    def forward(self, x):
        for i in range(3):
            x = torch.tanh(getattr(self, f"layer{i}")(x))
        if hasattr(self, "proj") and self.proj is not None:
            x = self.proj(x)
        return x


@module_case(inputs(randn(3, 8)))
def getattr_layers_by_name():
    return Named()


class Masked(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.skip = nn.Identity()

    def forward(self, x, mask=None, scale=1.0):
        y = self.fc(x) * scale
        if mask is not None:
            y = y.masked_fill(~mask, 0.0)
        return self.skip(x) + y


@module_case(
    inputs(randn(3, 8), mask=ints(2, 3, 8, dtype=torch.bool), scale=0.5)
)
def forward_keyword_arguments():
    return Masked()


class Classifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(16, 8)
        self.head = nn.Linear(8, 4)

    def forward(self, ids):
        pooled = self.emb(ids).mean(dim=1)
        logits = self.head(pooled)
        return {"logits": logits, "probs": logits.softmax(-1), "pooled": pooled}


@module_case(inputs(ints(16, 2, 6)))
def embedding_mean_pool_dict_output():
    return Classifier()


class Scales(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scales = [0.5, 1.0, 2.0]
        self.layers = nn.ModuleList(nn.Linear(8, 8) for _ in self.scales)

    def forward(self, x):
        outs = []
        for scale, layer in zip(self.scales, self.layers):
            outs.append(layer(x) * scale)
        return sum(outs)


@module_case(inputs(randn(3, 8)))
def python_list_attribute_zip():
    return Scales()


class Shared(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def _project(self, x, act=torch.relu):
        return act(self.fc(x))

    def forward(self, x):
        return self._project(self._project(x), act=torch.sigmoid)


@module_case(inputs(randn(3, 8)))
def shared_layer_and_helper_method():
    return Shared()


class Branchy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        y = self.fc(x)
        if self.training:
            y = y * 0.5
        return y


@module_case(inputs(randn(3, 8)))
def training_flag_branch():
    return Branchy()  # training mode: the branch is taken


def sgd_step(model: nn.Module) -> None:
    """One optimizer step with made-up gradients: parameters change in place."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.0)
    for k, p in enumerate(model.parameters()):
        p.grad = torch.full_like(p, 0.1 * (k + 1))
    opt.step()
    opt.zero_grad(set_to_none=True)


@module_case(inputs(randn(3, 8)), between=sgd_step)
def optimizer_step_between_calls():
    return nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 4))


class Printing(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.out = nn.Linear(8, 2)

    def forward(self, x):
        h = self.fc(x).relu()
        print("hidden", tuple(h.shape))
        return self.out(h)


@module_case(inputs(randn(3, 8)), graphs=2, breaks=1)
def print_in_forward():
    return Printing()
