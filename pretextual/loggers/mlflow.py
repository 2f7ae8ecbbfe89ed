"""The mlflow logger (``trainer.loggers=[mlflow]``; the ``mlflow`` extra: mlflow-skinny and
the SQLAlchemy MLflow needs for a database).

At the start of training it opens an MLflow run named after the run directory, in the
experiment ``trainer.mlflow_experiment`` of the tracking store ``trainer.mlflow_tracking_uri``
(unset: the SQLite database ``mlflow.db`` beside the run directory, so the runs under
``runs/`` share ``runs/mlflow.db``, their artifacts in ``runs/mlartifacts/``), with the
resolved config as its parameters and config.yaml as an artifact. Every metrics.jsonl line
(steps and evaluations) goes to it at its step, under its own name (written in the
background, waited for at each checkpoint). At the end the final export is uploaded under
the artifact path ``export/`` and the run ends FINISHED. A run resumed from a checkpoint
continues the same MLflow run, whose id is kept in ``<run dir>/mlflow_run_id``.

MLflow's file store (a directory such as ``mlruns/``) is refused by the config check: it
keeps each metric in a file named after it, so ``loss`` and ``loss/mlm`` cannot both exist.

No hook marks a run that stops on an error, so an MLflow run left open is ended FAILED when
the process exits, or when another run starts in the same process (a process killed with
SIGKILL ends nothing: its MLflow run stays RUNNING).
"""

from __future__ import annotations

import atexit
import re
import sys
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pretextual.loggers import final_export, flat_config, numbers, resumed_id, store_id
from pretextual.plugins.api import LoggerSpec
from pretextual.plugins.hookspecs import hookimpl

NAME = "mlflow"
INSTALL = "pip install 'pretextual[mlflow]'"
RUN_ID_FILE = "mlflow_run_id"
DATABASE = "mlflow.db"
ARTIFACTS = "mlartifacts"
BATCH = 100  # MLflow takes at most 100 parameters in one log_batch call
BAD_KEY_CHARACTERS = re.compile(r"[^\w\-./ ]")
"""What MLflow refuses in a metric or parameter name (on every platform)."""


@dataclass
class _Run:
    trainer: weakref.ref
    client: Any
    run_id: str
    pending: list = field(default_factory=list)  # metrics logged in the background, not yet written

    def flush(self) -> None:
        """Wait for the metrics logged so far to be written (raising what writing them raised)."""
        pending, self.pending = self.pending, []
        for operation in pending:
            operation.wait()


_open: _Run | None = None  # the MLflow run of the training in progress in this process
_exit_hook = False


def tracking_uri(trainer: Any) -> str:
    """trainer.mlflow_tracking_uri, or the SQLite database beside the run directory."""
    uri = trainer.cfg.trainer.mlflow_tracking_uri
    if uri is None:
        return f"sqlite:///{Path(trainer.out).resolve().parent / DATABASE}"
    return uri


def artifact_location(uri: str) -> str | None:
    """Where an experiment made in the SQLite database ``uri`` keeps its runs' artifacts:
    mlartifacts/ beside the database (MLflow would pick the working directory's mlruns/);
    None for any other store, which decides itself."""
    if not uri.startswith("sqlite:///"):
        return None
    database = Path(uri[len("sqlite:///"):])
    return (database.resolve().parent / ARTIFACTS).as_uri() if database.name else None


def metric_key(key: str) -> str:
    """``key`` as MLflow accepts it: each character it refuses becomes ``_``."""
    return BAD_KEY_CHARACTERS.sub("_", key)


