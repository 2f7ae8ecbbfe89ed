"""Optimizers and learning-rate schedules, by name (trainer.optimizer, trainer.lr_schedule).

Each registry holds the built-ins; a plugin adds its own through the
pretextual_register_optimizers and pretextual_register_lr_schedules hooks. A schedule
is the factor of trainer.lr at each optimizer step: a pure function of the step and
the config, so a resumed run (even with a new trainer.max_steps) continues it exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch

from pretextual.plugins.api import LRScheduleSpec, OptimizerSpec
from pretextual.plugins.hookspecs import hookimpl


def decay_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Parameter groups: BERT excludes biases and LayerNorm weights from weight decay."""
    decay, no_decay = [], []
    for _, p in model.named_parameters():
        (no_decay if p.ndim < 2 else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def adamw(groups, trainer) -> torch.optim.Optimizer:
    """AdamW with trainer.adam_beta1/beta2/eps, fused (one kernel for all parameters) where
    torch has it for the parameters' device, else torch's default implementation."""
    settings = dict(lr=trainer.lr, betas=(trainer.adam_beta1, trainer.adam_beta2),
                    eps=trainer.adam_eps)
    try:
        return torch.optim.AdamW(groups, fused=True, **settings)
    except RuntimeError:  # no fused kernel for this device or dtype
        return torch.optim.AdamW(groups, **settings)


def adafactor(groups, trainer) -> torch.optim.Optimizer:
    """torch's Adafactor (factored second moments: memory of a row and a column per matrix,
    not a full second moment), at trainer.lr; the Adam betas and eps do not apply."""
    return torch.optim.Adafactor(groups, lr=trainer.lr)


OptimizerFactory = Callable[[list, object], torch.optim.Optimizer]
OPTIMIZERS: dict[str, OptimizerFactory] = {"adamw": adamw, "adafactor": adafactor}
"""The built-in optimizers (registered below): name -> factory(parameter groups, trainer
config) -> optimizer."""


@dataclass(frozen=True)
class ScheduleSettings:
    """What a learning-rate schedule is built from (the trainer config's keys)."""

    warmup_steps: int
    max_steps: int
    min_lr_ratio: float = 0.0
    decay_steps: int | None = None
    decay_fraction: float = 0.1
    decay_shape: str = "linear"

    @classmethod
    def of(cls, trainer) -> "ScheduleSettings":
        return cls(trainer.warmup_steps, trainer.max_steps, trainer.min_lr_ratio,
                   trainer.decay_steps, trainer.decay_fraction, trainer.decay_shape)


def _warmup(s: ScheduleSettings, after: Callable[[int], float]) -> Callable[[int], float]:
    """Linear warm-up to 1 over s.warmup_steps, then ``after``."""
    def factor(step: int) -> float:
        if step < s.warmup_steps:
            return (step + 1) / s.warmup_steps
        return after(step)
    return factor


def _floor(s: ScheduleSettings, decayed: float) -> float:
    """A decay from 1 to 0 mapped onto 1 to trainer.min_lr_ratio."""
    return s.min_lr_ratio + (1.0 - s.min_lr_ratio) * decayed


def _progress(s: ScheduleSettings, step: int) -> float:
    """How far the decay after warm-up has gone: 0 at its start, 1 at max_steps."""
    return min(1.0, max(0.0, (step - s.warmup_steps) / max(1, s.max_steps - s.warmup_steps)))


DECAY_SHAPES: dict[str, Callable[[float], float]] = {
    "linear": lambda x: 1.0 - x,
    "cosine": lambda x: 0.5 * (1.0 + math.cos(math.pi * x)),
    "1-sqrt": lambda x: 1.0 - math.sqrt(x),
}
"""trainer.decay_shape of the warmup-stable-decay schedule: progress 0..1 -> factor 1..0."""


def linear(s: ScheduleSettings) -> Callable[[int], float]:
    """Warm-up, then linear decay to min_lr_ratio at max_steps (BERT's)."""
    return _warmup(s, lambda step: _floor(s, 1.0 - _progress(s, step)))


def cosine(s: ScheduleSettings) -> Callable[[int], float]:
    """Warm-up, then a half cosine to min_lr_ratio at max_steps."""
    return _warmup(s, lambda step: _floor(s, DECAY_SHAPES["cosine"](_progress(s, step))))


def constant(s: ScheduleSettings) -> Callable[[int], float]:
    """Warm-up, then the peak learning rate to the end."""
    return _warmup(s, lambda step: 1.0)


def inverse_sqrt(s: ScheduleSettings) -> Callable[[int], float]:
    """Warm-up, then the peak scaled by sqrt(warmup / step) (the Transformer's)."""
    start = max(1, s.warmup_steps)
    return _warmup(s, lambda step: math.sqrt(start / (step + 1)) if step + 1 > start else 1.0)


def wsd(s: ScheduleSettings) -> Callable[[int], float]:
    """Warmup-stable-decay: warm-up, the peak until the last decay_steps (unset:
    decay_fraction of max_steps), then decay_shape down to min_lr_ratio at max_steps. A
    stable checkpoint resumed with a new max_steps decays toward the new end."""
    decay = s.decay_steps if s.decay_steps is not None else round(s.decay_fraction * s.max_steps)
    start, shape = s.max_steps - decay, DECAY_SHAPES[s.decay_shape]
    return _warmup(s, lambda step: 1.0 if step < start
                   else _floor(s, shape(min(1.0, (step - start) / max(1, decay)))))


LR_SCHEDULES: dict[str, Callable[[ScheduleSettings], Callable[[int], float]]] = {
    "linear": linear, "cosine": cosine, "constant": constant, "inverse_sqrt": inverse_sqrt,
    "wsd": wsd}
"""The built-in schedules (registered below): name -> factory(ScheduleSettings) -> (step ->
factor of trainer.lr)."""


@hookimpl
def pretextual_register_optimizers(register):
    for name, build in OPTIMIZERS.items():
        register(OptimizerSpec(name=name, build=build, description=build.__doc__.split(".")[0]))


@hookimpl
def pretextual_register_lr_schedules(register):
    for name, build in LR_SCHEDULES.items():
        register(LRScheduleSpec(name=name, build=build, description=build.__doc__.split(".")[0]))
