"""The tensorboard logger (``trainer.loggers=[tensorboard]``, the default).

When the ``tensorboard`` package is installed, every metrics.jsonl line (steps and
evaluations) also goes to ``torch.utils.tensorboard.SummaryWriter`` in
``<run dir>/tensorboard/``, one scalar per key at the line's step; the writer is flushed
at each checkpoint and closed at the last one. A run's writer purges the events an
earlier run in the directory (or the part of a resumed one after its checkpoint) logged
after the step it starts from, so TensorBoard shows only this run's curve. Without
tensorboard a run says so at its start and logs nothing here (being on by default, it
does not stop the run). View with ``tensorboard --logdir runs``.
"""

from __future__ import annotations

import importlib.util
import weakref
from pathlib import Path
from typing import Any

from pretextual.plugins.api import LoggerSpec
from pretextual.plugins.hookspecs import hookimpl

NAME = "tensorboard"
LOG_DIR = "tensorboard"
INSTALL = "pip install 'pretextual[tensorboard]'"
AVAILABLE = importlib.util.find_spec("tensorboard") is not None
_writers: dict[Path, Any] = {}  # one open writer per run directory
_owners: dict[Path, weakref.ref] = {}  # the Trainer each writer was opened for


def _open_writer(path: Path, first_step: int):
    from torch.utils.tensorboard import SummaryWriter  # imports tensorboard: only when used
    return SummaryWriter(log_dir=str(path), purge_step=first_step)


def _writer(trainer) -> Any:
    path = Path(trainer.out) / LOG_DIR
    owner = _owners.get(path)
    if path in _writers and (owner is None or owner() is not trainer):
        # left open by an earlier run in this process that stopped on an error (no
        # hook marks the end of such a run): this run opens its own, purged from its start
        _writers.pop(path).close()
    if path not in _writers:
        _writers[path] = _open_writer(path, trainer.start_step + 1)
        _owners[path] = weakref.ref(trainer)
    return _writers[path]


def _add_scalars(step: int, metrics: dict, trainer) -> None:
    if not (AVAILABLE and NAME in trainer.cfg.trainer.loggers):
        return
    writer = _writer(trainer)
    for key, value in metrics.items():
        if key != "step" and isinstance(value, (int, float)):
            writer.add_scalar(key, value, global_step=step)


@hookimpl
def pretextual_register_loggers(register):
    register(LoggerSpec(NAME, requires=("tensorboard",), install=INSTALL, warn_if_missing=True,
                        description="TensorBoard event files in <run dir>/tensorboard/"))


@hookimpl
def pretextual_on_train_start(trainer):
    if NAME in trainer.cfg.trainer.loggers and not AVAILABLE:
        trainer.log(f"note: trainer.loggers has tensorboard, but the tensorboard package is not "
                    f"installed, so this run logs no events: {INSTALL} (or leave tensorboard out "
                    f"of trainer.loggers)")


@hookimpl
def pretextual_on_step_end(step, metrics, trainer):
    _add_scalars(step, metrics, trainer)


@hookimpl
def pretextual_on_eval(step, metrics, trainer):
    _add_scalars(step, metrics, trainer)


@hookimpl
def pretextual_on_checkpoint(step, trainer):
    writer = _writers.get(Path(trainer.out) / LOG_DIR)
    if writer is None:
        return
    if step >= trainer.cfg.trainer.max_steps or trainer.should_stop:  # the run's last checkpoint
        writer.close()
        del _writers[Path(trainer.out) / LOG_DIR]
        _owners.pop(Path(trainer.out) / LOG_DIR, None)
    else:
        writer.flush()
