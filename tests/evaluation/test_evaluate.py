"""``pretextual evaluate`` end to end: the JSON layout, scores against their baselines,
the untrained twin, and the same numbers for the same weights whoever saved them."""

import json
import statistics

import pytest
import torch

from run_helpers import topic_rows, write_rows
from pretextual.cli import main
from pretextual.core.config import load_config
from pretextual.core.trainer import Trainer
from pretextual.evaluation.encoders import load_encoder, untrained_twin


def evaluate(capsys, tmp_path, *argv) -> tuple[dict, str]:
    out = tmp_path / "scores.json"
    capsys.readouterr()
    assert main(["evaluate", *map(str, argv), "--json", str(out)]) == 0
    return json.loads(out.read_text()), capsys.readouterr().out


@pytest.fixture(scope="module")
def probe_scores(trained_run, topic_task, tmp_path_factory):
    """The probe on the topic task (5 grouped folds, 2 seeds), with its table."""
    out = tmp_path_factory.mktemp("scores") / "scores.json"
    from contextlib import redirect_stdout
    import io
    table = io.StringIO()
    with redirect_stdout(table):
        assert main(["evaluate", str(trained_run), "--task", str(topic_task), "--group-column",
                     "doc", "--seeds", "2", "--json", str(out)]) == 0
    return json.loads(out.read_text()), table.getvalue()


def test_the_json_has_the_documented_layout(probe_scores, trained_run, topic_task):
    document, _ = probe_scores
    task = document["tasks"][str(topic_task)]
    assert task["metric"] == "accuracy" and task["n"] == 180
    assert set(task["models"]) == {str(trained_run)}
    assert set(task["baselines"]) == {"majority", "untrained", "tfidf"}
    for entry in (task["models"][str(trained_run)]["probe"], task["baselines"]["untrained"]["probe"],
                  task["baselines"]["majority"], task["baselines"]["tfidf"]):
        assert {"mean", "std", "per_seed"} <= set(entry) and len(entry["per_seed"]) == 2
        assert entry["mean"] == pytest.approx(sum(entry["per_seed"]) / 2)
    versus = task["models"][str(trained_run)]["probe"]["vs_untrained"]
    assert set(versus) == {"difference", "se"} and versus["se"] > 0


def test_the_probe_beats_majority_where_the_answer_is_in_the_words(probe_scores, topic_task):
    task = probe_scores[0]["tasks"][str(topic_task)]
    majority = task["baselines"]["majority"]["mean"]
    assert majority < 0.25  # six balanced topics, grouped folds
    for entry in (task["models"].values(), [task["baselines"]["untrained"]]):
        for scores in entry:
            assert scores["probe"]["mean"] > 0.8
    assert task["baselines"]["tfidf"]["mean"] > 0.9


def test_the_table_shows_every_row_and_the_verdict(probe_scores, trained_run):
    _, table = probe_scores
    for row in (str(trained_run), "[majority]", "[tfidf]", "[untrained]", "probe vs untrained:"):
        assert row in table
    assert " se" in table and "+/-" in table


def test_the_untrained_baseline_is_the_runs_own_initialisation(trained_run, tmp_path):
    cfg = load_config(str(trained_run / "config.yaml"),
                      [f"trainer.output_dir={tmp_path / 'again'}"])
    start = Trainer(cfg, log=lambda *a: None).model.bert.state_dict()
    encoder = load_encoder(str(trained_run))
    assert encoder.init_seed == 3
    twin = untrained_twin(encoder).model.state_dict()
    assert set(twin) == set(start)
    assert all(torch.equal(twin[k], start[k]) for k in start)
    trained = encoder.model.state_dict()
    assert not torch.equal(trained["encoder.layer.0.output.dense.weight"],
                           start["encoder.layer.0.output.dense.weight"])


def test_a_transformers_save_scores_as_the_pretextual_export(run_export, tmp_path, capsys,
                                                            topic_task):
    """The same weights, saved by transformers' save_pretrained (BertForMaskedLM: no
    pooler, so the probe only; its tokenizer through AutoTokenizer), evaluate alike."""
    transformers = pytest.importorskip("transformers")
    saved = tmp_path / "hf"
    transformers.BertForPreTraining.from_pretrained(run_export).save_pretrained(saved)
    transformers.AutoTokenizer.from_pretrained(run_export).save_pretrained(saved)
    ours, _ = evaluate(capsys, tmp_path, run_export, "--task", topic_task, "--seeds", "1",
                       "--group-column", "doc")
    theirs, _ = evaluate(capsys, tmp_path, saved, "--task", topic_task, "--seeds", "1",
                         "--group-column", "doc")
    a = ours["tasks"][str(topic_task)]
    b = theirs["tasks"][str(topic_task)]
    assert a["models"][str(run_export)] == b["models"][str(saved)]
    assert a["baselines"] == b["baselines"]


def test_finetuning_learns_the_task_and_keeps_its_seeds_apart(trained_run, tmp_path, capsys):
    train = write_rows(tmp_path / "train.csv", topic_rows(groups=96, per_group=5))
    dev = write_rows(tmp_path / "dev.csv", topic_rows(groups=12, per_group=5, seed=7))
    document, table = evaluate(capsys, tmp_path, trained_run, "--task", train, "--eval-file", dev,
                               "--protocol", "probe,finetune", "--seeds", "3",
                               "--finetune-epochs", "5", "--finetune-lr", "1e-3")
    task = document["tasks"][str(train)]
    assert task["n"] == 540
    finetuned = task["models"][str(trained_run)]["finetune"]
    majority = task["baselines"]["majority"]["mean"]
    assert len(finetuned["per_seed"]) == 3
    # Fine-tuning a 40-step encoder fails for some seeds (measured: 0.683, 0.333, 0.733, 0.717
    # over four seeds at this lr), as BERT fine-tuning does: the median over seeds, as
    # Cramming's GLUE-sane rules report it, is the score.
    assert statistics.median(finetuned["per_seed"]) > majority + 0.25  # six topics: majority 1/6
    assert len(set(finetuned["per_seed"])) > 1  # each seed its own initialisation and order
    # a fixed split: the deterministic probe and baselines are the same for every seed
    assert task["baselines"]["tfidf"]["std"] == 0.0
    assert task["models"][str(trained_run)]["probe"]["std"] == 0.0
    assert "finetune vs untrained:" in table


def test_regression_tasks_report_pearson_and_spearman(trained_run, tmp_path, capsys):
    rows = topic_rows(groups=36, per_group=5)
    for r in rows:  # a score from the words: how many "river" words the sentence has
        r["label"] = f"{sum(w.strip('.').lower() in 'water boat fish bank stream' for w in r['text'].split()) + 0.5:.1f}"
    path = write_rows(tmp_path / "scores.jsonl", rows)
    document, _ = evaluate(capsys, tmp_path, trained_run, "--task", path, "--seeds", "1",
                           "--group-column", "doc")
    task = document["tasks"][str(path)]
    assert task["metric"] == "pearson"
    tfidf = task["baselines"]["tfidf"]
    assert tfidf["mean"] > 0.4 and "spearman" in tfidf
    assert task["baselines"]["majority"]["mean"] == 0.0  # a constant prediction
