"""The BERT encoder: small nn.Modules in plain PyTorch.

Module and parameter names follow Hugging Face's ``BertModel`` exactly, so a
state dict moves between the two without renaming or reshaping and the same
weights give the same outputs.

What differs from a textbook BERT is only how fast it runs, never what it
computes (measured in benchmarks/, see docs/benchmarks.md):

* linear layers and dropout go through :mod:`pretextual.core.fastpath`
  (oneDNN GEMMs on AMD CPUs, compiled dropout on the CPU);
* query, key and value are one GEMM on the concatenated weights (the
  parameters stay three ``nn.Linear``, as Hugging Face names them);
* the attention mask becomes an additive bias once per forward pass, and is
  dropped when no position is padding (CPU), so attention skips the masking;
* under ``torch.export`` (ONNX) attention is written out as
  matmul / scale / add mask / softmax / matmul, the pattern onnxruntime's
  transformer optimizer fuses into its Attention kernel.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

from pretextual.core.fastpath import Dropout, attention, exporting, linear, tracing


@dataclass
class EncoderConfig:
    """Sizes of a BERT encoder; field names are those of Hugging Face's BertConfig."""

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


def preset_config(name: str, **overrides) -> EncoderConfig:
    """The EncoderConfig of a named preset, with any field overridden."""
    layers, hidden, heads = PRESETS[name]
    fields = dict(num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                  intermediate_size=4 * hidden)
    fields.update(overrides)
    return EncoderConfig(**fields)


def attention_bias(attention_mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """The additive attention bias [batch, 1, 1, seq] of a 0/1 or boolean key mask
    (0 where a key may be attended to, the dtype's minimum where not, so a row with
    no key left gets a uniform, finite attention), or an additive mask as given.
    None when there is no mask or, on the CPU, when no key is masked."""
    if attention_mask is None:
        return None
    if attention_mask.dim() == 2:
        attention_mask = attention_mask[:, None, None, :]
    if attention_mask.dtype == torch.bool or not attention_mask.is_floating_point():
        keep = attention_mask.bool()
        if keep.device.type == "cpu" and not tracing() and bool(keep.all()):
            return None  # nothing to mask; checking costs no device sync on the CPU
        return torch.zeros(keep.shape, dtype=dtype, device=keep.device).masked_fill_(
            ~keep, torch.finfo(dtype).min)
    return attention_mask


@dataclass
class EncoderOutput:
    """What the encoder hands to the heads."""

    last_hidden_state: torch.Tensor  # [batch, seq, hidden]
    pooler_output: torch.Tensor  # [batch, hidden]: tanh(dense([CLS]))


class BertEmbeddings(nn.Module):
    def __init__(self, config: EncoderConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size,
                                            padding_idx=config.pad_token_id)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = Dropout(config.hidden_dropout_prob)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        if exporting():  # [batch, seq] position ids: the form onnxruntime's embedding fusion reads
            positions = positions[None, :].expand_as(input_ids)
        x = (self.word_embeddings(input_ids) + self.position_embeddings(positions)
             + self.token_type_embeddings(token_type_ids))
        return self.dropout(self.LayerNorm(x))


class BertSelfAttention(nn.Module):
    def __init__(self, config: EncoderConfig):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.head_dim = config.hidden_size // config.num_attention_heads
        self.query = nn.Linear(config.hidden_size, config.hidden_size)
        self.key = nn.Linear(config.hidden_size, config.hidden_size)
        self.value = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout_p = config.attention_probs_dropout_prob

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None) -> torch.Tensor:
        """``attn_mask``: None, a boolean [b, 1, 1, n] key mask (True: may attend), or
        an additive float mask broadcastable to [b, heads, n, n]."""
        b, n, h = x.shape
        if exporting():
            return self._explicit(x, attn_mask)
        if attn_mask is not None and attn_mask.dtype != torch.bool:
            # An additive mask in the dtype attention computes in (bf16 under autocast).
            device = x.device.type
            dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else x.dtype
            attn_mask = attn_mask.to(dtype)
        # One GEMM for query, key and value: [b, n, 3, heads, head_dim].
        weight = torch.cat([self.query.weight, self.key.weight, self.value.weight])
        bias = torch.cat([self.query.bias, self.key.bias, self.value.bias])
        qkv = linear(x, weight, bias).view(b, n, 3, self.num_heads, self.head_dim)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each [b, heads, n, head_dim]
        y = attention(q, k, v, attn_mask, self.dropout_p if self.training else 0.0)
        return y.transpose(1, 2).reshape(b, n, h)

    def _explicit(self, x: torch.Tensor, attn_mask: torch.Tensor | None) -> torch.Tensor:
        """The same attention as separate ops (for export: the pattern graph optimizers fuse)."""
        b, n, h = x.shape
        q = self.query(x).view(b, n, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.key(x).view(b, n, self.num_heads, self.head_dim).permute(0, 2, 3, 1)
        v = self.value(x).view(b, n, self.num_heads, self.head_dim).transpose(1, 2)
        scores = torch.matmul(q, k) / math.sqrt(self.head_dim)
        if attn_mask is not None:
            if attn_mask.dtype == torch.bool:
                attn_mask = torch.zeros(attn_mask.shape, dtype=scores.dtype, device=scores.device
                                        ).masked_fill(~attn_mask, torch.finfo(scores.dtype).min)
            scores = scores + attn_mask
        probs = F.dropout(torch.softmax(scores, dim=-1), self.dropout_p, self.training)
        return torch.matmul(probs, v).transpose(1, 2).reshape(b, n, h)


class BertSelfOutput(nn.Module):
    """Projection, dropout, residual, post-LayerNorm (names as in Hugging Face)."""

    def __init__(self, in_size: int, config: EncoderConfig):
        super().__init__()
        self.dense = nn.Linear(in_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = Dropout(config.hidden_dropout_prob)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dropout(linear(x, self.dense.weight, self.dense.bias)) + residual)


class BertAttention(nn.Module):
    def __init__(self, config: EncoderConfig):
        super().__init__()
        self.self = BertSelfAttention(config)
        self.output = BertSelfOutput(config.hidden_size, config)

    def forward(self, x, attn_mask):
        return self.output(self.self(x, attn_mask), x)


class BertIntermediate(nn.Module):
    def __init__(self, config: EncoderConfig):
        super().__init__()
        if config.hidden_act != "gelu":
            raise ValueError(f"hidden_act {config.hidden_act!r} is not supported (only 'gelu')")
        self.dense = nn.Linear(config.hidden_size, config.intermediate_size)

    def forward(self, x):
        return F.gelu(linear(x, self.dense.weight, self.dense.bias))


class BertLayer(nn.Module):
    def __init__(self, config: EncoderConfig):
        super().__init__()
        self.attention = BertAttention(config)
        self.intermediate = BertIntermediate(config)
        self.output = BertSelfOutput(config.intermediate_size, config)

    def forward(self, x, attn_mask):
        x = self.attention(x, attn_mask)
        return self.output(self.intermediate(x), x)


class BertEncoder(nn.Module):
    def __init__(self, config: EncoderConfig):
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(config) for _ in range(config.num_hidden_layers))

    def forward(self, x, attn_mask):
        """``attn_mask``: None, a boolean [b, 1, 1, n] key mask, or an additive mask."""
        if attn_mask is not None and attn_mask.dtype == torch.bool and not exporting():
            attn_mask = attention_bias(attn_mask, x.dtype)  # once, not once per layer
        for layer in self.layer:
            x = layer(x, attn_mask)
        return x


