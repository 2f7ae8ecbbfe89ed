"""The BERT encoder: small nn.Modules in plain PyTorch.

Module and parameter names follow Hugging Face's ``BertModel`` exactly, so a
state dict moves between the two without renaming or reshaping and the same
weights give the same outputs.

Speed (measured in benchmarks/, see docs/benchmarks.md), without changing what
is computed:

* fp32 linear layers on the CPU run their three GEMMs (forward, input and
  weight gradients) through oneDNN, which uses AVX-512 where the default BLAS
  may not (:func:`linear`); ``PRETEXTUAL_ONEDNN_LINEAR=0`` turns this off;
* query, key and value are one GEMM on the concatenated weights (the
  parameters stay three ``nn.Linear``, as Hugging Face names them);
* the attention mask becomes an additive bias once per forward pass, and is
  dropped when no position is padding (CPU), so attention skips the masking;
* hidden-state dropout draws its mask with NumPy on the CPU (:func:`dropout`),
  about 3x faster than torch's bernoulli_;
* under ``torch.export`` (ONNX) attention is written out as
  matmul / scale / add mask / softmax / matmul, the pattern onnxruntime's
  transformer optimizer fuses into its Attention kernel.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


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


# --- fast paths -------------------------------------------------------------------------------

ONEDNN_ENV = "PRETEXTUAL_ONEDNN_LINEAR"
_onednn_op = None  # torch.ops.mkldnn._linear_pointwise once checked, False when unusable


def _onednn_linear_op():
    """oneDNN's linear on ordinary strided tensors, checked once; None when this
    torch lacks it, it disagrees with F.linear, or ``PRETEXTUAL_ONEDNN_LINEAR=0``."""
    global _onednn_op
    if _onednn_op is None:
        _onednn_op = False
        op = getattr(getattr(torch.ops, "mkldnn", None), "_linear_pointwise", None)
        if (op is not None and os.environ.get(ONEDNN_ENV, "1") != "0"
                and torch.backends.mkldnn.is_available()):
            try:
                g = torch.Generator().manual_seed(0)
                x, w = torch.randn(5, 12, generator=g), torch.randn(7, 12, generator=g)
                b, y = torch.randn(7, generator=g), torch.randn(5, 7, generator=g)
                # The three uses: forward, input gradient (transposed weight), weight
                # gradient (both operands transposed views).
                if (torch.allclose(op(x, w, b, "none", [], ""), F.linear(x, w, b), atol=1e-5)
                        and torch.allclose(op(y, w.t(), None, "none", [], ""), y @ w, atol=1e-5)
                        and torch.allclose(op(y.t(), x.t(), None, "none", [], ""), y.t() @ x,
                                           atol=1e-5)):
                    _onednn_op = op
            except Exception:  # not built in, or another signature: keep the default path
                pass
    return _onednn_op or None


def set_onednn_linear(enabled: bool) -> None:
    """Turn the oneDNN path of :func:`linear` on (when available) or off for this process."""
    global _onednn_op
    _onednn_op = None if enabled else False


def _autocast_enabled(device_type: str) -> bool:
    try:
        return torch.is_autocast_enabled(device_type)
    except TypeError:  # torch < 2.4
        return torch.is_autocast_cpu_enabled() if device_type == "cpu" else torch.is_autocast_enabled()


def _autocast_dtype(device_type: str) -> torch.dtype:
    try:
        return torch.get_autocast_dtype(device_type)
    except AttributeError:  # torch < 2.4
        return torch.get_autocast_cpu_dtype() if device_type == "cpu" else torch.get_autocast_gpu_dtype()


def _tracing() -> bool:
    """Under torch.compile, torch.export or the ONNX exporters (plain aten ops only there)."""
    compiler = getattr(torch, "compiler", None)
    if compiler is not None:
        if getattr(compiler, "is_compiling", lambda: False)():
            return True
        if getattr(compiler, "is_exporting", lambda: False)():
            return True
    return torch.jit.is_tracing() or torch.onnx.is_in_onnx_export()


def _exporting() -> bool:
    compiler = getattr(torch, "compiler", None)
    exporting = getattr(compiler, "is_exporting", lambda: False)() if compiler is not None else False
    return exporting or torch.onnx.is_in_onnx_export()


class _OneDNNLinear(torch.autograd.Function):
    """y = x W^T + b with every GEMM (forward and both gradients) through oneDNN."""

    @staticmethod
    def forward(ctx, x, weight, bias):
        op = _onednn_linear_op()
        # Dense rows: oneDNN is slow on operands with unusual strides (a [:, 0] slice).
        x2 = x.reshape(-1, x.shape[-1]).contiguous()
        y = op(x2, weight, bias, "none", [], "")
        ctx.save_for_backward(x2, weight)
        ctx.has_bias = bias is not None
        return y.view(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx, grad):
        op = _onednn_linear_op()
        x2, weight = ctx.saved_tensors
        g2 = grad.reshape(-1, grad.shape[-1]).contiguous()
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_x = op(g2, weight.t(), None, "none", [], "").view(*grad.shape[:-1], weight.shape[1])
        if ctx.needs_input_grad[1]:
            grad_w = op(g2.t(), x2.t(), None, "none", [], "")
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_b = g2.sum(0)
        return grad_x, grad_w, grad_b


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)``; fp32 on the CPU goes through oneDNN (same
    result within float rounding, faster where the default BLAS lacks AVX-512).
    Autocast, other devices and dtypes, and compiled or exported code take F.linear."""
    if (x.device.type == "cpu" and x.dtype == torch.float32 and weight.dtype == torch.float32
            and x.numel() > 0 and not _autocast_enabled("cpu") and not _tracing()
            and _onednn_linear_op() is not None):
        return _OneDNNLinear.apply(x, weight, bias)
    return F.linear(x, weight, bias)


