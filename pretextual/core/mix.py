"""The objective mix: the selected objectives, their weights, and the model they share.

Built from ``cfg.objectives`` through the plugin registry. The total loss is
``sum(weight_i(step) * loss_i) + sum(aux losses)``, computed from one encoder
forward pass, so the trainer backpropagates once through the shared encoder.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from pretextual.core.config import NO_OBJECTIVE, WeightSchedule, objective_options
from pretextual.core.encoder import BertModel, EncoderConfig
from pretextual.errors import ConfigError
from pretextual.plugins.api import (Batch, BuildContext, HeadFactory, Objective, ObjectiveSpec,
                                    StepInputs)
from pretextual.plugins.manager import Plugins


class PretrainingModel(nn.Module):
    """The shared encoder (``bert``, Hugging Face's key prefix) and the heads, by name."""

    def __init__(self, encoder_config: EncoderConfig, heads: dict[str, HeadFactory]):
        super().__init__()
        self.bert = BertModel(encoder_config)
        self.heads = nn.ModuleDict({name: factory(self.bert) for name, factory in heads.items()})


@dataclass
class Selected:
    name: str
    objective: Objective
    schedule: WeightSchedule


def check_objectives(objectives_cfg, plugins: Plugins
                     ) -> dict[str, tuple[ObjectiveSpec, WeightSchedule, Any]]:
    """Check ``cfg.objectives`` as far as it can be without the tokenizer, so a mistake
    is reported before the corpus is read: every name is a registered objective, its
    weight schedule and options are well typed and in range (the options' own
    ``check``), and some weight is not zero. Returns each objective's spec, schedule
    and options by name, as :class:`ObjectiveMix` builds them. Raises ConfigError (or
    PluginError for an unknown name) in one line naming the key."""
    checked = {}
    for name, raw in objectives_cfg.items():
        spec = plugins.objective(name)
        checked[name] = (spec, *objective_options(name, raw, spec.options))
    if not checked:
        raise ConfigError(NO_OBJECTIVE)
    if all(s.weight == 0 and s.start_weight == 0 for _, s, _ in checked.values()):
        raise ConfigError("objectives: every weight is zero, nothing would be trained "
                          f"({', '.join(f'objectives.{name}.weight' for name in checked)})")
    return checked


class ObjectiveMix:
    """The objectives a run selected, built and checked for conflicts once the tokenizer
    is known (before any step)."""

    def __init__(self, checked: dict[str, tuple[ObjectiveSpec, WeightSchedule, Any]],
                 context: BuildContext):
        """``checked``: what :func:`check_objectives` returned for the run's config."""
        context = dataclasses.replace(context, objectives=tuple(checked))
        self.selected = [Selected(name, spec.build(options, context), schedule)
                         for name, (spec, schedule, options) in checked.items()]
        self.example_builder = self._exclusive("example_builder", "build examples from documents")
        self.batch_transform = self._exclusive("batch_transform", "corrupt the batch")
        self.heads = self._heads()

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.selected]

    def _exclusive(self, attr: str, what: str):
        providers = [s for s in self.selected if getattr(s.objective, attr) is not None]
        if len(providers) > 1:
            a, b = providers[0].name, providers[1].name
            raise ConfigError(f"objectives: {a} and {b} conflict: both {what} and a batch has only "
                              f"one way of being built; drop one (e.g. ~objectives.{b})")
        return getattr(providers[0].objective, attr) if providers else None

    def _heads(self) -> dict[str, HeadFactory]:
        heads: dict[str, HeadFactory] = {}
        owner: dict[str, str] = {}
        for s in self.selected:
            for head, factory in s.objective.heads.items():
                if head in heads and heads[head] is not factory:
                    raise ConfigError(f"objectives: {owner[head]} and {s.name} both define a head "
                                      f"named {head!r} with different modules")
                heads.setdefault(head, factory)
                owner.setdefault(head, s.name)
        return heads

    def weights(self, step: int) -> dict[str, float]:
        """Each objective's weight at optimizer step ``step``."""
        return {s.name: s.schedule.at(step) for s in self.selected}

    def loss(self, model: PretrainingModel, batch: Batch, step: int
             ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Forward once through the encoder, then every objective; returns the
        weighted total and the per-term values and metrics (as tensors)."""
        model_batch = {k: batch[k] for k in ("input_ids", "attention_mask", "token_type_ids")}
        output = model.bert(**model_batch)
        inputs = StepInputs(batch=batch, encoder_output=output, heads=model.heads, encoder=model.bert)
        weights = self.weights(step)
        total = torch.zeros((), device=batch["input_ids"].device)
        logs: dict[str, torch.Tensor] = {}
        for s in self.selected:
            result = s.objective.loss(inputs)
            total = total + weights[s.name] * result.loss
            logs[f"loss/{s.name}"] = result.loss.detach()
            for key, value in result.aux_losses.items():
                total = total + value
                logs[f"loss/{s.name}.{key}"] = value.detach()
            for key, value in result.metrics.items():
                logs[f"{s.name}/{key}"] = torch.as_tensor(value).detach()
        return total, logs

