"""ModernBERT (Warner et al. 2024) in plain PyTorch, read top to bottom like nanoGPT's model.py.

Pre-LayerNorm layers without biases, rotary position embeddings, a GeGLU feed-forward
layer, a final LayerNorm, and attention that is global every
``global_attn_every_n_layers`` layers and a sliding window of ``local_attention`` tokens
(half each side) in the others. Batches are unpadded, as in the paper: padding is dropped
before the embeddings, so every linear layer and norm runs on the real tokens only, and
attention alone sees them padded again, as ``F.scaled_dot_product_attention`` needs, with a
boolean mask folded into an additive one: padding, the local window and, for packed
examples, the document each token belongs to. Module and parameter names are those of
Hugging Face's ``ModernBertModel``, so a state dict moves between the two as it is and the
same weights give the same outputs.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from pretextual.architectures.common import (EncoderOutput, allowed_keys, attention_bias,
                                             document_positions, real_positions, repad, unpad)
from pretextual.plugins.api import ArchitectureSpec
from pretextual.plugins.hookspecs import hookimpl


@dataclass
class ModernBertConfig:
    """Sizes of a ModernBERT encoder; field names are those of Hugging Face's ModernBertConfig."""

    architecture: ClassVar[str] = "modernbert"

    vocab_size: int = 50368
    hidden_size: int = 768
    intermediate_size: int = 1152
    num_hidden_layers: int = 22
    num_attention_heads: int = 12
    hidden_activation: str = "gelu"
    max_position_embeddings: int = 8192
    initializer_range: float = 0.02
    initializer_cutoff_factor: float = 2.0
    norm_eps: float = 1e-5
    norm_bias: bool = False
    pad_token_id: int = 0
    global_rope_theta: float = 160_000.0
    local_rope_theta: float = 10_000.0
    global_attn_every_n_layers: int = 3
    local_attention: int = 128
    attention_bias: bool = False
    attention_dropout: float = 0.0
    embedding_dropout: float = 0.0
    mlp_bias: bool = False
    mlp_dropout: float = 0.0
    decoder_bias: bool = True

    def to_dict(self) -> dict:
        return asdict(self)

    def is_global(self, layer: int) -> bool:
        """Whether layer ``layer`` attends globally (else within the local window)."""
        return layer % self.global_attn_every_n_layers == 0

    def num_parameters(self) -> int:
        """The parameters of a ModernBertModel of these sizes, counted from the sizes alone."""
        h, i = self.hidden_size, self.intermediate_size
        norm = h * (2 if self.norm_bias else 1)
        attention = 4 * h * h + (4 * h if self.attention_bias else 0)
        mlp = 3 * h * i + ((2 * i + h) if self.mlp_bias else 0)
        layers = self.num_hidden_layers * (attention + mlp + 2 * norm) - norm  # layer 0: no attn_norm
        return self.vocab_size * h + norm + layers + norm


# The paper's base and large, and smaller ones of the same shape (intermediate 1.5 x hidden,
# a global layer every third) for tests and CPU runs.
PRESET_FIELDS = {
    "tiny": dict(num_hidden_layers=3, hidden_size=128, num_attention_heads=2, intermediate_size=192),
    "mini": dict(num_hidden_layers=6, hidden_size=256, num_attention_heads=4, intermediate_size=384),
    "small": dict(num_hidden_layers=6, hidden_size=512, num_attention_heads=8, intermediate_size=768),
    "medium": dict(num_hidden_layers=12, hidden_size=512, num_attention_heads=8, intermediate_size=768),
    "base": dict(num_hidden_layers=22, hidden_size=768, num_attention_heads=12, intermediate_size=1152),
    "large": dict(num_hidden_layers=28, hidden_size=1024, num_attention_heads=16, intermediate_size=2624),
}


