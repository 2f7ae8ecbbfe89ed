"""The plugin surface of pretextual: every hook, documented where it is declared.

This module is the single definition of the surface; docs/plugins.md has the reference
(a test checks that every hook here is documented there and exercised by a test).

Plugins implement hooks with ``@pretextual.hookimpl`` and may accept any subset of a
hook's arguments, by name (pluggy passes only those a function asks for), so adding an
argument here never breaks an existing plugin. Every hook is a plain call: its
implementations return nothing, and wrappers are refused.

Each implementation is called on its own: one that raises is named on stderr and its
plugin is disabled for the rest of the run (``--strict-plugins`` makes it an error).

The ``trainer`` passed to the training hooks is :class:`pretextual.core.trainer.Trainer`.
Plugins may read ``trainer.step``, ``trainer.cfg`` (the resolved config),
``trainer.model``, ``trainer.optimizer``, ``trainer.scheduler`` (a LambdaLR: scale
``trainer.scheduler.base_lrs`` to change the learning rate from the next step on),
``trainer.mix`` (the objective mix) and ``trainer.out`` (the run directory), and set
``trainer.should_stop = True`` to end training after the current step (a final
evaluation and checkpoint still happen). In a distributed run the training hooks run on
the main process only; ``should_stop`` set there stops every process.
"""

from __future__ import annotations

from typing import Any, Callable

import pluggy

hookspec = pluggy.HookspecMarker("pretextual")
hookimpl = pluggy.HookimplMarker("pretextual")


@hookspec
def pretextual_register_architectures(register: Callable[[Any], None]) -> None:
    """Register encoder architectures: call ``register(ArchitectureSpec(...))`` once per
    architecture.

    Called once, when the plugin is loaded. The spec's name is what
    ``model.architecture`` accepts (bert and modernbert are built in); names are unique
    as for objectives.
    """


@hookspec
def pretextual_register_objectives(register: Callable[[Any], None]) -> None:
    """Register objectives: call ``register(ObjectiveSpec(...))`` once per objective.

    Called once, when the plugin is loaded. The spec's name is the config key
    (``objectives.<name>.weight``). Two plugins registering the same name is an error
    naming both packages.
    """


@hookspec
def pretextual_register_exporters(register: Callable[[Any], None]) -> None:
    """Register exporters: call ``register(ExporterSpec(...))`` once per format.

    Called once, when the plugin is loaded. The spec's name is what
    ``pretextual export --format`` accepts; names are unique as for objectives.
    """


@hookspec
def pretextual_on_train_start(trainer: Any) -> None:
    """Called once on the main process before the first step of a run (after ``--resume``
    restored its state: ``trainer.step`` is where it goes on from), with the run directory
    written (config.yaml, tokenizer.json)."""


@hookspec
def pretextual_on_train_end(metrics: dict[str, float], trainer: Any) -> None:
    """Called once on the main process after the last step and its checkpoint, with the
    last evaluation's ``metrics`` (empty when nothing was held out). The built-in final
    export (``trainer.export``) and plot (``trainer.plot``) run on it, the export first."""


@hookspec
def pretextual_on_step_end(step: int, metrics: dict[str, float], trainer: Any) -> None:
    """Called after each logged optimizer step (every ``trainer.log_every`` steps).

    ``step`` counts optimizer steps from 1. ``metrics`` is the line just written to
    ``metrics.jsonl``: ``loss``, ``loss/<objective>`` (and ``loss/<objective>.<aux>``),
    ``<objective>/<metric>``, ``weight/<objective>``, ``lr``, ``tokens``,
    ``tokens_per_s``, and ``skipped: 1`` when the step's batch was skipped for a
    non-finite loss. Set ``trainer.should_stop = True`` to stop early.
    """


@hookspec
def pretextual_on_eval(step: int, metrics: dict[str, float], trainer: Any) -> None:
    """Called after each evaluation on the held-out split (every ``trainer.eval_every``
    steps and at the end), with the means over ``trainer.eval_batches`` batches:
    ``eval/loss``, ``eval/loss/<objective>``, ``eval/<objective>/<metric>``.
    Not called when no documents are held out (``data.eval_fraction=0``).
    """


@hookspec
def pretextual_on_checkpoint(step: int, path: str, trainer: Any) -> None:
    """Called after a checkpoint for ``step`` has been written (atomically) to the
    directory ``path``: every ``trainer.checkpoint_every`` steps and at the end."""


@hookspec
def pretextual_register_tasks(register: Callable[[Any], None]) -> None:
    """Register downstream tasks: call ``register(TaskSpec(...))`` once per task.

    Called once, when the plugin is loaded. The spec's name is what
    ``pretextual evaluate --task`` and ``trainer.eval_tasks`` accept next to task files;
    names are unique as for objectives.
    """


@hookspec
def pretextual_register_loggers(register: Callable[[Any], None]) -> None:
    """Register loggers: call ``register(LoggerSpec(...))`` once per logger.

    Called once, when the plugin is loaded. The spec's name is what ``trainer.loggers``
    accepts; names are unique as for objectives. The logger itself is the plugin's
    training hooks, which act only when the name is in ``trainer.cfg.trainer.loggers``.
    """


@hookspec
def pretextual_register_optimizers(register: Callable[[Any], None]) -> None:
    """Register optimizers: call ``register(OptimizerSpec(...))`` once per optimizer.

    Called once, when the plugin is loaded. The spec's name is what ``trainer.optimizer``
    accepts (adamw and adafactor are built in); names are unique as for objectives.
    """


@hookspec
def pretextual_register_lr_schedules(register: Callable[[Any], None]) -> None:
    """Register learning-rate schedules: call ``register(LRScheduleSpec(...))`` once per
    schedule.

    Called once, when the plugin is loaded. The spec's name is what ``trainer.lr_schedule``
    accepts (linear, cosine, constant, inverse_sqrt and wsd are built in).
    """
