"""The objective mix: the selected objectives, their weights, and the model they share.

Built from ``cfg.objectives`` through the plugin registry. The total loss is
``sum(weight_i(step) * loss_i) + sum(aux losses)``, computed from one encoder
forward pass, so the trainer backpropagates once through the shared encoder.
"""

from __future__ import annotations

import dataclasses
import numbers
from dataclasses import dataclass
from typing import Any, Callable

import torch
from omegaconf import OmegaConf
from torch import nn

from pretextual.core.config import WeightSchedule, objective_options
from pretextual.core.config_checks import NO_OBJECTIVE
from pretextual.errors import ConfigError, PluginError, PluginRunError, plugin_call
from pretextual.plugins.api import (PARTS, Batch, BuildContext, HeadFactory, Objective,
                                    ObjectiveOutput, ObjectiveSpec, StepInputs)
from pretextual.plugins.manager import NAME, Plugins

MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
DOCUMENT_IDS = "document_ids"
"""The batch key of each token's document in a packed example, which the encoder reads
under data.document_attention."""
WHAT_PARTS_DO = {"example_builder": "build examples from documents",
                 "batch_transform": "corrupt the batch"}


class PretrainingModel(nn.Module):
    """The shared encoder and the heads, by name. The encoder is ``bert`` whatever its
    architecture: the key prefix of every checkpoint's encoder tensors."""

    def __init__(self, encoder: nn.Module, heads: dict[str, HeadFactory]):
        super().__init__()
        self.bert = encoder
        self.heads = nn.ModuleDict()
        for name, factory in heads.items():
            head = plugin_call(f"head {name!r}", "its factory", factory, self.bert)
            if not isinstance(head, nn.Module):
                raise PluginError(f"head {name!r}: its factory returned {type(head).__name__}, "
                                  f"not an nn.Module")
            self.heads[name] = head


@dataclass
class Selected:
    name: str
    objective: Objective
    schedule: WeightSchedule
    options: Any = None


def check_objectives(objectives_cfg, plugins: Plugins
                     ) -> dict[str, tuple[ObjectiveSpec, WeightSchedule, Any]]:
    """Check ``cfg.objectives`` as far as it can be without the tokenizer, so a mistake
    is reported before the corpus is read: every name is a registered objective, its
    weight schedule and options are well typed and in range (the options' own
    ``check``), some weight is not zero, and no two objectives provide the same
    exclusive part. Returns each objective's spec, schedule and options by name, as
    :class:`ObjectiveMix` builds them. Raises ConfigError (or PluginError for an
    unknown name) in one line naming the key."""
    checked = {}
    for name, raw in objectives_cfg.items():
        spec = plugins.objective(name)
        checked[name] = (spec, *objective_options(name, raw, spec.options))
    if not checked:
        raise ConfigError(NO_OBJECTIVE)
    if all(s.weight == 0 and s.start_weight == 0 for _, s, _ in checked.values()):
        raise ConfigError("objectives: every weight is zero, nothing would be trained "
                          f"({', '.join(f'objectives.{name}.weight' for name in checked)})")
    provided = {name: provides(name, spec, options) for name, (spec, _, options) in checked.items()}
    for part, what in WHAT_PARTS_DO.items():
        providers = [name for name, parts in provided.items() if part in parts]
        if len(providers) > 1:
            a, b = providers[:2]
            raise ConfigError(f"objectives: {a} and {b} conflict: both {what} and a batch has only "
                              f"one way of being built; drop one (e.g. ~objectives.{b})")
    return checked


def provides(name: str, spec: ObjectiveSpec, options: Any) -> frozenset[str]:
    """The exclusive parts objective ``name`` declares for ``options`` (its spec's
    ``provides``); PluginError unless they are a collection of :data:`PARTS`."""
    declared = spec.provides
    if callable(declared):
        declared = plugin_call(f"objectives.{name}", "provides()", declared, options)
    try:  # a bare string would be read as a set of letters
        parts = None if isinstance(declared, str) else frozenset(declared)
    except TypeError:
        parts = None
    if parts is None or not parts <= set(PARTS):
        raise PluginError(f"objectives.{name}: provides must be a collection of "
                          f"{', '.join(map(repr, PARTS))}, got {declared!r}")
    return parts


def resolved_objectives(checked: dict[str, tuple[ObjectiveSpec, WeightSchedule, Any]]
                        ) -> dict[str, dict[str, Any]]:
    """Every key of each objective as the run reads it, typed and with defaults filled in
    (``weight: 1`` from the command line is ``1.0``): what config.yaml records and
    ``pretextual config`` prints."""
    resolved = {}
    for name, (_, schedule, options) in checked.items():
        own = {} if options is None else OmegaConf.to_container(OmegaConf.structured(options))
        resolved[name] = {**dataclasses.asdict(schedule), **own}
    return resolved


