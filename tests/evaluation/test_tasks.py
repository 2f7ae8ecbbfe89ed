"""Task files: each format reads the same examples, columns can be renamed, labels
decide the kind of task, and every bad input is one line naming the file and column."""

import json

import numpy as np
import pytest

from run_helpers import topic_rows, write_rows
from pretextual.cli import main
from pretextual.errors import EvaluationError
from pretextual.evaluation.tasks import CLASSIFICATION, REGRESSION, Columns, load_task
from pretextual.plugins.manager import Plugins


@pytest.fixture(scope="module")
def plugins():
    return Plugins()


@pytest.mark.parametrize("suffix", [".csv", ".tsv", ".jsonl"])
def test_every_format_reads_the_same_task(tmp_path, plugins, suffix):
    rows = topic_rows(groups=6, per_group=2)
    rows[0]["text"] = 'He said "no", then left.'  # quotes and a comma survive each format
    task = load_task(str(write_rows(tmp_path / f"t{suffix}", rows)), plugins,
                     Columns(group="doc"))
    assert task.kind == CLASSIFICATION and task.metric == "accuracy"
    assert task.text == [r["text"] for r in rows]
    assert task.classes == sorted({r["label"] for r in rows})
    assert [task.classes[i] for i in task.y] == [r["label"] for r in rows]
    assert len(np.unique(task.groups)) == 6 and task.text_pair is None


def test_renamed_columns_and_pairs(tmp_path, plugins):
    rows = [{"premise": f"sentence {i}.", "hypothesis": f"other {i}.", "gold": i % 2}
            for i in range(10)]
    task = load_task(str(write_rows(tmp_path / "pairs.csv", rows)), plugins,
                     Columns(text="premise", pair="hypothesis", label="gold"))
    assert task.text_pair == [r["hypothesis"] for r in rows]
    assert task.classes == ["0", "1"] and list(task.y) == [i % 2 for i in range(10)]
    # text_pair is read without being named
    rows = [{"text": "a b.", "text_pair": "c d.", "label": "x" if i % 2 else "y"} for i in range(6)]
    assert load_task(str(write_rows(tmp_path / "p.jsonl", rows)), plugins).text_pair == ["c d."] * 6


def test_numbers_with_a_fraction_are_regression(tmp_path, plugins):
    rows = [{"text": f"s {i}.", "label": f"{i / 4:.2f}"} for i in range(8)]
    task = load_task(str(write_rows(tmp_path / "r.tsv", rows)), plugins)
    assert task.kind == REGRESSION and task.metric == "pearson" and task.classes == []
    assert np.allclose(task.y, [i / 4 for i in range(8)])


def test_an_eval_file_is_the_evaluation_split(tmp_path, plugins):
    train = write_rows(tmp_path / "train.csv", topic_rows(groups=6, per_group=2))
    test = write_rows(tmp_path / "dev.csv", topic_rows(groups=6, per_group=1, seed=9))
    task = load_task(str(train), plugins, eval_file=str(test))
    assert task.eval_start == 12 and len(task) == 18


