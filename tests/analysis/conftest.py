"""Fixtures of the analysis tests: one torch thread, and two tiny real runs shared by the
session."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pretextual.core.config import load_config
from pretextual.core.trainer import Trainer
from run_helpers import tiny_overrides


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models gain nothing from more threads; on a shared 2-core machine they only spin."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def two_runs(corpus_file, cache_dir, tmp_path_factory) -> list[Path]:
    """A roberta run (6 steps, evaluated at 3 and 6) and a bert run (4 steps, evaluated at 4)."""
    root = tmp_path_factory.mktemp("runs")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    runs = []
    for name, recipe, steps, extra in (("a", "roberta", 6, ["trainer.eval_every=3"]),
                                       ("b", "bert", 4, [])):
        overrides = tiny_overrides(corpus_file, cache_dir, root / name, steps) + extra
        Trainer(load_config(recipe, overrides), log=lambda *_: None).train()
        runs.append(root / name)
    torch.set_num_threads(threads)
    return runs

