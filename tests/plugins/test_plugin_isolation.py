"""A broken plugin is named on stderr and skipped (or fails the run in strict mode);
two plugins registering one name is an error naming both packages."""

from __future__ import annotations

import json

import pytest

import pretextual
from pretextual.cli import main
from pretextual.errors import PluginError
from pretextual.plugins.manager import Plugins

GOOD = """
import pretextual

@pretextual.hookimpl
def pretextual_register_objectives(register):
    register(pretextual.ObjectiveSpec(name="{name}", build=lambda options, context: None))
"""

BROKEN = {
    "import-error": (
        "import a_module_that_is_not_installed\n",
        "failed to import: ModuleNotFoundError: No module named 'a_module_that_is_not_installed'"),
    "wrong-argument": (
        """
        import pretextual

        @pretextual.hookimpl
        def pretextual_on_checkpoint(path):  # valid, and attached before the bad one
            pass

        @pretextual.hookimpl
        def pretextual_on_step_end(stepp, metrics):
            pass
        """,
        "implements a hook wrongly: Plugin 'wrong_argument' for hook 'pretextual_on_step_end' "
        "hookimpl definition: pretextual_on_step_end(stepp, metrics) Argument(s) {'stepp'} are "
        "declared in the hookimpl but can not be found in the hookspec"),
    "unknown-hook": (
        """
        import pretextual

        @pretextual.hookimpl
        def pretextual_on_step_ned(step):
            pass
        """,
        "implements pretextual_on_step_ned, which is not a pretextual hook "
        "(did you mean pretextual_on_step_end?)"),
    "raises-in-register": (
        """
        import pretextual

        @pretextual.hookimpl
        def pretextual_register_objectives(register):
            raise RuntimeError("no GPU found")
        """,
        "failed in pretextual_register_objectives: RuntimeError: no GPU found"),
    "registers-a-dict": (
        """
        import pretextual

        @pretextual.hookimpl
        def pretextual_register_objectives(register):
            register({"name": "dict"})
        """,
        "failed in pretextual_register_objectives: TypeError: register() takes a ObjectiveSpec, "
        "got {'name': 'dict'}"),
    "forgot-the-marker": (
        """
        def pretextual_register_objectives(register):
            pass
        """,
        "implements no pretextual hook (is each hook function decorated with @pretextual.hookimpl?)"),
}


@pytest.mark.parametrize("dist", sorted(BROKEN))
def test_a_broken_plugin_is_named_and_skipped_and_the_program_works(dist, fake_plugin, capsys):
    source, problem = BROKEN[dist]
    name = fake_plugin(dist, source)
    fake_plugin("good-plugin", GOOD.format(name="good"))

    plugins = Plugins()
    assert name not in plugins.info and "good" in plugins.objectives and "mlm" in plugins.objectives
    assert plugins.pm.get_plugin(name) is None
    assert all(i.plugin_name != name  # nothing left attached
               for i in plugins.pm.hook.pretextual_on_checkpoint.get_hookimpls())
    err = capsys.readouterr().err
    assert err == f"pretextual: warning: plugin '{name}' (package {dist} 0.1) {problem}; skipped it\n"

    assert main(["plugins", "--json"]) == 0
    listed = {row["name"] for row in json.loads(capsys.readouterr().out)}
    assert "good_plugin" in listed and name not in listed

    with pytest.raises(PluginError) as failure:
        Plugins(strict=True)
    assert str(failure.value) == f"plugin '{name}' (package {dist} 0.1) {problem}"
    assert main(["--strict-plugins", "plugins"]) == 2
    assert capsys.readouterr().err == f"pretextual: error: plugin '{name}' (package {dist} 0.1) {problem}\n"


