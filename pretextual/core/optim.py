"""The optimizer and its learning-rate schedule: AdamW as BERT uses it, linear warm-up
then linear decay to zero."""

from __future__ import annotations

import torch


def decay_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Parameter groups: BERT excludes biases and LayerNorm weights from weight decay."""
    decay, no_decay = [], []
    for _, p in model.named_parameters():
        (no_decay if p.ndim < 2 else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def adamw(groups, **settings) -> torch.optim.AdamW:
    """AdamW, fused (one kernel for all parameters) where torch has it for the parameters'
    device, else torch's default implementation."""
    try:
        return torch.optim.AdamW(groups, fused=True, **settings)
    except RuntimeError:  # no fused kernel for this device or dtype
        return torch.optim.AdamW(groups, **settings)


def linear_schedule(warmup_steps: int, max_steps: int):
    """The factor of the peak learning rate at each step: up to 1 over ``warmup_steps``,
    then down to 0 at ``max_steps``."""
    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        return max(0.0, (max_steps - step) / max(1, max_steps - warmup_steps))
    return factor
