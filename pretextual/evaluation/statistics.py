"""Splits, metrics and the noise of a difference: what makes two scores comparable.

Cross-validation folds are drawn per seed, the same for every model of one evaluation;
with a group column a group never straddles two folds. The standard error of the
difference between two models on the same splits adds the seed-to-seed spread of the
paired differences to the test sample's own noise (a paired bootstrap over the test
examples), so one seed on a small test set still gets an honest error bar.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from pretextual.errors import EvaluationError
from pretextual.evaluation.tasks import CLASSIFICATION, Task

BOOTSTRAP_SAMPLES = 1000
BOOTSTRAP_SEED = 0


def fold_assignment(task: Task, folds: int, seed: int) -> np.ndarray:
    """The cross-validation fold of every example for ``seed``: stratified by class for
    classification, whole groups to one fold when the task has groups."""
    n = len(task)
    units = len(np.unique(task.groups)) if task.groups is not None else n
    if units < folds:
        what = "groups" if task.groups is not None else "examples"
        raise EvaluationError(f"{task.name}: {units} {what} cannot fill {folds} folds "
                              f"(lower --folds or give an --eval-file)")
    from sklearn.model_selection import KFold, StratifiedGroupKFold, StratifiedKFold
    if task.groups is not None and task.kind == CLASSIFICATION:
        splitter = StratifiedGroupKFold(n_splits=folds, shuffle=True, random_state=seed)
        parts = splitter.split(np.zeros(n), task.y, task.groups)
    elif task.groups is not None:
        return _group_folds(task.groups, folds, seed)
    elif task.kind == CLASSIFICATION and np.bincount(task.y).min() >= folds:
        parts = StratifiedKFold(n_splits=folds, shuffle=True, random_state=seed).split(np.zeros(n), task.y)
    else:  # a class rarer than the folds cannot be stratified
        parts = KFold(n_splits=folds, shuffle=True, random_state=seed).split(np.zeros(n))
    assignment = np.zeros(n, dtype=np.int64)
    for k, (_, test) in enumerate(parts):
        assignment[test] = k
    return assignment


def _group_folds(groups: np.ndarray, folds: int, seed: int) -> np.ndarray:
    """Whole groups dealt to the fold with the fewest examples, largest groups first
    (ties in a seeded random order)."""
    rng = np.random.default_rng(seed)
    ids, sizes = np.unique(groups, return_counts=True)
    shuffled = rng.permutation(len(ids))
    order = shuffled[np.argsort(-sizes[shuffled], kind="stable")]
    fill = np.zeros(folds, dtype=np.int64)
    fold_of_group = np.zeros(len(ids), dtype=np.int64)
    for g in order:
        k = int(fill.argmin())
        fold_of_group[g] = k
        fill[k] += sizes[g]
    return fold_of_group[np.searchsorted(ids, groups)]


def score(task: Task, truth: np.ndarray, predicted: np.ndarray,
          folds: np.ndarray | None = None) -> float:
    """Accuracy for classification; Pearson's r for regression (0 for a constant
    prediction), the mean of each fold's when ``folds`` says which fold predicted each
    row (pooled, the folds' different training means would correlate by themselves)."""
    if task.kind == CLASSIFICATION:
        return float(np.mean(truth == predicted))
    return _per_fold(_pearson, truth, predicted, folds)


def _per_fold(metric, truth: np.ndarray, predicted: np.ndarray, folds: np.ndarray | None) -> float:
    if folds is None:
        return metric(truth, predicted)
    return float(np.mean([metric(truth[folds == k], predicted[folds == k]) for k in np.unique(folds)]))


def _pearson(a: np.ndarray, b: np.ndarray) -> float:
    if np.ptp(a) == 0 or np.ptp(b) == 0:  # rounding would make a constant look correlated
        return 0.0
    a, b = a - a.mean(), b - b.mean()
    denominator = np.sqrt((a * a).sum() * (b * b).sum())
    return float((a * b).sum() / denominator) if denominator > 0 else 0.0


def spearman(truth: np.ndarray, predicted: np.ndarray, folds: np.ndarray | None = None) -> float:
    """Spearman's rank correlation (ties get their mean rank), per fold as :func:`score`."""
    from scipy.stats import rankdata
    return _per_fold(lambda a, b: _pearson(rankdata(a), rankdata(b)), truth, predicted, folds)


@dataclass
class Scored:
    """One model under one protocol: its predictions and score for every seed."""

    test: list[np.ndarray] = field(default_factory=list)
    """The test rows of each seed."""
    predicted: list[np.ndarray] = field(default_factory=list)
    folds: list[np.ndarray | None] = field(default_factory=list)
    """Which fold predicted each test row (None: one split)."""
    scores: list[float] = field(default_factory=list)
    spearman: list[float] = field(default_factory=list)

    def add(self, task: Task, test: np.ndarray, predicted: np.ndarray,
            folds: np.ndarray | None = None) -> None:
        self.test.append(test)
        self.predicted.append(predicted)
        self.folds.append(folds)
        self.scores.append(score(task, task.y[test], predicted, folds))
        if task.kind != CLASSIFICATION:
            self.spearman.append(spearman(task.y[test], predicted, folds))


def summary(values: list[float]) -> dict:
    """mean, std (sample, 0 for one seed), median and per_seed of a metric over seeds."""
    array = np.asarray(values, dtype=np.float64)
    return {"mean": float(array.mean()), "std": float(array.std(ddof=1)) if len(array) > 1 else 0.0,
            "median": float(np.median(array)), "per_seed": [float(v) for v in array]}


def difference(task: Task, a: Scored, b: Scored) -> dict:
    """Mean difference ``a - b`` over seeds and its standard error: the variance of the
    per-seed differences over the number of seeds, plus the mean bootstrap variance of
    each seed's difference over its test examples."""
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    diffs, sampling = [], []
    for test_a, pred_a, test_b, pred_b, folds in zip(a.test, a.predicted, b.test, b.predicted, a.folds):
        if not np.array_equal(test_a, test_b):
            raise ValueError("paired scores must share their test rows")
        truth = task.y[test_a]
        diffs.append(score(task, truth, pred_a, folds) - score(task, truth, pred_b, folds))
        boot = []
        for _ in range(BOOTSTRAP_SAMPLES):
            s = rng.integers(0, len(truth), size=len(truth))
            f = folds[s] if folds is not None else None
            boot.append(score(task, truth[s], pred_a[s], f) - score(task, truth[s], pred_b[s], f))
        sampling.append(np.var(boot, ddof=1))
    diffs = np.asarray(diffs)
    seeds = diffs.var(ddof=1) / len(diffs) if len(diffs) > 1 else 0.0
    return {"difference": float(diffs.mean()), "se": float(np.sqrt(seeds + np.mean(sampling)))}
