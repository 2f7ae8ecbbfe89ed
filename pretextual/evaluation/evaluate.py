"""``pretextual evaluate``: models and baselines scored on downstream tasks, on the same
splits and seeds, as one JSON document (the layout docs/evaluation.md describes)."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from pretextual.errors import EvaluationError
from pretextual.evaluation.encoders import Encoder, features, load_encoder, tokenize, untrained_twin
from pretextual.evaluation.protocols import (FinetuneSettings, finetune, majority, probe,
                                             require_sklearn, tfidf)
from pretextual.evaluation.statistics import Scored, difference, fold_assignment, summary
from pretextual.evaluation.tasks import CLASSIFICATION, Task

PROTOCOLS = ("probe", "finetune")
UNTRAINED = "untrained"


@dataclass(frozen=True)
class EvalSettings:
    """What every model of one evaluation shares: protocols, seeds, folds, lengths."""

    protocols: tuple[str, ...] = ("probe",)
    seeds: int = 3
    """Seeds 0..seeds-1: each draws its own folds, fine-tune initialisation and order."""
    folds: int = 5
    """Cross-validation folds when a task has no evaluation split."""
    max_length: int = 128
    """Tokens per example at most (and never more than a model was trained on)."""
    baselines: bool = True
    """Score majority, TF-IDF and the untrained encoder next to the models."""
    finetune: FinetuneSettings = field(default_factory=FinetuneSettings)
    device: str = "cpu"

    def check(self) -> None:
        unknown = [p for p in self.protocols if p not in PROTOCOLS]
        if unknown or not self.protocols:
            raise EvaluationError(f"--protocol: unknown protocol {unknown[0] if unknown else ''!r} "
                                  f"(known: {', '.join(PROTOCOLS)})")
        if self.seeds < 1 or self.folds < 2 or self.max_length < 8:
            raise EvaluationError("--seeds must be at least 1, --folds at least 2 and "
                                  "--max-length at least 8")


class Splits:
    """The test rows of every seed: each fold of the seed's assignment in turn (probe,
    baselines), or the fold ``seed % folds`` alone (fine-tune, one training per seed);
    a task's own evaluation split for every seed when it has one."""

    def __init__(self, task: Task, settings: EvalSettings):
        self.task, self.settings = task, settings
        self.assignments = ([fold_assignment(task, settings.folds, s) for s in range(settings.seeds)]
                            if task.eval_start is None else None)

    def describe(self) -> str:
        if self.assignments is None:
            return (f"{self.task.eval_start} training and {len(self.task) - self.task.eval_start} "
                    f"evaluation examples")
        grouped = " grouped" if self.task.groups is not None else ""
        return f"{self.settings.folds}-fold{grouped} cross-validation of {len(self.task)} examples"

    def every_fold(self, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
        if self.assignments is None:
            return [self._own()]
        fold = self.assignments[seed]
        return [(np.flatnonzero(fold != k), np.flatnonzero(fold == k)) for k in range(self.settings.folds)]

    def one_fold(self, seed: int) -> tuple[np.ndarray, np.ndarray]:
        if self.assignments is None:
            return self._own()
        fold = self.assignments[seed]
        k = seed % self.settings.folds
        return np.flatnonzero(fold != k), np.flatnonzero(fold == k)

    def _own(self) -> tuple[np.ndarray, np.ndarray]:
        return np.arange(self.task.eval_start), np.arange(self.task.eval_start, len(self.task))


def cross_validated(splits: Splits, seed: int,
                    fit_predict: Callable[[np.ndarray, np.ndarray], np.ndarray]
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(test rows, predictions, fold of each) of ``fit_predict(train, test)`` over every
    fold of ``seed``."""
    tests, predictions, folds = [], [], []
    for k, (train, test) in enumerate(splits.every_fold(seed)):
        tests.append(test)
        predictions.append(fit_predict(train, test))
        folds.append(np.full(len(test), k))
    order = np.concatenate(tests)
    sort = np.argsort(order, kind="stable")
    return order[sort], np.concatenate(predictions)[sort], np.concatenate(folds)[sort]


def score_baseline(splits: Splits, fit_predict) -> Scored:
    """A baseline over every seed's folds (a deterministic one is fitted once per split)."""
    scored = Scored()
    for seed in range(splits.settings.seeds):
        if seed and splits.assignments is None:  # the same split for every seed
            scored.add(splits.task, scored.test[0], scored.predicted[0], scored.folds[0])
            continue
        scored.add(splits.task, *cross_validated(splits, seed, fit_predict))
    return scored


def score_encoder(encoder: Encoder, splits: Splits, device: torch.device,
                  log: Callable[[str], None]) -> dict[str, Scored]:
    """Every protocol of one encoder on one task."""
    task, settings = splits.task, splits.settings
    length = min(settings.max_length, encoder.max_length)
    tokenized = tokenize(encoder.tokenizer, task.text, task.text_pair, length,
                         encoder.model.config.vocab_size, encoder.name)
    scored: dict[str, Scored] = {}
    if "probe" in settings.protocols:
        started = time.perf_counter()
        x = features(encoder.model.to(device), tokenized, device)
        scored["probe"] = score_baseline(splits, lambda train, test: probe(x, task, train, test))
        log(f"  {encoder.name}: probe {_mean(scored['probe'])} ({time.perf_counter() - started:.1f} s)")
    if "finetune" in settings.protocols:
        started = time.perf_counter()
        scored["finetune"] = Scored()
        for seed in range(settings.seeds):
            train, test = splits.one_fold(seed)
            predicted = finetune(encoder, tokenized, task, train, test, seed, settings.finetune, device)
            scored["finetune"].add(task, test, predicted)
        log(f"  {encoder.name}: finetune {_mean(scored['finetune'])} "
            f"({time.perf_counter() - started:.1f} s)")
    encoder.model.cpu()
    return scored


def _mean(scored: Scored) -> str:
    return f"{np.mean(scored.scores):.4f}"


def _entry(task: Task, scored: Scored) -> dict:
    entry = summary(scored.scores)
    if task.kind != CLASSIFICATION:
        entry["spearman"] = summary(scored.spearman)
    return entry


def evaluate(models: list[str], tasks: list[Task], settings: EvalSettings,
             log: Callable[[str], None] | None = None) -> dict:
    """Score each model (a path: run, checkpoint, export or transformers directory) on
    each task under each protocol, with the baselines, on the same splits and seeds.
    Returns the JSON document: ``{"tasks": {task: {"metric", "n", "models", "baselines",
    "pairs"}}}``, ``pairs`` holding the difference of every two models with its standard error."""
    settings.check()
    require_sklearn()
    log = log or (lambda line: print(line, file=sys.stderr))
    from pretextual.core.distributed import device_for
    device = device_for(settings.device)
    encoders = {name: load_encoder(name) for name in dict.fromkeys(models)}
    twins: dict[tuple, tuple[str, Encoder]] = {}
    for name, encoder in encoders.items():
        key = encoder.key()
        if key not in twins:
            label = UNTRAINED if not twins else f"{UNTRAINED}:{name}"
            twins[key] = (label, untrained_twin(encoder))
    document: dict = {"tasks": {}, "settings": _settings_dict(settings)}
    for task in tasks:
        splits = Splits(task, settings)
        log(f"{task.name}: {task.kind}, {task.metric}, {splits.describe()}, {settings.seeds} seed(s)")
        result = {"metric": task.metric, "n": len(task), "models": {}, "baselines": {}}
        if task.kind == CLASSIFICATION:
            result["classes"] = task.classes
        untrained: dict[tuple, dict[str, Scored]] = {}
        if settings.baselines:
            result["baselines"]["majority"] = _entry(task, score_baseline(
                splits, lambda train, test: majority(task, train, test)))
            result["baselines"]["tfidf"] = _entry(task, score_baseline(
                splits, lambda train, test: tfidf(task, train, test)))
            for key, (label, twin) in twins.items():
                untrained[key] = score_encoder(twin, splits, device, log)
                result["baselines"][label] = {p: _entry(task, s) for p, s in untrained[key].items()}
        scored_models: dict[str, dict[str, Scored]] = {}
        for name, encoder in encoders.items():
            scored_models[name] = scored = score_encoder(encoder, splits, device, log)
            entry = {}
            for protocol, s in scored.items():
                entry[protocol] = _entry(task, s)
                floor = untrained.get(encoder.key(), {}).get(protocol)
                if floor is not None:
                    entry[protocol]["vs_untrained"] = difference(task, s, floor)
            result["models"][name] = entry
        names = list(scored_models)
        result["pairs"] = [{"a": a, "b": b, "protocol": p,
                            **difference(task, scored_models[a][p], scored_models[b][p])}
                           for i, a in enumerate(names) for b in names[i + 1:]
                           for p in settings.protocols]
        document["tasks"][task.name] = result
    return document


def _settings_dict(settings: EvalSettings) -> dict:
    from dataclasses import asdict
    return {**asdict(settings), "protocols": list(settings.protocols)}
