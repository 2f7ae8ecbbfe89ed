"""Splits keep groups together and are the same for every model; the standard error of a
difference matches what sampling theory says it should be."""

import numpy as np
import pytest

from pretextual.evaluation.statistics import Scored, difference, fold_assignment, summary
from pretextual.evaluation.tasks import Task, build_task
from pretextual.plugins.api import TaskData


def _task(n=300, groups=None, kind="classes") -> Task:
    rng = np.random.default_rng(0)
    labels = [str(v) for v in rng.integers(0, 3, n)] if kind == "classes" else list(rng.normal(size=n))
    return build_task("t", TaskData(text=[f"s{i}." for i in range(n)], label=labels,
                                    group=list(groups) if groups is not None else None))


@pytest.mark.parametrize("kind", ["classes", "numbers"])
def test_folds_keep_each_group_in_one_fold(kind):
    groups = np.random.default_rng(1).integers(0, 40, 300)
    task = _task(groups=groups, kind=kind)
    for seed in range(3):
        folds = fold_assignment(task, 5, seed)
        for g in np.unique(task.groups):
            assert len(np.unique(folds[task.groups == g])) == 1
        sizes = np.bincount(folds, minlength=5)
        assert sizes.min() > 0.5 * sizes.max()  # balanced, not one fold of everything
    assert not np.array_equal(fold_assignment(task, 5, 0), fold_assignment(task, 5, 1))
    assert np.array_equal(fold_assignment(task, 5, 2), fold_assignment(task, 5, 2))


def test_folds_without_groups_are_stratified():
    task = _task()
    folds = fold_assignment(task, 5, 0)
    shares = [np.bincount(task.y[folds == k], minlength=3) / (folds == k).sum() for k in range(5)]
    overall = np.bincount(task.y) / len(task)
    assert np.abs(np.array(shares) - overall).max() < 0.03


def test_the_standard_error_of_a_difference_is_the_sampling_one():
    """Two classifiers that disagree on a known share of n examples: the bootstrap se of
    their accuracy difference is sqrt(disagree share / n) (paired, one seed)."""
    n = 2000
    task = _task(n)
    truth = task.y
    rng = np.random.default_rng(5)
    a, b = truth.copy(), truth.copy()
    flips = rng.permutation(n)
    a[flips[:200]] = (truth[flips[:200]] + 1) % 3   # a wrong on 200
    b[flips[200:400]] = (truth[flips[200:400]] + 1) % 3  # b wrong on 200 others
    scored_a, scored_b = Scored(), Scored()
    scored_a.add(task, np.arange(n), a)
    scored_b.add(task, np.arange(n), b)
    d = difference(task, scored_a, scored_b)
    assert d["difference"] == pytest.approx(0.0)
    assert d["se"] == pytest.approx(np.sqrt(400 / n) / np.sqrt(n), rel=0.1)
    same = difference(task, scored_a, scored_a)
    assert same == {"difference": 0.0, "se": 0.0}


def test_seed_spread_adds_to_the_error():
    task = _task(200)
    perfect, scored = Scored(), Scored()
    for k in range(4):  # one seed all right, the others wrong on 10 more each time
        predicted = task.y.copy()
        predicted[:10 * k] = (predicted[:10 * k] + 1) % 3
        perfect.add(task, np.arange(200), task.y.copy())
        scored.add(task, np.arange(200), predicted)
    d = difference(task, perfect, scored)
    assert d["difference"] == pytest.approx(np.mean([0, 0.05, 0.10, 0.15]))
    assert d["se"] > np.std([0, 0.05, 0.10, 0.15], ddof=1) / 2  # at least the seeds' part
    assert summary([0.5, 0.7]) == {"mean": 0.6, "std": pytest.approx(0.1414, abs=1e-4),
                                   "median": 0.6, "per_seed": [0.5, 0.7]}
