"""Fixtures of the plugin tests: throwaway installed distributions, the ELECTRA example
pip-installed for the session, and tiny training runs with a given set of plugins."""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from pretextual.core.trainer import Trainer
from pretextual.plugins import manager
from pretextual.plugins.manager import ENV_LOAD_PLUGINS

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "pretextual-electra"


@pytest.fixture(autouse=True)
def plugin_environment(monkeypatch):
    """Each test starts with no restriction variable, one torch thread (tiny models gain
    nothing from more, and on a shared 2-core machine extra threads only spin), and the
    built-ins of this checkout (exporters land separately; a missing one must not fail
    tests about third-party plugins)."""
    monkeypatch.delenv(ENV_LOAD_PLUGINS, raising=False)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    monkeypatch.setattr(manager, "BUILTIN_PLUGINS", tuple(
        m for m in manager.BUILTIN_PLUGINS if importlib.util.find_spec(m) is not None))
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def fake_plugin(tmp_path, monkeypatch):
    """fake_plugin(dist, source, entry=None, attr=None) -> entry-point name.

    Installs a one-module distribution ``dist`` (module ``dist`` with dashes as
    underscores, written from ``source``) whose ``pretextual`` entry point ``entry``
    names that module, or its attribute ``attr``: a ``*.dist-info`` folder on sys.path,
    which importlib.metadata finds like any installed package. Gone after the test.
    """
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    modules: list[str] = []

    def make(dist: str, source: str, entry: str | None = None, attr: str | None = None) -> str:
        module = dist.replace("-", "_")
        entry = entry or module
        (site / f"{module}.py").write_text(textwrap.dedent(source))
        info = site / f"{module}-0.1.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
        target = f"{module}:{attr}" if attr else module
        (info / "entry_points.txt").write_text(f"[pretextual]\n{entry} = {target}\n")
        modules.append(module)
        importlib.invalidate_caches()
        return entry

    yield make
    for module in modules:
        sys.modules.pop(module, None)


def _pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", *args, "--quiet", "--disable-pip-version-check"],
                   check=True, capture_output=True)


@pytest.fixture(scope="session")
def electra(tmp_path_factory):
    """examples/pretextual-electra pip-installed into this environment for the session.

    Installed from a copy, so no build files land in the tree; uninstalled at the end
    unless it was installed before the session.
    """
    try:
        importlib.metadata.version("pretextual-electra")
        was_installed = True
    except importlib.metadata.PackageNotFoundError:
        was_installed = False
    source = tmp_path_factory.mktemp("electra") / "pretextual-electra"
    shutil.copytree(EXAMPLE, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    _pip("install", "--no-deps", "--no-build-isolation", "--no-index", str(source))
    importlib.invalidate_caches()
    yield "pretextual-electra"
    if not was_installed:
        _pip("uninstall", "--yes", "pretextual-electra")
        importlib.invalidate_caches()


@pytest.fixture
def train(tiny_config, tmp_path):
    """train(plugins, *overrides, steps=5, recipe="roberta") -> the metrics.jsonl records
    of a tiny run (seconds) in tmp_path/run, trained with ``plugins``."""
    def run(plugins, *overrides: str, steps: int = 5, recipe: str = "roberta") -> list[dict]:
        Trainer(tiny_config(recipe, *overrides, steps=steps), plugins, log=lambda *a: None).train()
        metrics = tmp_path / "run" / "metrics.jsonl"
        return [json.loads(line) for line in metrics.read_text().splitlines()]
    return run