def rotary(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of the rotary angles of ``positions`` ([seq] or [batch, seq]), each
    [..., seq, head_dim] in float32 (RoFormer's frequencies theta^(-2k/d), halves repeated)."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=positions.device,
                                            dtype=torch.float) / head_dim)
    angles = positions[..., None].float() * inv_freq
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos(), angles.sin()


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [b, heads, n, d] rotated by the angles (computed in float32, as Hugging Face does)."""
    first, second = x.float().chunk(2, dim=-1)
    return (x.float() * cos + torch.cat((-second, first), dim=-1) * sin).to(x.dtype)


class ModernBertEmbeddings(nn.Module):
    def __init__(self, config: ModernBertConfig):
        super().__init__()
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.hidden_size,
                                           padding_idx=config.pad_token_id)
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.norm_eps, bias=config.norm_bias)
        self.drop = nn.Dropout(config.embedding_dropout)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.drop(self.norm(self.tok_embeddings(input_ids)))


class ModernBertAttention(nn.Module):
    def __init__(self, config: ModernBertConfig, layer: int):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.head_dim = config.hidden_size // config.num_attention_heads
        self.Wqkv = nn.Linear(config.hidden_size, 3 * config.hidden_size, bias=config.attention_bias)
        self.Wo = nn.Linear(config.hidden_size, config.hidden_size, bias=config.attention_bias)
        self.dropout_p = config.attention_dropout
        self.out_drop = nn.Dropout(config.attention_dropout)

    def forward(self, x: torch.Tensor, real: torch.Tensor, shape: tuple[int, int],
                rope: tuple[torch.Tensor, torch.Tensor], attn_mask: torch.Tensor | None) -> torch.Tensor:
        """``x``: [tokens, hidden], the real tokens of a [b, n] batch at the flat positions
        ``real``."""
        (b, n), h = shape, x.shape[-1]
        qkv = repad(self.Wqkv(x), real, b * n).view(b, n, 3, self.num_heads, self.head_dim)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each [b, heads, n, head_dim]
        cos, sin = rope
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        if attn_mask is not None:
            attn_mask = attn_mask.to(q.dtype)  # autocast computes q in bf16, the mask must match
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask,
                                           dropout_p=self.dropout_p if self.training else 0.0)
        y = unpad(y.transpose(1, 2).reshape(b * n, h), real)
        return self.out_drop(self.Wo(y))


class ModernBertMLP(nn.Module):
    """GeGLU: Wi makes the input and the gate, GELU(input) * gate, Wo projects back."""

    def __init__(self, config: ModernBertConfig):
        super().__init__()
        if config.hidden_activation != "gelu":
            raise ValueError(f"hidden_activation {config.hidden_activation!r} is not supported "
                             f"(only 'gelu')")
        self.Wi = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=config.mlp_bias)
        self.drop = nn.Dropout(config.mlp_dropout)
        self.Wo = nn.Linear(config.intermediate_size, config.hidden_size, bias=config.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        input, gate = self.Wi(x).chunk(2, dim=-1)
        return self.Wo(self.drop(F.gelu(input) * gate))


class ModernBertEncoderLayer(nn.Module):
    """Pre-LN: x + attn(norm(x)), then x + mlp(norm(x)); layer 0's input is already the
    normalised embedding, so it has no attn_norm."""

    def __init__(self, config: ModernBertConfig, layer: int):
        super().__init__()
        self.attn_norm = (nn.Identity() if layer == 0 else
                          nn.LayerNorm(config.hidden_size, eps=config.norm_eps, bias=config.norm_bias))
        self.attn = ModernBertAttention(config, layer)
        self.mlp_norm = nn.LayerNorm(config.hidden_size, eps=config.norm_eps, bias=config.norm_bias)
        self.mlp = ModernBertMLP(config)
        self.is_global = config.is_global(layer)

    def forward(self, x, real, shape, rope, attn_mask):
        x = x + self.attn(self.attn_norm(x), real, shape, rope, attn_mask)
        return x + self.mlp(self.mlp_norm(x))


class ModernBertPredictionHead(nn.Module):
    """The MLM head's transform before the tied vocabulary projection: dense, GELU, LayerNorm."""

    def __init__(self, config: ModernBertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.norm_eps, bias=config.norm_bias)

    def forward(self, x):
        return self.norm(F.gelu(self.dense(x)))


