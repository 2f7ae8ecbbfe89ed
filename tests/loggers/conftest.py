"""Fixtures of the logger tests: one torch thread, and W&B kept offline, quiet and inside
the test's own directory."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models gain nothing from more threads; on a shared 2-core machine they only spin."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def wandb_environment(monkeypatch, tmp_path):
    """No W&B setting of this machine (a login, a mode) reaches a test, none of its files
    leave tmp_path (its staging of artifacts, caches, settings) and it prints nothing."""
    for key in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_ENTITY", "WANDB_PROJECT", "WANDB_BASE_URL",
                "WANDB_DIR", "WANDB_RUN_ID", "WANDB_RESUME"):
        monkeypatch.delenv(key, raising=False)
    for key, folder in (("WANDB_DATA_DIR", "data"), ("WANDB_CACHE_DIR", "cache"),
                        ("WANDB_CONFIG_DIR", "config"), ("WANDB_ARTIFACT_DIR", "artifacts")):
        monkeypatch.setenv(key, str(tmp_path / "wandb-home" / folder))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_CONSOLE", "off")
    monkeypatch.setenv("WANDB_DISABLE_GIT", "true")
