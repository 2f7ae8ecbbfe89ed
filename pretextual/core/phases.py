"""Training phases (trainer.phases): parts of one run, one after another in one run
directory, each with its own sequence length, batch size, step count and peak learning
rate, as BERT trains 90% of its steps at 128 tokens and the rest at 512.

The learning-rate schedule spans the whole run (its warm-up at the start, its decay to
the end); a phase's lr is the peak it scales. Each phase reads its own stream of batches
(its own seed), built for its length, from its first step; so the step alone says where
a run is, and a resume inside a phase continues it exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

from omegaconf import DictConfig, OmegaConf

from pretextual.errors import ConfigError

PHASE_SEED_OFFSET = 104_729
"""Each phase's batches are drawn with the run's seed plus this times the phase's index."""


@dataclass(frozen=True)
class Phase:
    """One phase: optimizer steps [start, end) of the run, and what it trains with."""

    index: int
    name: str
    start: int
    end: int
    max_seq_length: int
    batch_size: int
    lr: float

    def describe(self, count: int) -> str:
        return (f"phase {self.index + 1}/{count} ({self.name}): steps {self.start}-{self.end}, "
                f"{self.max_seq_length} tokens, batch {self.batch_size}, peak lr {self.lr:g}")


def plan(cfg: DictConfig) -> list[Phase]:
    """The run's phases: trainer.phases, or one phase of the whole run. A phase longer
    than the position table, or without a positive step count, is a ConfigError."""
    d, t = cfg.data, cfg.trainer
    if not t.phases:
        return [Phase(0, "all", 0, t.max_steps, d.max_seq_length, d.batch_size, t.lr)]
    phases, start = [], 0
    for i, p in enumerate(t.phases):
        key = f"trainer.phases[{i}]"
        if p.steps is None or not p.steps > 0:
            raise ConfigError(f"{key}.steps must be positive, got {p.steps}")
        length = p.max_seq_length if p.max_seq_length is not None else d.max_seq_length
        if not 8 <= length <= cfg.model.max_position_embeddings:
            raise ConfigError(f"{key}.max_seq_length={length}: must be at least 8 and at most "
                              f"model.max_position_embeddings={cfg.model.max_position_embeddings}")
        batch = p.batch_size if p.batch_size is not None else d.batch_size
        lr = p.lr if p.lr is not None else t.lr
        if not batch > 0 or not lr >= 0:
            raise ConfigError(f"{key}: batch_size must be positive and lr not negative, got "
                              f"{batch} and {lr}")
        phases.append(Phase(i, p.name or f"{length} tokens", start, start + p.steps, length,
                            batch, lr))
        start += p.steps
    return phases


def phase_at(phases: list[Phase], step: int) -> Phase:
    """The phase optimizer step ``step`` (0-based, the one about to be made) belongs to;
    the last phase from its end on."""
    return next((p for p in phases if step < p.end), phases[-1])


def data_config(data: DictConfig, phase: Phase) -> DictConfig:
    """data.* as ``phase`` trains with it."""
    return OmegaConf.merge(data, {"max_seq_length": phase.max_seq_length,
                                  "batch_size": phase.batch_size})