class BertPooler(nn.Module):
    def __init__(self, config: EncoderConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.tanh(linear(hidden[:, 0], self.dense.weight, self.dense.bias))


class BertModel(nn.Module):
    """BERT: embeddings, post-LN transformer layers with GELU, and the [CLS] pooler."""

    def __init__(self, config: EncoderConfig):
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
                token_type_ids: torch.Tensor | None = None) -> EncoderOutput:
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        x = self.embeddings(input_ids, token_type_ids)
        attn_mask = None
        if attention_mask is not None:
            # [b, 1, 1, n] boolean: True where a key may be attended to.
            attn_mask = attention_mask.bool()[:, None, None, :]
        x = self.encoder(x, attn_mask)
        return EncoderOutput(last_hidden_state=x, pooler_output=self.pooler(x))

    def get_input_embeddings(self) -> nn.Embedding:
        """The word-embedding table, as Hugging Face names its accessor: what a head ties
        its output projection to."""
        return self.embeddings.word_embeddings


def count_parameters(module: nn.Module) -> int:
    """Number of distinct parameters (tied weights counted once)."""
    return sum(p.numel() for p in module.parameters())


def non_embedding_parameters(model: BertModel) -> int:
    """Parameters outside the embedding tables (the 6N of the FLOP estimate)."""
    return count_parameters(model) - count_parameters(model.embeddings)


__all__ = ["EncoderConfig", "EncoderOutput", "BertModel", "PRESETS", "preset_config",
           "count_parameters", "non_embedding_parameters", "attention_bias"]