def _error(capsys, *argv) -> str:
    capsys.readouterr()
    assert main([str(a) for a in argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("pretextual: error: "), err
    return err[0]


BAD = {
    "missing column": ([{"sentence": "a.", "label": "x"}] * 4, [], "no column 'text'"),
    "renamed column missing": ([{"text": "a.", "label": "x"}] * 4, ["--group-column", "author"],
                               "no column 'author'"),
    "one class": ([{"text": f"a {i}.", "label": "x"} for i in range(6)], [], "one class only ('x')"),
    "empty text": ([{"text": "a.", "label": "x"}, {"text": "  ", "label": "y"}], [],
                   "t.jsonl:2: column 'text' is empty"),
    "null label": ([{"text": "a.", "label": "x"}, {"text": "b.", "label": None}], [],
                   "t.jsonl:2: column 'label': label None is neither a class nor a number"),
    "list label": ([{"text": "a.", "label": [1]}, {"text": "b.", "label": "y"}], [],
                   "label [1] is neither a class nor a number"),
    "mixed labels": ([{"text": "a.", "label": "x"}, {"text": "b.", "label": 2}], [],
                     "labels mix class names and numbers"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_task_files_are_one_line(tmp_path, capsys, trained_run, case):
    rows, flags, expected = BAD[case]
    path = write_rows(tmp_path / "t.jsonl", rows)
    line = _error(capsys, "evaluate", trained_run, "--task", path, *flags)
    assert expected in line and "t.jsonl" in line


def test_bad_csv_and_names_are_one_line(tmp_path, capsys, trained_run):
    path = tmp_path / "t.csv"
    path.write_text("text,label\na.,x\nb.,y,extra\n")
    assert "t.csv:3: 3 fields, the header has 2" in _error(capsys, "evaluate", trained_run, "--task", path)
    assert "no such task file" in _error(capsys, "evaluate", trained_run, "--task", tmp_path / "no.csv")
    line = _error(capsys, "evaluate", trained_run, "--task", "no-such-task")
    assert "no plugin registers a task named 'no-such-task'" in line


def test_a_model_of_another_architecture_is_one_line(tmp_path, capsys, topic_task):
    model = tmp_path / "roberta"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "roberta", "hidden_size": 8}))
    line = _error(capsys, "evaluate", model, "--task", topic_task)
    assert "config.json" in line and "model_type is 'roberta', not one of 'bert', 'modernbert'" in line
    assert "no such model directory" in _error(capsys, "evaluate", tmp_path / "none", "--task", topic_task)


def test_errors_of_load_task_name_the_file(tmp_path, plugins):
    path = write_rows(tmp_path / "g.csv", topic_rows(groups=2, per_group=2))
    with pytest.raises(EvaluationError, match="g.csv: no column 'group'"):
        load_task(str(path), plugins, Columns(group="group"))


class _FakeDatasets:
    """Stands in for Hugging Face datasets: two GLUE splits held in memory."""

    def __init__(self):
        self.calls = []

    def load_dataset(self, path, name, split):
        self.calls.append((path, name, split))
        if name == "stsb":
            return {"sentence1": ["a b.", "c d."], "sentence2": ["a b!", "e f."], "label": [4.8, 0.4]}
        if split == "train":
            return {"sentence": ["fine film.", "dull film.", "great.", "bad."], "label": [1, 0, 1, 0]}
        return {"sentence": ["good film.", "awful."], "label": [1, 0]}


def test_glue_tasks_read_train_and_dev_through_datasets(monkeypatch, plugins):
    import sys
    fake = _FakeDatasets()
    monkeypatch.setitem(sys.modules, "datasets", fake)
    task = load_task("glue-sst2", plugins)
    assert fake.calls == [("nyu-mll/glue", "sst2", "train"), ("nyu-mll/glue", "sst2", "validation")]
    assert task.text == ["fine film.", "dull film.", "great.", "bad.", "good film.", "awful."]
    assert task.eval_start == 4 and task.classes == ["0", "1"]
    stsb = load_task("glue-stsb", plugins)
    assert stsb.kind == REGRESSION and stsb.text_pair[0] == "a b!"


def test_glue_without_datasets_is_one_line(monkeypatch, plugins):
    import sys
    monkeypatch.setitem(sys.modules, "datasets", None)  # import fails
    with pytest.raises(EvaluationError, match=r"^task 'glue-rte' reads GLUE through Hugging Face "
                                              r"datasets: pip install datasets$"):
        load_task("glue-rte", plugins)


def test_a_task_plugin_registers_by_name(plugins):
    import pretextual
    from pretextual.plugins.api import TaskData, TaskSpec

    class Tickets:
        @pretextual.hookimpl
        def pretextual_register_tasks(self, register):
            rows = [("the app crashes on start", "bug"), ("please add dark mode", "feature")] * 5
            register(TaskSpec("tickets", lambda: TaskData([t for t, _ in rows], [l for _, l in rows])))

    mine = Plugins()
    assert mine.register(Tickets(), "tickets-plugin")
    assert mine.info["tickets-plugin"].tasks == ["tickets"]
    task = load_task("tickets", mine)
    assert task.classes == ["bug", "feature"] and len(task) == 10
    with pytest.raises(Exception, match="no plugin registers a task named 'tickets'"):
        load_task("tickets", plugins)


def test_evaluate_without_scikit_learn_names_the_extra(monkeypatch, capsys, trained_run, topic_task):
    import sys
    monkeypatch.setitem(sys.modules, "sklearn", None)
    line = _error(capsys, "evaluate", trained_run, "--task", topic_task)
    assert line == ("pretextual: error: the probe and the TF-IDF baseline need scikit-learn: "
                    "pip install 'pretextual[eval]'")
