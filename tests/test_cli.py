"""The pretextual command itself: its version, its help, where options may stand, the
README's commands in order, and output into a closed pipe."""

import importlib.metadata
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pretextual.cli import main
from pretextual.core.config import DEFAULT_RECIPE
from run_helpers import tiny_overrides, write_topic_task

README = Path(__file__).resolve().parents[1] / "README.md"


def _fast(corpus, cache) -> list[str]:
    """The overrides of a run that takes seconds, leaving trainer.output_dir to its default."""
    return [o for o in tiny_overrides(corpus, cache, Path("unused"), steps=2)
            if not o.startswith("trainer.output_dir=")]


def test_version_names_the_installed_package(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out == f"pretextual {importlib.metadata.version('pretextual')}\n"


def test_train_help_lists_every_config_group_and_key_with_its_default(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    help_text = capsys.readouterr().out
    for group in ("model:", "data:", "trainer:", "plugins:", "objectives.<name>:"):
        assert f"\n  {group}\n" in help_text
    for key in ("model.preset=tiny", "data.max_seq_length=64", "trainer.max_steps=1000",
                "trainer.output_dir=null", "trainer.progress=true", "plugins.modules=[]",
                "objectives.<name>.weight=1.0"):
        assert re.search(rf"^    {re.escape(key)}\s+\S", help_text, re.M), key
    assert "pretextual config --reference" in help_text


def _readme_commands() -> list[list[str]]:
    """The pretextual train/config/plugins commands of README.md's code blocks, in order."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", README.read_text(), re.S):
        for line in block.splitlines():
            line = line.split("#")[0].strip()
            found = re.search(r"(?:^|&& )pretextual ((?:train|config|plugins)\b.*)$", line)
            if found:
                commands.append(found.group(1).split())
    return commands


def test_the_readmes_commands_work_one_after_another_in_a_fresh_directory(
        corpus_file, cache_dir, tmp_path, monkeypatch, capsys):
    commands = _readme_commands()
    trains = [c for c in commands if c[0] == "train"]
    assert len(trains) >= 3 and len(commands) >= 5  # the main job, the examples, config, plugins
    monkeypatch.chdir(tmp_path)
    for command in commands:
        extra = _fast(corpus_file, cache_dir) if command[0] in ("train", "config") else []
        assert main(command + extra) == 0, " ".join(command)
    runs = sorted(p.name for p in (tmp_path / "runs").iterdir() if p.name != "latest")
    recipes = [c[1] if len(c) > 1 and "=" not in c[1] and not c[1].startswith("~")
               else DEFAULT_RECIPE for c in trains]
    assert [re.sub(r"-\d{8}-\d{6}(-\d+)?$", "", r) for r in runs] == sorted(recipes)
    printed = re.findall(r"^run directory: (\S+)$", capsys.readouterr().out, re.M)
    assert sorted(Path(p).name for p in printed) == runs
    # runs/latest is the newest run, and the README's next command reads it
    latest = tmp_path / "runs" / "latest"
    assert latest.is_symlink() and (latest / "checkpoints").is_dir()
    task = write_topic_task(tmp_path / "topics.csv")
    assert main(["evaluate", "runs/latest", "--task", str(task), "--seeds", "1", "--folds", "2"]) == 0


def test_resume_may_stand_anywhere_and_continues_the_newest_run(corpus_file, cache_dir, tmp_path,
                                                               monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    fast = _fast(corpus_file, cache_dir)
    assert main(["train", "roberta", *fast]) == 0
    run = (tmp_path / "runs" / "latest").resolve()
    assert run.name.startswith("roberta-")
    capsys.readouterr()
    # the option between the recipe and the overrides, the overrides after it still read
    assert main(["train", "roberta", "--resume", *fast, "trainer.max_steps=4"]) == 0
    out = capsys.readouterr().out
    assert f"resumed from {Path('runs') / run.name / 'checkpoints' / 'step-0000002'}" in out
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-0000002", "step-0000004"]
    assert [p.name for p in (tmp_path / "runs").iterdir() if p.name != "latest"] == [run.name]


def test_resume_without_a_run_to_continue_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--resume", "trainer.max_steps=2"]) == 2
    assert capsys.readouterr().err == (
        "pretextual: error: --resume: runs/latest does not exist, so there is no newest run "
        "here to continue; name the run with trainer.output_dir=DIR\n")


def test_an_unknown_option_after_the_overrides_is_still_refused(capsys):
    with pytest.raises(SystemExit) as done:
        main(["train", "bert", "trainer.max_steps=2", "--bogus"])
    assert done.value.code == 2
    assert "unrecognized arguments: --bogus" in capsys.readouterr().err


def test_output_into_a_closed_pipe_ends_quietly():
    # `pretextual plugins --json | head`: the reader is gone before the output is written
    child = subprocess.Popen([sys.executable, "-m", "pretextual", "plugins", "--json"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    child.stdout.close()
    err = child.stderr.read().decode()
    assert child.wait() == 141 and err == ""