def _start(trainer: Any) -> None:
    global _open, _exit_hook
    if _open is not None:  # left open by an earlier run in this process that stopped on an error
        _end("FAILED")
    from mlflow.entities import Param
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient
    from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH

    t = trainer.cfg.trainer
    uri = tracking_uri(trainer)
    client = MlflowClient(tracking_uri=uri)
    run_id, logged = resumed_id(trainer, RUN_ID_FILE), None
    if run_id is not None:
        try:
            run = client.get_run(run_id)
        except MlflowException:  # not in this store (trainer.mlflow_tracking_uri changed)
            run = None
        if run is None or run.info.lifecycle_stage == "deleted":
            trainer.log(f"note: mlflow: the run {run_id} in {RUN_ID_FILE} is not in {uri}; "
                        f"this run starts a new one")
            run_id = None
        else:
            client.update_run(run_id, status="RUNNING")
            logged = run.data.params
    if run_id is None:
        experiment = client.get_experiment_by_name(t.mlflow_experiment)
        experiment_id = (experiment.experiment_id if experiment is not None
                         else client.create_experiment(t.mlflow_experiment,
                                                       artifact_location(uri)))
        run_id = client.create_run(experiment_id, run_name=Path(trainer.out).name,
                                   tags={"pretextual.run_dir": str(Path(trainer.out).resolve())}
                                   ).info.run_id
        store_id(trainer, RUN_ID_FILE, run_id)
    _open = _Run(weakref.ref(trainer), client, run_id)
    if not _exit_hook:
        atexit.register(_end_at_exit)
        _exit_hook = True
    # MLflow keeps a parameter's first value: a resumed run adds only the keys that are new
    # (config.yaml, uploaded again below, has the values this part of the run trained with).
    params = [Param(metric_key(key), str(value)[:MAX_PARAM_VAL_LENGTH])
              for key, value in flat_config(trainer.cfg).items()
              if metric_key(key) not in (logged or {})]
    for i in range(0, len(params), BATCH):
        client.log_batch(run_id, params=params[i:i + BATCH])
    client.log_artifact(run_id, str(Path(trainer.out) / "config.yaml"))
    trainer.log(f"mlflow: {'continuing' if logged is not None else 'logging to'} run {run_id} "
                f"({Path(trainer.out).name}) of experiment {t.mlflow_experiment!r} in {uri}")


def _log(step: int, metrics: dict, trainer: Any) -> None:
    if _open is None or _open.trainer() is not trainer:
        return
    from mlflow.entities import Metric
    now = int(time.time() * 1000)
    batch = [Metric(metric_key(key), value, now, step) for key, value in numbers(metrics).items()]
    # written by MLflow's background thread: a step does not wait for the store (about 10 ms
    # a line into SQLite, more to a server)
    _open.pending.append(_open.client.log_batch(_open.run_id, metrics=batch, synchronous=False))


def _end(status: str) -> None:
    global _open
    run, _open = _open, None
    try:
        run.flush()
    finally:
        run.client.set_terminated(run.run_id, status)


def _end_at_exit() -> None:
    """A run still open when the process exits never reached the end of training."""
    if _open is None:
        return
    run_id = _open.run_id
    try:
        _end("FAILED")
    except Exception as exc:  # at exit there is no one left to raise to
        print(f"pretextual: warning: mlflow: could not mark the run {run_id} FAILED: {exc}",
              file=sys.stderr)


@hookimpl
def pretextual_register_loggers(register):
    # SQLAlchemy and Alembic: for the SQLite database, the default store
    register(LoggerSpec(NAME, requires=("mlflow", "sqlalchemy", "alembic"), install=INSTALL,
                        description="an MLflow run: metrics, the config as parameters, the "
                                    "export as artifacts"))


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
def pretextual_on_checkpoint(trainer):
    if _open is not None and _open.trainer() is trainer:
        _open.flush()  # the store holds every metric up to the checkpoint


@hookimpl
def pretextual_on_train_end(trainer):
    if _open is None or _open.trainer() is not trainer:
        return
    try:
        export = final_export(trainer)
        if export is not None:
            _open.client.log_artifacts(_open.run_id, str(export), artifact_path="export")
    finally:  # training itself finished, whether or not the upload did
        _end("FINISHED")