class ModernBertModel(nn.Module):
    """ModernBERT: normalised token embeddings, pre-LN layers alternating global and local
    attention with rotary positions, a final LayerNorm. It has no pooler: ``pooler_output``
    is the final [CLS] vector."""

    def __init__(self, config: ModernBertConfig):
        super().__init__()
        self.config = config
        self.embeddings = ModernBertEmbeddings(config)
        self.layers = nn.ModuleList(ModernBertEncoderLayer(config, i)
                                    for i in range(config.num_hidden_layers))
        self.final_norm = nn.LayerNorm(config.hidden_size, eps=config.norm_eps, bias=config.norm_bias)
        self.apply(self._init_weights)

    def _init_weights(self, module: nn.Module) -> None:
        # ModernBERT's (Megatron's) initialisation: truncated normals, the layers' output
        # projections scaled down by sqrt(2 x layers); zero biases, unit norms.
        c = self.config
        std = {"in": c.initializer_range,
               "out": c.initializer_range / math.sqrt(2.0 * c.num_hidden_layers)}

        def init(linear, kind):
            s = std[kind]
            cut = c.initializer_cutoff_factor * s
            nn.init.trunc_normal_(linear.weight, std=s, a=-cut, b=cut)
            if getattr(linear, "bias", None) is not None:
                nn.init.zeros_(linear.bias)

        if isinstance(module, ModernBertEmbeddings):
            init(module.tok_embeddings, "in")
        elif isinstance(module, (ModernBertAttention, ModernBertMLP)):
            init(module.Wqkv if isinstance(module, ModernBertAttention) else module.Wi, "in")
            init(module.Wo, "out")
        elif isinstance(module, ModernBertPredictionHead):
            init(module.dense, "out")
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            if module.bias is not None:
                nn.init.zeros_(module.bias)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None,
                document_ids: torch.Tensor | None = None) -> EncoderOutput:
        """``token_type_ids`` are accepted and ignored: ModernBERT has no segment embedding.
        ``document_ids`` (a packed batch's): each token attends within its own document
        only, and rotary positions restart at each."""
        b, n = input_ids.shape
        real = real_positions(attention_mask, b, n, input_ids.device)  # all that follows runs on them
        if len(real) == b * n:  # no padding: no key mask, and SDPA runs its unmasked kernel
            attention_mask = None
        return self.encode(input_ids, real, attention_mask, document_ids)

    def encode(self, input_ids: torch.Tensor, real: torch.Tensor,
               attention_mask: torch.Tensor | None, document_ids: torch.Tensor | None) -> EncoderOutput:
        """The forward pass on the tokens at the flat positions ``real`` of the batch."""
        c, (b, n) = self.config, input_ids.shape
        x = self.embeddings(unpad(input_ids.flatten(), real))  # [tokens, hidden]
        positions = (torch.arange(n, device=x.device) if document_ids is None
                     else document_positions(document_ids)[:, None])  # [n] or [b, 1, n]
        head_dim = c.hidden_size // c.num_attention_heads
        rope = {True: rotary(positions, head_dim, c.global_rope_theta),
                False: rotary(positions, head_dim, c.local_rope_theta)}
        masks = {}
        for is_global in (True, False):
            allowed = allowed_keys(attention_mask, document_ids,
                                   None if is_global else c.local_attention // 2, n, x.device)
            masks[is_global] = None if allowed is None else attention_bias(allowed, x.dtype)
        for layer in self.layers:
            x = layer(x, real, (b, n), rope[layer.is_global], masks[layer.is_global])
        x = repad(self.final_norm(x), real, b * n).view(b, n, -1)  # padding positions are zeros
        return EncoderOutput(last_hidden_state=x, pooler_output=x[:, 0])

    def get_input_embeddings(self) -> nn.Embedding:
        """The word-embedding table, as Hugging Face names its accessor: what a head ties
        its output projection to."""
        return self.embeddings.tok_embeddings

    def new_prediction_head(self) -> ModernBertPredictionHead:
        """A fresh transform of the MLM head, initialised as ModernBERT's."""
        head = ModernBertPredictionHead(self.config)
        head.apply(self._init_weights)
        return head


@hookimpl
def pretextual_register_architectures(register):
    register(ArchitectureSpec(
        name="modernbert", config=ModernBertConfig, model=ModernBertModel, presets=PRESET_FIELDS,
        intermediate_ratio=1.5,
        dropouts={"hidden_dropout_prob": ("embedding_dropout", "mlp_dropout"),
                  "attention_probs_dropout_prob": ("attention_dropout",)},
        document_attention=True,
        pooled="the final [CLS] vector (ModernBERT has no pooler; no segment embedding either)",
        description="ModernBERT (Warner et al. 2024): pre-LN, rotary, GeGLU, no biases, "
                    "local/global attention; exports as transformers' ModernBertForMaskedLM"))


__all__ = ["ModernBertConfig", "ModernBertModel", "ModernBertPredictionHead", "PRESET_FIELDS"]