class _Dropout(torch.autograd.Function):
    """Inverted dropout with its keep mask drawn by NumPy (PCG64, float32 uniforms,
    so the drop probability is exact to 2^-24), seeded from torch's generator."""

    @staticmethod
    def forward(ctx, x, p):
        seed = int(torch.randint(0, 2**62, (1,)).item())  # torch.manual_seed governs the stream
        uniform = np.random.Generator(np.random.PCG64(seed)).random(tuple(x.shape), dtype=np.float32)
        keep = torch.from_numpy(uniform >= p)
        scale = 1.0 / (1.0 - p)
        ctx.save_for_backward(keep)
        ctx.scale = scale
        return x.mul(keep).mul_(scale)

    @staticmethod
    def backward(ctx, grad):
        (keep,) = ctx.saved_tensors
        return grad.mul(keep).mul_(ctx.scale), None


def dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """``F.dropout(x, p, training)``: the same distribution (each element zeroed with
    probability p, the rest scaled by 1/(1-p)). On the CPU the mask comes from NumPy,
    about 3x faster than torch's bernoulli_, which was a fifth of a bf16 training step."""
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu" or p >= 1.0 or _tracing():
        return F.dropout(x, p, True)
    return _Dropout.apply(x, p)


class Dropout(nn.Dropout):
    """nn.Dropout (same name and no state, so Hugging Face's layout is kept) using :func:`dropout`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p, self.training)


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
        if keep.device.type == "cpu" and not _tracing() and bool(keep.all()):
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
        if _exporting():  # [batch, seq] position ids: the form onnxruntime's embedding fusion reads
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
        if _exporting():
            return self._explicit(x, attn_mask)
        if attn_mask is not None and attn_mask.dtype != torch.bool:
            # An additive mask in the dtype attention computes in (bf16 under autocast).
            dtype = _autocast_dtype(x.device.type) if _autocast_enabled(x.device.type) else x.dtype
            attn_mask = attn_mask.to(dtype)
        # One GEMM for query, key and value: [b, n, 3, heads, head_dim].
        weight = torch.cat([self.query.weight, self.key.weight, self.value.weight])
        bias = torch.cat([self.query.bias, self.key.bias, self.value.bias])
        qkv = linear(x, weight, bias).view(b, n, 3, self.num_heads, self.head_dim)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each [b, heads, n, head_dim]
        y = F.scaled_dot_product_attention(
            q, k, v, attn_mask=attn_mask, dropout_p=self.dropout_p if self.training else 0.0)
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
        if attn_mask is not None and attn_mask.dtype == torch.bool and not _exporting():
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


def count_parameters(module: nn.Module) -> int:
    """Number of distinct parameters (tied weights counted once)."""
    return sum(p.numel() for p in module.parameters())


def non_embedding_parameters(model: BertModel) -> int:
    """Parameters outside the embedding tables (the 6N of the FLOP estimate)."""
    return count_parameters(model) - count_parameters(model.embeddings)


__all__ = ["EncoderConfig", "EncoderOutput", "BertModel", "PRESETS", "preset_config",
           "count_parameters", "non_embedding_parameters", "linear", "attention_bias",
           "set_onednn_linear", "dropout", "Dropout"]
