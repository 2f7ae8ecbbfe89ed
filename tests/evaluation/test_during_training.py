"""trainer.eval_tasks: the downstream probe at every evaluation, in metrics.jsonl."""

import json

import pytest

from pretextual.core.config import load_config
from pretextual.core.trainer import Trainer
from pretextual.errors import EvaluationError
from run_helpers import tiny_overrides, topic_rows, write_rows


def test_eval_task_lines_appear_in_metrics(corpus_file, cache_dir, tmp_path, topic_task):
    out = tmp_path / "run"
    cfg = load_config("roberta", tiny_overrides(corpus_file, cache_dir, out, 6)
                      + ["trainer.eval_every=3", f"trainer.eval_tasks=[{topic_task}]"])
    final = Trainer(cfg, log=lambda *a: None).train()
    lines = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
    probes = [(l["step"], l["eval/topics/accuracy"]) for l in lines if "eval/topics/accuracy" in l]
    assert [step for step, _ in probes] == [0, 3, 6]  # step 0: the untrained encoder
    assert all(0.5 < accuracy <= 1.0 for _, accuracy in probes)  # six topics: chance is 1/6
    assert final["eval/topics/accuracy"] == probes[-1][1]
    assert "eval/mlm/accuracy" in final  # next to the held-out metrics


def test_a_bad_eval_task_fails_before_training(corpus_file, cache_dir, tmp_path):
    bad = write_rows(tmp_path / "bad.csv", [dict(r, label="same") for r in topic_rows(groups=4)])
    cfg = load_config("roberta", tiny_overrides(corpus_file, cache_dir, tmp_path / "run", 6)
                      + [f"trainer.eval_tasks=[{bad}]"])
    with pytest.raises(EvaluationError, match="bad.csv: one class only"):
        Trainer(cfg, log=lambda *a: None)
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_without_scikit_learn_a_run_says_so_and_trains(corpus_file, cache_dir, tmp_path,
                                                       topic_task, monkeypatch):
    monkeypatch.setattr("pretextual.evaluation.probing.probes_available", lambda: False)
    said = []
    cfg = load_config("roberta", tiny_overrides(corpus_file, cache_dir, tmp_path / "run", 2)
                      + [f"trainer.eval_tasks=[{topic_task}]"])
    final = Trainer(cfg, log=said.append).train()
    assert ("warning: trainer.eval_tasks needs scikit-learn (pip install 'pretextual[eval]'); "
            "this run probes no downstream task") in said
    assert "eval/mlm/accuracy" in final and not any("topics" in k for k in final)
