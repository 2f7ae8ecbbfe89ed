"""BERT (Devlin et al. 2019) in plain PyTorch, read top to bottom like nanoGPT's model.py.

Module and parameter names follow Hugging Face's ``BertModel`` exactly, so a
state dict moves between the two without renaming or reshaping and the same
weights give the same outputs. Batches are unpadded: the layers run on the real tokens
only, attention sees them padded again, and padding positions come out as zeros.
Attention is ``F.scaled_dot_product_attention``, which picks a flash or
memory-efficient kernel where the device has one. Accelerations (torch.compile) are
applied to a built model from outside, by :mod:`pretextual.accel`; nothing here depends
on the device.
"""

from __future__ import annotations

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
class BertConfig:
    """Sizes of a BERT encoder; field names are those of Hugging Face's BertConfig."""

    architecture: ClassVar[str] = "bert"

    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-12
    pad_token_id: int = 0

    def to_dict(self) -> dict:
        return asdict(self)

    def num_parameters(self) -> int:
        """The parameters of a BertModel of these sizes (with its pooler), counted from
        the sizes alone, before anything is built."""
        h, i = self.hidden_size, self.intermediate_size
        embeddings = (self.vocab_size + self.max_position_embeddings + self.type_vocab_size) * h + 2 * h
        layer = 4 * h * h + 2 * h * i + 9 * h + i  # attention, its LayerNorm, feed-forward, LayerNorm
        return embeddings + self.num_hidden_layers * layer + h * h + h


# BERT's published sizes (Devlin et al.; Turc et al. 2019 for the small models):
# name -> (layers, hidden, heads). Intermediate size is always 4 x hidden.
PRESETS: dict[str, tuple[int, int, int]] = {
    "tiny": (2, 128, 2),
    "mini": (4, 256, 4),
    "small": (4, 512, 8),
    "medium": (8, 512, 8),
    "base": (12, 768, 12),
    "large": (24, 1024, 16),
}
PRESET_FIELDS = {name: dict(num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                            intermediate_size=4 * hidden)
                 for name, (layers, hidden, heads) in PRESETS.items()}


def preset_config(name: str, **overrides) -> BertConfig:
    """The BertConfig of a named preset, with any field overridden."""
    return BertConfig(**{**PRESET_FIELDS[name], **overrides})


class BertEmbeddings(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size,
                                            padding_idx=config.pad_token_id)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor,
                positions: torch.Tensor | None = None) -> torch.Tensor:
        if positions is None:
            positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = (self.word_embeddings(input_ids) + self.position_embeddings(positions)
             + self.token_type_embeddings(token_type_ids))
        return self.dropout(self.LayerNorm(x))


class BertSelfAttention(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.head_dim = config.hidden_size // config.num_attention_heads
        self.query = nn.Linear(config.hidden_size, config.hidden_size)
        self.key = nn.Linear(config.hidden_size, config.hidden_size)
        self.value = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout_p = config.attention_probs_dropout_prob

    def forward(self, x: torch.Tensor, real: torch.Tensor, shape: tuple[int, int],
                attn_mask: torch.Tensor | None) -> torch.Tensor:
        """``x``: [tokens, hidden], the real tokens of a [b, n] batch at the flat positions
        ``real``; ``attn_mask``: None or an additive mask broadcastable to [b, heads, n, n]."""
        (b, n), h = shape, x.shape[-1]
        q, k, v = (repad(proj(x), real, b * n).view(b, n, self.num_heads, self.head_dim).transpose(1, 2)
                   for proj in (self.query, self.key, self.value))  # each [b, heads, n, head_dim]
        if attn_mask is not None:
            attn_mask = attn_mask.to(q.dtype)  # autocast computes q in bf16, the mask must match
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask,
                                           dropout_p=self.dropout_p if self.training else 0.0)
        return unpad(y.transpose(1, 2).reshape(b * n, h), real)


