"""The guide keeps up with the hook surface (as datasette's meta-tests do), and its
walk-through plugin works."""

from __future__ import annotations

import ast
import importlib.util
import re
import tomllib
from pathlib import Path
from statistics import mean

import pytest

from omegaconf import OmegaConf

import pretextual
from pretextual.core.mix import check_objectives
from pretextual.errors import ConfigError
from pretextual.plugins import hookspecs
from pretextual.plugins.manager import ENV_LOAD_PLUGINS, Plugins

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "plugins.md"


def declared_hooks() -> dict[str, list[str]]:
    """Every hook of the hookspec module, with its argument names, read from the source."""
    tree = ast.parse(Path(hookspecs.__file__).read_text())
    return {node.name: [a.arg for a in node.args.args] for node in tree.body
            if isinstance(node, ast.FunctionDef)
            and any(isinstance(d, ast.Name) and d.id == "hookspec" for d in node.decorator_list)}


HOOKS = declared_hooks()


def test_the_source_declares_what_pluggy_sees():
    pm = Plugins().pm
    assert set(HOOKS) == {name for name in vars(pm.hook) if name.startswith("pretextual_")}
    assert {"pretextual_on_step_end", "pretextual_on_eval", "pretextual_on_checkpoint"} <= set(HOOKS)


@pytest.mark.parametrize("hook", sorted(HOOKS))
def test_every_hook_is_documented_in_the_guide_with_its_arguments(hook):
    assert f"### `{hook}({', '.join(HOOKS[hook])})`" in GUIDE.read_text()
    assert getattr(hookspecs, hook).__doc__.strip()


def recorder_of_every_hook():
    """A plugin implementing every declared hook with exactly its documented arguments,
    recording each call's arguments."""
    calls: dict[str, list[dict]] = {}
    source = "class Recorder:\n" + "".join(
        f"    @hookimpl\n    def {hook}(self, {', '.join(args)}):\n"
        f"        calls.setdefault({hook!r}, []).append(dict({', '.join(f'{a}={a}' for a in args)}))\n"
        for hook, args in HOOKS.items())
    namespace = {"hookimpl": pretextual.hookimpl, "calls": calls}
    exec(source, namespace)
    return namespace["Recorder"](), calls


def test_every_hook_is_called_with_its_documented_arguments(train):
    recorder, calls = recorder_of_every_hook()
    plugins = Plugins()
    assert plugins.register(recorder, "recorder")
    train(plugins, "trainer.eval_every=2", "trainer.checkpoint_every=2", steps=4)
    assert set(calls) == set(HOOKS)
    assert [c["step"] for c in calls["pretextual_on_step_end"]] == [1, 2, 3, 4]
    assert [c["step"] for c in calls["pretextual_on_eval"]] == [2, 4]
    assert [c["step"] for c in calls["pretextual_on_checkpoint"]] == [2, 4]
    assert all(Path(c["path"]).is_dir() for c in calls["pretextual_on_checkpoint"])
    assert "loss" in calls["pretextual_on_step_end"][-1]["metrics"]
    assert all(callable(c["register"]) for c in calls["pretextual_register_objectives"])


def guide_files() -> dict[str, str]:
    """The files of the guide's walk-through: its code blocks marked title="path"."""
    return dict(re.findall(r'```\w+ title="([^"]+)"\n(.*?)```', GUIDE.read_text(), re.S))


def test_the_guide_plugin_registers_through_its_entry_point_and_trains(train, tmp_path, monkeypatch):
    monkeypatch.setenv(ENV_LOAD_PLUGINS, "")  # in case the guide's package is installed here
    files = guide_files()
    assert set(files) == {"pyproject.toml", "pretextual_myobj.py", "tests/test_myobj.py"}
    project = tomllib.loads(files["pyproject.toml"])
    assert project["project"]["entry-points"]["pretextual"] == {"myobj": "pretextual_myobj"}

    path = tmp_path / "pretextual_myobj.py"
    path.write_text(files["pretextual_myobj.py"])
    spec = importlib.util.spec_from_file_location("pretextual_myobj", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    plugins = Plugins()
    assert plugins.register(module, "myobj", "pretextual-myobj", "0.1.0")
    assert plugins.info["myobj"].objectives == ["myobj"]
    # Its option check runs when the config is checked, before any text is read.
    with pytest.raises(ConfigError, match=r"^objectives\.myobj\.pos_weight must be positive, got 0\.0$"):
        check_objectives(OmegaConf.create({"myobj": {"weight": 1, "pos_weight": 0}}), plugins)

    records = [r for r in train(plugins, "objectives.myobj.weight=1", steps=30) if "loss" in r]
    losses = [r["loss/myobj"] for r in records]
    assert mean(losses[-5:]) < 0.8 * mean(losses[:5])
    recall = [r["myobj/recall"] for r in records]
    assert mean(recall[-5:]) > mean(recall[:5]) + 0.1  # measured: 0.71 -> 0.95
