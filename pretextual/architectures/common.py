"""What every encoder architecture shares: its output, the attention masks of padded and
packed batches, positions that restart at each document, and parameter counts."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


@dataclass
class EncoderOutput:
    """What the encoder hands to the heads."""

    last_hidden_state: torch.Tensor  # [batch, seq, hidden]
    pooler_output: torch.Tensor  # [batch, hidden]: the architecture's [CLS] summary


def attention_bias(attention_mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The additive attention bias of a boolean mask (True: may be attended to): 0 where a
    key may be attended to, the dtype's minimum where not, so a row with no key left gets
    a uniform, finite attention instead of NaN."""
    return torch.zeros(attention_mask.shape, dtype=dtype, device=attention_mask.device
                       ).masked_fill_(~attention_mask, torch.finfo(dtype).min)


def allowed_keys(attention_mask: torch.Tensor | None, document_ids: torch.Tensor | None,
                 window: int | None, length: int, device: torch.device) -> torch.Tensor | None:
    """Which keys each query may attend to, as a boolean mask broadcastable to
    [batch, heads, queries, keys], or None when every key may be: not padding
    (``attention_mask``), in the query's own document (``document_ids``) and, with a
    ``window``, at most that many positions away."""
    allowed = None if attention_mask is None else attention_mask.bool()[:, None, None, :]
    if document_ids is not None:
        same = (document_ids[:, :, None] == document_ids[:, None, :])[:, None]
        allowed = same if allowed is None else allowed & same
    if window is not None:
        index = torch.arange(length, device=device)
        near = (index[:, None] - index[None, :]).abs() <= window
        allowed = near if allowed is None else allowed & near
    return allowed


def real_positions(attention_mask: torch.Tensor | None, batch: int, length: int,
                   device: torch.device) -> torch.Tensor:
    """The flat positions (row-major in [batch, length], ascending) of the tokens that are
    not padding, found once per forward pass: one device sync, as unpadding always costs."""
    if attention_mask is None:
        return torch.arange(batch * length, device=device)
    return attention_mask.flatten().nonzero().squeeze(1)


def unpad(x: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """The rows of [b * n, d] ``x`` at the flat positions ``real`` (``x`` itself when no
    position is padding: nothing to drop, nothing to copy)."""
    return x if len(real) == len(x) else x.index_select(0, real)


def repad(x: torch.Tensor, real: torch.Tensor, size: int) -> torch.Tensor:
    """[tokens, d] rows placed at the flat positions ``real`` of ``size`` rows, zeros
    elsewhere (``x`` itself when there is no padding)."""
    return x if len(real) == size else x.new_zeros(size, x.shape[-1]).index_copy(0, real, x)


def document_positions(document_ids: torch.Tensor) -> torch.Tensor:
    """[batch, seq] positions that restart at 0 where each document of a packed row begins."""
    index = torch.arange(document_ids.shape[1], device=document_ids.device).expand_as(document_ids)
    begins = torch.ones_like(document_ids, dtype=torch.bool)
    begins[:, 1:] = document_ids[:, 1:] != document_ids[:, :-1]
    start = torch.where(begins, index, torch.zeros_like(index)).cummax(dim=1).values
    return index - start


def count_parameters(module: nn.Module) -> int:
    """Number of distinct parameters (tied weights counted once)."""
    return sum(p.numel() for p in module.parameters())


def non_embedding_parameters(model: nn.Module) -> int:
    """Parameters outside the embedding tables (the 6N of the FLOP estimate)."""
    return count_parameters(model) - count_parameters(model.embeddings)