class BertSelfOutput(nn.Module):
    """Projection, dropout, residual, post-LayerNorm (names as in Hugging Face)."""

    def __init__(self, in_size: int, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(in_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dropout(self.dense(x)) + residual)


class BertAttention(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.self = BertSelfAttention(config)
        self.output = BertSelfOutput(config.hidden_size, config)

    def forward(self, x, real, shape, attn_mask):
        return self.output(self.self(x, real, shape, attn_mask), x)


class BertIntermediate(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        if config.hidden_act != "gelu":
            raise ValueError(f"hidden_act {config.hidden_act!r} is not supported (only 'gelu')")
        self.dense = nn.Linear(config.hidden_size, config.intermediate_size)

    def forward(self, x):
        return F.gelu(self.dense(x))


class BertLayer(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.attention = BertAttention(config)
        self.intermediate = BertIntermediate(config)
        self.output = BertSelfOutput(config.intermediate_size, config)

    def forward(self, x, real, shape, attn_mask):
        x = self.attention(x, real, shape, attn_mask)
        return self.output(self.intermediate(x), x)


class BertEncoder(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(config) for _ in range(config.num_hidden_layers))

    def forward(self, x: torch.Tensor, real: torch.Tensor, shape: tuple[int, int],
                key_mask: torch.Tensor | None) -> torch.Tensor:
        """``x``: [tokens, hidden], the real tokens of a [b, n] batch at the flat positions
        ``real`` (see BertModel.forward); ``key_mask``: None, a boolean mask broadcastable to
        [b, heads, n, n] (True: may attend), or an additive one; a boolean one becomes an
        additive bias once, not once per layer."""
        if key_mask is not None and key_mask.dtype == torch.bool:
            key_mask = attention_bias(key_mask, x.dtype)
        for layer in self.layer:
            x = layer(x, real, shape, key_mask)
        return x


class BertPredictionHeadTransform(nn.Module):
    """The MLM head's transform before the tied vocabulary projection: dense, GELU, LayerNorm."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, x):
        return self.LayerNorm(F.gelu(self.dense(x)))


class BertPooler(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.dense(hidden[:, 0]))


class BertModel(nn.Module):
    """BERT: embeddings, post-LN transformer layers with GELU, and the [CLS] pooler."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.config = config
        self.embeddings = BertEmbeddings(config)
        self.encoder = BertEncoder(config)
        self.pooler = BertPooler(config)
        self.apply(self._init_weights)

    def _init_weights(self, module: nn.Module) -> None:
        # BERT's initialisation: normal(0, initializer_range) weights, zero biases.
        std = self.config.initializer_range
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=std)
            nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, std=std)
            if module.padding_idx is not None:
                module.weight.data[module.padding_idx].zero_()
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None,
                document_ids: torch.Tensor | None = None) -> EncoderOutput:
        """``document_ids`` (a packed batch's): each token attends within its own document
        only, and positions restart at each."""
        b, n = input_ids.shape
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        positions = (torch.arange(n, device=input_ids.device).expand(b, n) if document_ids is None
                     else document_positions(document_ids))
        # Unpadded: the padding is dropped before the embeddings, so every linear layer and
        # LayerNorm runs on the real tokens only; attention alone sees them padded again.
        real = real_positions(attention_mask, b, n, input_ids.device)
        if len(real) == b * n:  # no padding: no key mask, and SDPA runs its unmasked kernel
            attention_mask = None
        x = self.embeddings(*(unpad(t.flatten(), real)
                              for t in (input_ids, token_type_ids, positions)))
        mask = allowed_keys(attention_mask, document_ids, None, n, input_ids.device)
        x = repad(self.encoder(x, real, (b, n), mask), real, b * n).view(b, n, -1)
        return EncoderOutput(last_hidden_state=x, pooler_output=self.pooler(x))

    def get_input_embeddings(self) -> nn.Embedding:
        """The word-embedding table, as Hugging Face names its accessor: what a head ties
        its output projection to."""
        return self.embeddings.word_embeddings

    def new_prediction_head(self) -> BertPredictionHeadTransform:
        """A fresh transform of the MLM head, initialised as BERT's."""
        head = BertPredictionHeadTransform(self.config)
        head.apply(self._init_weights)
        return head


@hookimpl
def pretextual_register_architectures(register):
    register(ArchitectureSpec(
        name="bert", config=BertConfig, model=BertModel, presets=PRESET_FIELDS,
        intermediate_ratio=4.0,
        dropouts={"hidden_dropout_prob": ("hidden_dropout_prob",),
                  "attention_probs_dropout_prob": ("attention_probs_dropout_prob",)},
        pooled="tanh(dense([CLS])), BERT's pooler",
        description="BERT (Devlin et al. 2019): post-LayerNorm, learned positions, GELU; "
                    "exports as transformers' BertForPreTraining"))


__all__ = ["BertConfig", "BertModel", "BertPredictionHeadTransform", "PRESETS", "preset_config"]
