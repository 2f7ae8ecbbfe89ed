"""Downstream probes during pretraining (``trainer.eval_tasks``): the frozen-feature probe
of ``pretextual evaluate`` on each task, every ``trainer.eval_every`` steps, so a run
shows downstream quality rising, not only the loss."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer

from pretextual.evaluation.encoders import Tokenized, features, tokenize
from pretextual.evaluation.evaluate import EvalSettings, Splits, score_baseline
from pretextual.evaluation.protocols import probe
from pretextual.evaluation.tasks import Task, load_task

PROBE_SEED_COUNT = 1  # one seed's folds: the same splits at every evaluation of the run


def probes_available() -> bool:
    """Whether scikit-learn, which fits the probes, is installed (the ``eval`` extra)."""
    import importlib.util
    return importlib.util.find_spec("sklearn") is not None


def metric_key(task: Task) -> str:
    """``eval/<task>/<metric>``: a task file by its stem, a registered task by its name."""
    name = Path(task.name).stem if Path(task.name).suffix else task.name
    return f"eval/{name}/{task.metric}"


class TaskProbes:
    """The tasks of a run, loaded and tokenized once with the run's tokenizer."""

    def __init__(self, names: list[str], plugins, tokenizer: Tokenizer, max_length: int,
                 vocab_size: int):
        from pretextual.exporters.hf import with_post_processor
        framing = with_post_processor(tokenizer)
        self.tasks = [load_task(name, plugins) for name in names]
        self.settings = EvalSettings(seeds=PROBE_SEED_COUNT)
        self.splits = [Splits(task, self.settings) for task in self.tasks]  # checks the folds now

        self.tokenized: list[Tokenized] = [
            tokenize(framing, task.text, task.text_pair, max_length, vocab_size, "the run")
            for task in self.tasks]
        self.keys = [metric_key(task) for task in self.tasks]

    def __call__(self, encoder: torch.nn.Module, device: torch.device) -> dict[str, float]:
        """``eval/<task>/<metric>`` of the probe on the encoder's current weights."""
        results = {}
        for key, task, splits, tokenized in zip(self.keys, self.tasks, self.splits, self.tokenized):
            x = features(encoder, tokenized, device)
            scored = score_baseline(splits, lambda train, test: probe(x, task, train, test))
            results[key] = float(np.mean(scored.scores))
        return results