def test_a_module_named_in_plugins_modules_that_fails_to_import_is_an_error(tmp_path, monkeypatch,
                                                                          capsys):
    (tmp_path / "my_objective.py").write_text("import a_module_that_is_not_installed\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["config", "roberta", "plugins.modules=[my_objective]"]) == 2
    assert capsys.readouterr().err == (
        "pretextual: error: plugins.modules: 'my_objective' failed to import: "
        "ModuleNotFoundError: No module named 'a_module_that_is_not_installed'\n")


@pytest.mark.parametrize("argv", [["--strict-plugins", "train"], ["train", "--strict-plugins"],
                                  ["config", "--strict-plugins"], ["plugins", "--strict-plugins"]])
def test_strict_plugins_goes_before_or_after_the_subcommand(argv, fake_plugin, tmp_path, capsys):
    source, problem = BROKEN["import-error"]
    name = fake_plugin("import-error", source)
    # Were the flag lost, train would stop at the missing corpus with another error.
    overrides = [f"data.corpus={tmp_path / 'missing.txt'}", f"trainer.output_dir={tmp_path / 'run'}"]
    capsys.readouterr()
    assert main(argv + ([] if "plugins" in argv else overrides)) == 2
    assert capsys.readouterr().err == \
        f"pretextual: error: plugin '{name}' (package import-error 0.1) {problem}\n"


class Failing:
    """Raises in pretextual_on_step_end from step ``at`` on."""

    def __init__(self, at: int):
        self.at, self.calls = at, 0

    @pretextual.hookimpl
    def pretextual_on_step_end(self, step):
        self.calls += 1
        if step >= self.at:
            raise ZeroDivisionError("division by zero")


class Steps:
    def __init__(self):
        self.seen: list[int] = []

    @pretextual.hookimpl
    def pretextual_on_step_end(self, step):
        self.seen.append(step)


def test_a_plugin_raising_during_training_is_disabled_and_the_run_finishes(train, capsys):
    plugins = Plugins()
    failing, steps = Failing(at=2), Steps()
    plugins.register(failing, package="flaky-logger", version="1.0")
    plugins.register(steps)
    records = train(plugins, steps=4)
    assert [r["step"] for r in records if "loss" in r] == [1, 2, 3, 4]
    assert steps.seen == [1, 2, 3, 4] and failing.calls == 2
    assert plugins.pm.get_plugin("Failing") is None
    warnings = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert warnings == ["pretextual: warning: plugin 'Failing' (package flaky-logger 1.0) failed in "
                        "pretextual_on_step_end: ZeroDivisionError: division by zero; disabled its "
                        "hooks for the rest of the run (what it registered, objectives, "
                        "exporters and tasks, stays in use)"]


def test_a_plugin_raising_during_training_stops_a_strict_run(train):
    plugins = Plugins(strict=True)
    plugins.register(Failing(at=2))
    with pytest.raises(PluginError, match="^plugin 'Failing' failed in pretextual_on_step_end: "
                                          "ZeroDivisionError: division by zero$"):
        train(plugins, steps=4)


def test_two_plugins_registering_one_objective_name_are_named_and_the_name_refused(fake_plugin,
                                                                                   capsys):
    fake_plugin("first-toys", GOOD.format(name="toy"))
    fake_plugin("second-toys", GOOD.format(name="toy"))
    message = ("objective 'toy' is registered twice: by plugin 'first_toys' (package first-toys 0.1) "
               "and by plugin 'second_toys' (package second-toys 0.1); uninstall one or leave it "
               "out with PRETEXTUAL_LOAD_PLUGINS")
    plugins = Plugins()
    assert capsys.readouterr().err == (f"pretextual: warning: {message}; a run that selects 'toy' "
                                       f"is refused\n")
    with pytest.raises(PluginError) as failure:
        plugins.objective("toy")
    assert str(failure.value) == f"objectives.toy: {message}"
    assert plugins.objective("mlm").name == "mlm"  # every other name is still usable
    with pytest.raises(PluginError) as failure:
        Plugins(strict=True)
    assert str(failure.value) == message
    capsys.readouterr()
    # the listing that shows who registers what still works, both plugins in it
    assert main(["plugins", "--json"]) == 0
    captured = capsys.readouterr()
    rows = {r["name"]: r["objectives"] for r in json.loads(captured.out)}
    assert rows["first_toys"] == rows["second_toys"] == ["toy"]
    assert message in captured.err
    assert main(["config", "roberta", "objectives.toy.weight=1"]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == f"pretextual: error: objectives.toy: {message}"


def test_a_plugin_reusing_a_built_in_objective_name_does_not_stop_the_others(fake_plugin, capsys):
    fake_plugin("my-mlm", GOOD.format(name="mlm"))
    plugins = Plugins()
    assert capsys.readouterr().err.startswith(
        "pretextual: warning: objective 'mlm' is registered twice: by plugin 'mlm' (package "
        "pretextual ")
    with pytest.raises(PluginError, match=r"^objectives\.mlm: objective 'mlm' is registered twice: "
                                          r"by plugin 'mlm' \(package pretextual [\d.]+\) and by "
                                          r"plugin 'my_mlm' \(package my-mlm 0.1\)"):
        plugins.objective("mlm")
    assert plugins.objective("span").name == "span"


def test_a_plugin_whose_name_is_taken_is_skipped(fake_plugin, capsys):
    fake_plugin("other-mlm", GOOD.format(name="other"), entry="mlm")
    plugins = Plugins()
    assert "other" not in plugins.objectives
    assert capsys.readouterr().err.startswith(
        "pretextual: warning: plugin 'mlm' (package other-mlm 0.1) has the same name as "
        "plugin 'mlm' (package pretextual")
