"""`pretextual plugins`: each plugin's package, version, hooks, objectives, exporters and tasks."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from pretextual.cli import main
from pretextual.plugins.manager import ENV_LOAD_PLUGINS

ELECTRA = {"name": "electra", "package": "pretextual-electra", "version": "0.1.0",
           "hooks": ["pretextual_register_objectives"], "objectives": ["rtd"], "exporters": [],
           "tasks": [], "loggers": [], "optimizers": [], "lr_schedules": [], "architectures": []}


def test_json_lists_the_installed_example_next_to_the_built_ins(electra):
    env = {k: v for k, v in os.environ.items() if k != ENV_LOAD_PLUGINS}
    result = subprocess.run([sys.executable, "-m", "pretextual", "plugins", "--json"],
                            capture_output=True, text=True, env=env, check=True)
    rows = {row["name"]: row for row in json.loads(result.stdout)}
    assert rows["electra"] == ELECTRA
    assert rows["mlm"]["package"] == "pretextual" and rows["mlm"]["objectives"] == ["mlm"]


def test_the_table_has_one_line_per_plugin(electra, monkeypatch, capsys):
    monkeypatch.setenv(ENV_LOAD_PLUGINS, "electra")
    assert main(["plugins"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["plugin", "package", "version", "objectives", "exporters", "tasks",
                                "hooks"]
    assert [line.split() for line in lines if line.startswith("electra")] == [
        ["electra", "pretextual-electra", "0.1.0", "rtd", "register_objectives"]]


TWO_KINDS = """
import pretextual

@pretextual.hookimpl
def pretextual_register_objectives(register):
    register(pretextual.ObjectiveSpec(name="toy", build=lambda options, context: None))

@pretextual.hookimpl
def pretextual_register_exporters(register):
    register(pretextual.ExporterSpec(name="toy-format", export=lambda *args: None))
    register(pretextual.ExporterSpec(name="toy-format-2", export=lambda *args: None))

@pretextual.hookimpl
def pretextual_on_eval(metrics):
    pass
"""


def test_objectives_exporters_and_hooks_are_listed(fake_plugin, monkeypatch, capsys):
    monkeypatch.setenv(ENV_LOAD_PLUGINS, fake_plugin("toy-kit", TWO_KINDS, entry="toy"))
    assert main(["plugins", "--json"]) == 0
    rows = {row["name"]: row for row in json.loads(capsys.readouterr().out)}
    assert rows["toy"] == {"name": "toy", "package": "toy-kit", "version": "0.1",
                           "hooks": ["pretextual_on_eval", "pretextual_register_exporters",
                                     "pretextual_register_objectives"],
                           "objectives": ["toy"], "exporters": ["toy-format", "toy-format-2"],
                           "tasks": [], "loggers": [], "optimizers": [], "lr_schedules": [], "architectures": []}
    assert main(["plugins"]) == 0
    assert [line.split() for line in capsys.readouterr().out.splitlines() if line.startswith("toy")] == [
        ["toy", "toy-kit", "0.1", "toy", "toy-format,toy-format-2",
         "on_eval,register_exporters,register_objectives"]]


def test_the_restriction_variable_applies_to_the_listing(electra, monkeypatch, capsys):
    monkeypatch.setenv(ENV_LOAD_PLUGINS, "")
    assert main(["plugins", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert "electra" not in {row["name"] for row in rows}
    assert {row["package"] for row in rows} == {"pretextual"}
