"""The wandb logger (``trainer.loggers=[wandb]``; the ``wandb`` extra).

At the start of training it opens a Weights & Biases run named after the run directory, in
the project ``trainer.wandb_project``, with the resolved config as the run's config and its
files in ``<run dir>/wandb/``; ``trainer.wandb_mode`` (unset: W&B's own choice) makes it
online, offline (nothing leaves the machine until ``wandb sync``) or disabled. Every
metrics.jsonl line (steps and evaluations) goes to it at its step. At the end the final
export is logged as an artifact of type ``model`` (``model-<run id>``) and the run is
finished. A run resumed from a checkpoint continues the same W&B run, whose id is kept in
``<run dir>/wandb_run_id``.

A W&B run left open by a run that stopped on an error is finished with exit code 1 when
another run starts in the same process; at the exit of the process W&B's own exit hook
finishes it with the process's exit code.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from pretextual.loggers import final_export, numbers, resumed_id, store_id
from pretextual.plugins.api import LoggerSpec
from pretextual.plugins.hookspecs import hookimpl

NAME = "wandb"
INSTALL = "pip install 'pretextual[wandb]'"
RUN_ID_FILE = "wandb_run_id"


@dataclass
class _Run:
    trainer: weakref.ref
    run: Any


_open: _Run | None = None  # the W&B run of the training in progress in this process


def _start(trainer: Any) -> None:
    global _open
    if _open is not None:  # left open by an earlier run in this process that stopped on an error
        _open.run.finish(exit_code=1)
        _open = None
    import wandb

    t = trainer.cfg.trainer
    run_id = resumed_id(trainer, RUN_ID_FILE)
    run = wandb.init(project=t.wandb_project, name=Path(trainer.out).name, dir=str(trainer.out),
                     config=OmegaConf.to_container(trainer.cfg, resolve=True), mode=t.wandb_mode,
                     id=run_id, resume="allow" if run_id else None)
    _open = _Run(weakref.ref(trainer), run)
    if run_id is None:
        store_id(trainer, RUN_ID_FILE, run.id)
    trainer.log(f"wandb: {'continuing' if run_id else 'logging to'} run {run.id} "
                f"({Path(trainer.out).name}) of project {t.wandb_project!r}, "
                f"{t.wandb_mode or 'W&B default'} mode, files in {Path(trainer.out) / 'wandb'}")


def _log(step: int, metrics: dict, trainer: Any) -> None:
    if _open is not None and _open.trainer() is trainer:
        _open.run.log(numbers(metrics), step=step)


@hookimpl
def pretextual_register_loggers(register):
    register(LoggerSpec(NAME, requires=("wandb",), install=INSTALL,
                        description="a Weights & Biases run: metrics, the config, the export "
                                    "as a model artifact"))


@hookimpl
def pretextual_on_train_start(trainer):
    if NAME in trainer.cfg.trainer.loggers:
        _start(trainer)


@hookimpl
def pretextual_on_step_end(step, metrics, trainer):
    _log(step, metrics, trainer)


@hookimpl
def pretextual_on_eval(step, metrics, trainer):
    _log(step, metrics, trainer)


@hookimpl
def pretextual_on_train_end(trainer):
    global _open
    if _open is None or _open.trainer() is not trainer:
        return
    run, _open = _open.run, None
    try:
        export = final_export(trainer)
        if export is not None:
            import wandb
            artifact = wandb.Artifact(f"model-{run.id}", type="model",
                                      metadata={"step": trainer.step,
                                                "formats": trainer.export_formats})
            artifact.add_dir(str(export))
            run.log_artifact(artifact)
    finally:  # training itself finished, whether or not the artifact did
        run.finish()
