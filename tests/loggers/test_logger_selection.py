"""trainer.loggers: tensorboard by default, each name one a plugin registers (a third-party
logger included), and a run that cannot log where it was asked to refused before it reads
the corpus, in one line naming the key and what to install."""

from __future__ import annotations

import sys

import pytest

import pretextual
from pretextual import ConfigError, LoggerSpec
from pretextual.core.config import load_config
from pretextual.core.trainer import Trainer
from pretextual.plugins.manager import Plugins


class Recorder:
    """A third-party logger: registers its name and logs only when a run selects it."""

    def __init__(self, requires=()):
        self.requires, self.steps = requires, []

    @pretextual.hookimpl
    def pretextual_register_loggers(self, register):
        register(LoggerSpec("recorder", requires=self.requires,
                            install="pip install pretextual-recorder"))

    @pretextual.hookimpl
    def pretextual_on_step_end(self, step, trainer):
        if "recorder" in trainer.cfg.trainer.loggers:
            self.steps.append(step)


def plugins_with(plugin, name):
    plugins = Plugins()
    assert plugins.register(plugin, name)
    return plugins


def test_tensorboard_is_the_default_and_the_built_in_loggers_are_registered():
    assert list(load_config("bert").trainer.loggers) == ["tensorboard"]
    plugins = Plugins()
    assert sorted(plugins.loggers) == ["mlflow", "tensorboard", "wandb"]
    assert plugins.owner("logger", "mlflow").package == "pretextual"


def test_an_unknown_logger_is_one_line_naming_the_key_and_the_known_names(tiny_config):
    with pytest.raises(ConfigError) as error:
        Trainer(tiny_config("roberta", "trainer.loggers=[tensorboard,neptune]"))
    assert str(error.value) == ("trainer.loggers: no plugin registers a logger named 'neptune' "
                                "(known: mlflow, tensorboard, wandb)")


@pytest.mark.parametrize("name", ["mlflow", "wandb"])
def test_a_logger_whose_package_is_missing_names_the_extra(tiny_config, monkeypatch, name):
    monkeypatch.setitem(sys.modules, name, None)  # what an uninstalled package looks like to import
    with pytest.raises(ConfigError) as error:
        Trainer(tiny_config("roberta", f"trainer.loggers=[{name}]"))
    assert str(error.value) == (f"trainer.loggers: {name} needs the {name} package, which is not "
                                f"installed: pip install 'pretextual[{name}]' (or leave {name} out "
                                f"of trainer.loggers)")


def test_a_third_party_logger_is_selected_by_the_name_it_registers(tiny_config):
    recorder = Recorder()
    Trainer(tiny_config("roberta", "trainer.loggers=[recorder]", steps=3),
            plugins_with(recorder, "recorder"), log=lambda *_: None).train()
    assert recorder.steps == [1, 2, 3]
    left_out = Recorder()
    Trainer(tiny_config("roberta", "trainer.loggers=[]", "trainer.overwrite_output_dir=true",
                        steps=3), plugins_with(left_out, "recorder"), log=lambda *_: None).train()
    assert left_out.steps == []


def test_a_third_party_logger_missing_a_module_says_its_own_install_line(tiny_config):
    plugins = plugins_with(Recorder(requires=("pretextual_no_such_module",)), "recorder")
    with pytest.raises(ConfigError, match=r"^trainer\.loggers: recorder needs the "
                                          r"pretextual_no_such_module package, which is not "
                                          r"installed: pip install pretextual-recorder \(or"):
        Trainer(tiny_config("roberta", "trainer.loggers=[recorder]"), plugins)


def test_a_logger_name_registered_twice_is_refused_naming_both_plugins(tiny_config):
    class Impostor:
        @pretextual.hookimpl
        def pretextual_register_loggers(self, register):
            register(LoggerSpec("mlflow"))

    plugins = plugins_with(Impostor(), "impostor")
    with pytest.raises(ConfigError, match=r"^trainer\.loggers: logger 'mlflow' is registered "
                                          r"twice: by plugin 'mlflow' \(package pretextual "
                                          r"[^)]*\) and by plugin 'impostor'"):
        Trainer(tiny_config("roberta", "trainer.loggers=[mlflow]"), plugins)
    Trainer(tiny_config("roberta", "trainer.loggers=[wandb]"), plugins)  # the others stay usable


@pytest.mark.parametrize("override, message", [
    ("trainer.wandb_mode=ofline",
     "trainer.wandb_mode must be one of online, offline, disabled (or unset), got 'ofline'"),
    ("trainer.mlflow_tracking_uri=mlruns",
     "trainer.mlflow_tracking_uri=mlruns: MLflow's file store keeps each metric in a file named "
     "after it, so it cannot hold both loss and loss/mlm; give a database "
     "(sqlite:///path/mlflow.db, the default's kind) or a tracking server's URL"),
    ("trainer.loggers=mlflow",
     "trainer.loggers: takes a list, written in brackets: trainer.loggers=[mlflow] "
     "(several: trainer.loggers=[a,b])"),
])
def test_logger_settings_no_run_could_use_are_one_line(override, message):
    with pytest.raises(ConfigError) as error:
        load_config("bert", [override])
    assert str(error.value) == message


def test_tracking_uris_that_are_not_directories_are_taken():
    for uri in ("sqlite:///runs/mlflow.db", "http://localhost:5000", "databricks"):
        assert load_config("bert", [f"trainer.mlflow_tracking_uri={uri}"]).trainer.mlflow_tracking_uri == uri
