"""The plugin surface of pretextual: every hook, documented where it is declared.

Plugins implement hooks with ``@pretextual.hookimpl`` and may accept any
subset of a hook's arguments (pluggy passes only those a function names), so
adding an argument here never breaks an existing plugin.
"""

from __future__ import annotations

from typing import Any, Callable

import pluggy

hookspec = pluggy.HookspecMarker("pretextual")
hookimpl = pluggy.HookimplMarker("pretextual")


@hookspec
def pretextual_register_objectives(register: Callable[[Any], None]) -> None:
    """Register objectives: call ``register(ObjectiveSpec(...))`` once per objective.

    The spec's name is the config key (``objectives.<name>.weight``). Two
    plugins registering the same name is an error naming both.
    """


@hookspec
def pretextual_register_exporters(register: Callable[[Any], None]) -> None:
    """Register exporters: call ``register(ExporterSpec(...))`` once per format.

    The spec's name is what ``pretextual export --format`` accepts.
    """


@hookspec
def pretextual_on_step_end(step: int, metrics: dict[str, float], trainer: Any) -> None:
    """Called after every optimizer step with that step's logged metrics.

    ``metrics`` holds ``loss``, ``loss/<objective>``, ``weight/<objective>``,
    ``lr`` and ``tokens_per_s``. A plugin may stop training by setting
    ``trainer.should_stop = True`` (early stopping).
    """


@hookspec
def pretextual_on_eval(step: int, metrics: dict[str, float], trainer: Any) -> None:
    """Called after each evaluation with the held-out metrics (``eval/...`` keys)."""


@hookspec
def pretextual_on_checkpoint(step: int, path: str, trainer: Any) -> None:
    """Called after a checkpoint has been written (atomically) to ``path``."""
