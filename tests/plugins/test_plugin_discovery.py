"""Discovery: installed entry points, the restriction variable, modules named by the config."""

from __future__ import annotations

import re

import pytest
from omegaconf import OmegaConf

import pretextual
from pretextual.errors import PluginError
from pretextual.plugins.manager import ENV_LOAD_PLUGINS, Plugins

TOY = """
import pretextual

@pretextual.hookimpl
def pretextual_register_objectives(register):
    register(pretextual.ObjectiveSpec(name="{name}", build=lambda options, context: None))
"""


def test_the_installed_example_is_found_through_its_entry_point(electra):
    from pretextual_electra.rtd import RTDOptions

    plugins = Plugins()
    info = plugins.info["electra"]
    assert (info.package, info.version) == ("pretextual-electra", "0.1.0")
    assert info.objectives == ["rtd"] and info.exporters == []
    assert info.hooks == ["pretextual_register_objectives"]
    assert plugins.objective("rtd").options is RTDOptions
    assert plugins.owner("objective", "mlm").package == "pretextual"  # built-ins load too


@pytest.mark.parametrize("value, loaded", [
    (None, {"electra", "toy"}),              # unset: every installed plugin
    ("electra", {"electra"}),                # by entry-point name
    ("Pretextual_Electra , toy", {"electra", "toy"}),  # package names compare as pip does
    ("", set()),                             # set but empty: none
])
def test_the_restriction_variable_chooses_which_installed_plugins_load(
        electra, fake_plugin, monkeypatch, capsys, value, loaded):
    fake_plugin("toy-plugin", TOY.format(name="toy"), entry="toy")
    if value is not None:
        monkeypatch.setenv(ENV_LOAD_PLUGINS, value)
    plugins = Plugins()
    assert {"electra", "toy"} & set(plugins.info) == loaded
    assert {"rtd", "toy"} & set(plugins.objectives) == {{"electra": "rtd", "toy": "toy"}[n] for n in loaded}
    assert "mlm" in plugins.objectives  # built-ins always load
    assert "warning" not in capsys.readouterr().err


def test_a_name_in_the_variable_that_matches_nothing_is_reported(electra, monkeypatch, capsys):
    monkeypatch.setenv(ENV_LOAD_PLUGINS, "electra,electrra")
    assert "electra" in Plugins().info
    err = capsys.readouterr().err
    assert re.fullmatch(rf"pretextual: warning: {ENV_LOAD_PLUGINS} names 'electrra', but no installed "
                        r"plugin has that entry-point or package name \(installed: [^)]*\belectra\b"
                        r"[^)]*\); ignored it\n", err)
    with pytest.raises(PluginError, match="names 'electrra'"):
        Plugins(strict=True)


def test_the_config_names_modules_to_load_even_when_the_variable_excludes_them(
        tmp_path, monkeypatch, capsys):
    (tmp_path / "local_objectives.py").write_text(TOY.format(name="local"))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(ENV_LOAD_PLUGINS, "")
    cfg = OmegaConf.create({"plugins": {"modules": ["local_objectives"], "strict": True}})
    plugins = Plugins.from_config(cfg)
    assert plugins.strict
    assert plugins.owner("objective", "local").name == "local_objectives"
    assert Plugins.from_config(OmegaConf.create({})).strict is False  # no plugins section: defaults


def test_a_module_named_by_an_entry_point_and_the_config_loads_once(fake_plugin, capsys):
    fake_plugin("toy-plugin", TOY.format(name="toy"), entry="toy")
    plugins = Plugins(extra_modules=("toy_plugin",))
    assert plugins.owner("objective", "toy").name == "toy"
    assert "toy_plugin" not in plugins.info
    assert "warning" not in capsys.readouterr().err


def test_an_entry_point_may_name_an_object_rather_than_a_module(fake_plugin):
    fake_plugin("stopper-plugin", """
        import pretextual

        class Stopper:
            @pretextual.hookimpl
            def pretextual_on_step_end(self, trainer):
                trainer.should_stop = True

        stopper = Stopper()
        """, entry="stopper", attr="stopper")
    info = Plugins().info["stopper"]
    assert (info.package, info.hooks) == ("stopper-plugin", ["pretextual_on_step_end"])


def test_an_in_process_plugin_object_is_registered_like_an_installed_one():
    class Logger:
        @pretextual.hookimpl
        def pretextual_on_eval(self, metrics):
            pass

    plugins = Plugins()
    assert plugins.register(Logger(), package="my-notebook")
    assert plugins.info["Logger"].hooks == ["pretextual_on_eval"]
    assert plugins.info["Logger"].label() == "plugin 'Logger' (package my-notebook)"
