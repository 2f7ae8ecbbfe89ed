"""The built-in loggers of ``trainer.loggers``: plugins on the training hooks that send every
metrics.jsonl line of a run to TensorBoard, MLflow or Weights & Biases (each its own extra),
and what they share. Each registers its name with ``pretextual_register_loggers`` and acts
only when the run's config selects it (docs/logging.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from pretextual.core.files import atomic_write_text


def flat_config(cfg: Any) -> dict[str, Any]:
    """The resolved config as ``{"trainer.max_steps": 1000, ...}``: one entry per leaf,
    lists kept whole (``trainer.loggers``), as trackers show parameters."""
    flat: dict[str, Any] = {}

    def walk(node: Any, prefix: str) -> None:
        if isinstance(node, dict) and node:
            for key, value in node.items():
                walk(value, f"{prefix}{key}.")
        else:
            flat[prefix[:-1]] = node

    walk(OmegaConf.to_container(cfg, resolve=True), "")
    return flat


def numbers(metrics: dict[str, Any]) -> dict[str, float]:
    """A metrics line's values as trackers take them: the numbers, without ``step``."""
    return {key: float(value) for key, value in metrics.items()
            if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool)}


def resumed_id(trainer: Any, file: str) -> str | None:
    """The tracker's run id stored in the run directory's ``file`` when this run goes on
    from a checkpoint (so its curve continues the earlier one's); None for a run that
    starts at step 0, which gets a run of its own."""
    path = Path(trainer.out) / file
    if trainer.start_step > 0 and path.is_file():
        return path.read_text().strip() or None
    return None


def store_id(trainer: Any, file: str, run_id: str) -> None:
    """Keep the tracker's run id in the run directory, for a ``--resume`` to continue."""
    atomic_write_text(Path(trainer.out) / file, run_id + "\n")


def final_export(trainer: Any) -> Path | None:
    """The run's final export directory (``<run dir>/export``), when this run wrote one."""
    export = Path(trainer.out) / "export"
    return export if trainer.export_formats and export.is_dir() else None
