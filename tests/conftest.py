"""Shared fixtures: a small synthetic corpus and tiny, fast training configs."""

from __future__ import annotations

from pathlib import Path

import pytest

from pretextual.core.config import load_config
from run_helpers import tiny_overrides, write_corpus


@pytest.fixture(scope="session")
def corpus_file(tmp_path_factory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("corpus") / "corpus.txt")


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("cache")


@pytest.fixture
def tiny_config(corpus_file, cache_dir, tmp_path):
    """tiny_config(recipe, *overrides, steps=5): a resolved config for a fast run in tmp_path."""
    def make(recipe: str = "roberta", *overrides: str, steps: int = 5):
        return load_config(recipe, tiny_overrides(corpus_file, cache_dir, tmp_path / "run", steps)
                           + list(overrides))
    return make
