"""Fixtures of the evaluation tests: a tiny run trained once, its export, and topic tasks."""

from __future__ import annotations

from pathlib import Path

import pytest

from pretextual.core.config import load_config
from pretextual.core.trainer import Trainer
from pretextual.exporters.export import export_checkpoint
from run_helpers import tiny_overrides, write_topic_task


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory, corpus_file, cache_dir) -> Path:
    """A tiny "bert" (MLM + NSP) run of 40 steps, seed 3 (not the default, so the
    untrained twin must read it from the run)."""
    out = tmp_path_factory.mktemp("eval") / "run"
    cfg = load_config("bert", tiny_overrides(corpus_file, cache_dir, out, 40)
                      + ["trainer.seed=3", "trainer.lr=3e-3"])
    Trainer(cfg, log=lambda *a: None).train()
    return out


@pytest.fixture(scope="session")
def run_export(trained_run, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("eval-export") / "export"
    export_checkpoint(trained_run, out, ["safetensors"], with_heads=True, log=lambda *a: None)
    return out


@pytest.fixture(scope="session")
def topic_task(tmp_path_factory) -> Path:
    """A 6-class topic task of 180 sentences in 36 groups (.jsonl)."""
    return write_topic_task(tmp_path_factory.mktemp("task") / "topics.jsonl")