class ObjectiveMix:
    """The objectives a run selected, built once the tokenizer is known (before any
    step), each holding the exclusive parts its spec declared."""

    def __init__(self, checked: dict[str, tuple[ObjectiveSpec, WeightSchedule, Any]],
                 context: BuildContext):
        """``checked``: what :func:`check_objectives` returned for the run's config."""
        context = dataclasses.replace(context, objectives=tuple(checked))
        self.selected = []
        for name, (spec, schedule, options) in checked.items():
            objective = plugin_call(f"objectives.{name}", "build()", spec.build, options, context)
            if not isinstance(objective, Objective):
                raise PluginError(f"objectives.{name}: build() must return a pretextual.Objective, "
                                  f"got {type(objective).__name__}")
            _check_parts(name, objective, provides(name, spec, options))
            if schedule.schedules and objective.batch_transform is None:
                raise ConfigError(f"objectives.{name}.schedules: {name} has no batch transform, "
                                  f"and only what a batch transform reads can follow a schedule")
            self.selected.append(Selected(name, objective, schedule, options))
        self.example_builder = self._exclusive("example_builder", _CheckedBuilder)
        self.batch_transform = self._exclusive("batch_transform", _CheckedTransform)
        for name, (spec, schedule, options) in checked.items():
            if schedule.schedules and self.batch_transform.name == name:
                self.batch_transform.scheduled = _ScheduledOptions(name, spec, options,
                                                                   schedule.schedules, context)
        self.heads = self._heads()
        self._grad_checked = False  # whether a training step has checked that losses backpropagate

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.selected]

    def _exclusive(self, part: str, wrapper: type[_Checked]) -> _Checked | None:
        """The one provider of ``part`` (check_objectives refused two), wrapped."""
        for s in self.selected:
            if getattr(s.objective, part) is not None:
                return wrapper(s.name, getattr(s.objective, part))
        return None

    def _heads(self) -> dict[str, HeadFactory]:
        heads: dict[str, HeadFactory] = {}
        owner: dict[str, str] = {}
        for s in self.selected:
            for head, factory in s.objective.heads.items():
                if not isinstance(head, str) or not NAME.fullmatch(head):
                    raise PluginError(f"objectives.{s.name}: head name {head!r} is not a state-dict "
                                      f"key (letters, digits, _ and -)")
                if isinstance(factory, nn.Module) or not callable(factory):
                    raise PluginError(f"objectives.{s.name}: heads[{head!r}] must be a factory (a "
                                      f"class or function taking the encoder), got "
                                      f"{type(factory).__name__}")
                if head in heads and heads[head] is not factory:
                    raise ConfigError(f"objectives: {owner[head]} and {s.name} both define a head "
                                      f"named {head!r} with different modules")
                heads.setdefault(head, factory)
                owner.setdefault(head, s.name)
        return heads

    def weights(self, step: int) -> dict[str, float]:
        """Each objective's weight at optimizer step ``step``."""
        return {s.name: s.schedule.at(step) for s in self.selected}

    def option_values(self, step: int) -> dict[str, float]:
        """``<objective>/<option>``: each scheduled option's value at step ``step``."""
        scheduled = getattr(self.batch_transform, "scheduled", None)
        if scheduled is None:
            return {}
        return {f"{scheduled.name}/{k}": v for k, v in scheduled.values(step).items()}

    def loss(self, model: PretrainingModel, batch: Batch, step: int
             ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Forward once through the encoder, then every objective; returns the
        weighted total and the per-term values and metrics (as tensors)."""
        model_batch = {k: batch[k] for k in (*MODEL_INPUTS, DOCUMENT_IDS) if k in batch}
        output = model.bert(**model_batch)
        inputs = StepInputs(batch=batch, encoder_output=output, heads=model.heads, encoder=model.bert)
        weights = self.weights(step)
        total = torch.zeros((), device=batch["input_ids"].device)
        logs: dict[str, torch.Tensor] = {}
        for s in self.selected:
            result = plugin_call(f"objectives.{s.name}", "loss()", s.objective.loss, inputs)
            _check_output(s.name, result, first=not self._grad_checked)
            total = total + weights[s.name] * result.loss
            logs[f"loss/{s.name}"] = result.loss.detach()
            for key, value in result.aux_losses.items():
                total = total + value
                logs[f"loss/{s.name}.{key}"] = value.detach()
            for key, value in result.metrics.items():
                logs[f"{s.name}/{key}"] = torch.as_tensor(value).detach()
        self._grad_checked = self._grad_checked or torch.is_grad_enabled()
        return total, logs


def _check_parts(name: str, objective: Objective, declared: frozenset[str]) -> None:
    """PluginError unless the built objective fills exactly the parts its spec declared,
    which is what the conflict check before tokenizing relied on."""
    for part in PARTS:
        built = getattr(objective, part) is not None
        if built and part not in declared:
            raise PluginError(f"objectives.{name}: build() returned a {part}, but its ObjectiveSpec "
                              f"does not declare it; add provides=({part!r},) so a conflicting mix "
                              f"is refused before the corpus is read")
        if part in declared and not built:
            raise PluginError(f"objectives.{name}: its ObjectiveSpec declares provides {part!r}, "
                              f"but build() returned no {part}")


def _check_loss(where: str, value: Any, first: bool) -> None:
    if not (isinstance(value, torch.Tensor) and value.is_floating_point() and value.dim() == 0):
        got = (f"a {value.dtype} tensor of shape {list(value.shape)}" if isinstance(value, torch.Tensor)
               else type(value).__name__)
        raise PluginRunError(f"{where} must be a 0-dim floating-point tensor (a mean), got {got}")
    # On the first training step only: a later batch may rightly have nothing to predict
    # and return a constant zero.
    if first and torch.is_grad_enabled() and not value.requires_grad:
        raise PluginRunError(f"{where} does not depend on any parameter (detached, or a "
                             f"constant), so nothing would learn from it")


def _check_output(name: str, result: Any, first: bool) -> None:
    """PluginRunError naming the objective unless ``result`` is an ObjectiveOutput of
    scalar losses (that backpropagate, checked on the ``first`` training step) and of
    scalar metrics: checks of Python attributes only, no device synchronisation."""
    where = f"objectives.{name}: loss()"
    if not isinstance(result, ObjectiveOutput):
        raise PluginRunError(f"{where} must return a pretextual.ObjectiveOutput, got "
                             f"{type(result).__name__}")
    _check_loss(f"{where}'s loss", result.loss, first)
    for key, value in result.aux_losses.items():
        _check_loss(f"{where}'s aux_losses[{key!r}]", value, first)
    for key, value in result.metrics.items():
        if not (isinstance(value, torch.Tensor) and value.numel() == 1
                or isinstance(value, numbers.Real)):
            got = (f"shape {list(value.shape)}" if isinstance(value, torch.Tensor)
                   else type(value).__name__)
            raise PluginRunError(f"{where}'s metrics[{key!r}] must be a number or a one-element "
                                 f"tensor, got {got}")


class _Checked:
    """An objective's example builder or batch transform, its errors named after the objective."""

    def __init__(self, name: str, fn: Callable):
        self.name, self.fn = name, fn


class _CheckedBuilder(_Checked):
    def __call__(self, docs, rng):
        return plugin_call(f"objectives.{self.name}", "example_builder", self.fn, docs, rng)


class _ScheduledOptions:
    """An objective's options with some following a schedule: the batch transform of
    the objective built with each step's values (the last one kept, as steps repeat)."""

    def __init__(self, name: str, spec: ObjectiveSpec, options, schedules: dict, context):
        self.name, self.spec, self.options = name, spec, options
        self.schedules, self.context = schedules, context
        self._built: tuple[tuple, Callable] | None = None

    def values(self, step: int) -> dict[str, float]:
        return {option: type(getattr(self.options, option))(
                    s.at(float(getattr(self.options, option)), step))
                for option, s in self.schedules.items()}

    def transform(self, step: int) -> Callable:
        values = self.values(step)
        key = tuple(sorted(values.items()))
        if self._built is None or self._built[0] != key:
            options = dataclasses.replace(self.options, **values)
            objective = plugin_call(f"objectives.{self.name}", "build()", self.spec.build,
                                    options, self.context)
            self._built = (key, objective.batch_transform)
        return self._built[1]


class _CheckedTransform(_Checked):
    """What the transform returns must still be a batch the encoder can take: the model
    inputs, integer, of the shape it was given. ``step``: the optimizer step the batch is
    for, whose values the scheduled options take (None: their configured values)."""

    scheduled: _ScheduledOptions | None = None

    def __call__(self, batch: Batch, generator: torch.Generator, step: int | None = None) -> Batch:
        shape = tuple(batch["input_ids"].shape)
        fn = self.fn if step is None or self.scheduled is None else self.scheduled.transform(step)
        out = plugin_call(f"objectives.{self.name}", "batch_transform", fn, batch, generator)
        where = f"objectives.{self.name}: batch_transform"
        if not isinstance(out, dict):
            raise PluginRunError(f"{where} must return the batch (a dict of tensors), got "
                                 f"{type(out).__name__}")
        for key in MODEL_INPUTS:
            value = out.get(key)
            if not isinstance(value, torch.Tensor):
                raise PluginRunError(f"{where} returned a batch without {key!r}")
            if tuple(value.shape) != shape or value.is_floating_point() or value.is_complex():
                raise PluginRunError(f"{where} returned {key!r} as a {value.dtype} tensor of "
                                     f"shape {list(value.shape)}; the encoder takes integers of "
                                     f"the batch's shape {list(shape)}")
        return out
