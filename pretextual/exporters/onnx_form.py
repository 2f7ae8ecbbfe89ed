"""The encoder in the form onnxruntime's transformer optimizer fuses, for the ONNX export.

The same function as the plain encoder, written as the graph patterns onnxruntime
recognises: for BERT, attention as matmul / scale / add mask / softmax / matmul (fused
into its Attention kernel; ``F.scaled_dot_product_attention`` exports as a pattern it
does not fuse), [batch, seq] position ids (what its embedding fusion reads) and a float
mask built once; for both, every position padded (unpadding would give the graph
data-dependent shapes). Applied to a copy of the encoder, by class swap, so the trained
model is untouched; an architecture with no swaps here exports as it is.
"""

from __future__ import annotations

import copy
import math

import torch
from torch import nn

from pretextual.architectures.bert import BertEmbeddings, BertModel, BertSelfAttention
from pretextual.architectures.common import EncoderOutput
from pretextual.architectures.modernbert import ModernBertModel


class ExportEmbeddings(BertEmbeddings):
    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        positions = positions[None, :].expand_as(input_ids)
        x = (self.word_embeddings(input_ids) + self.position_embeddings(positions)
             + self.token_type_embeddings(token_type_ids))
        return self.dropout(self.LayerNorm(x))


class ExportSelfAttention(BertSelfAttention):
    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None) -> torch.Tensor:
        """``x``: [b, n, hidden], padded: the graph stays in the shapes onnxruntime fuses."""
        b, n, h = x.shape
        q = self.query(x).view(b, n, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.key(x).view(b, n, self.num_heads, self.head_dim).permute(0, 2, 3, 1)
        v = self.value(x).view(b, n, self.num_heads, self.head_dim).transpose(1, 2)
        scores = torch.matmul(q, k) / math.sqrt(self.head_dim)
        if attn_mask is not None:
            scores = scores + attn_mask
        probs = torch.softmax(scores, dim=-1)
        return torch.matmul(probs, v).transpose(1, 2).reshape(b, n, h)


class ExportBertModel(BertModel):
    def forward(self, input_ids, attention_mask, token_type_ids, document_ids=None):
        # Padded, not unpadded (data-dependent shapes defeat the fusions), with an additive
        # float mask: masked keys get the dtype's minimum, so a fully masked row gets a
        # uniform (finite) attention in any runtime instead of NaN.
        x = self.embeddings(input_ids, token_type_ids)
        blocked = 1.0 - attention_mask[:, None, None, :].to(x.dtype)
        mask = blocked * torch.finfo(x.dtype).min
        for layer in self.encoder.layer:
            attention = layer.attention
            x = attention.output(attention.self(x, mask), x)
            x = layer.output(layer.intermediate(x), x)
        return EncoderOutput(last_hidden_state=x, pooler_output=self.pooler(x))


class ExportModernBertModel(ModernBertModel):
    def forward(self, input_ids, attention_mask, token_type_ids, document_ids=None):
        # Every position, padding included, and the padding mask always: finding the real
        # tokens would give the graph data-dependent shapes.
        every = torch.arange(input_ids.numel(), device=input_ids.device)
        return self.encode(input_ids, every, attention_mask, document_ids)


SWAPS = {BertModel: ExportBertModel, BertEmbeddings: ExportEmbeddings,
         BertSelfAttention: ExportSelfAttention, ModernBertModel: ExportModernBertModel}


def export_form(encoder: nn.Module) -> nn.Module:
    """An evaluation-mode copy of ``encoder`` whose embeddings and attention are in the
    fusable form (the accelerated subclasses a training run swapped in included)."""
    copied = copy.deepcopy(encoder).eval()
    for module in copied.modules():
        for plain, form in SWAPS.items():
            if isinstance(module, plain):
                module.__class__ = form
        if isinstance(module, nn.Dropout):  # eval: identity; a plain one exports as nothing
            module.__class__ = nn.Dropout
    return copied
