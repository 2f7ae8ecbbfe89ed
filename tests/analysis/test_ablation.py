"""pretextual ablate: two mixes on one tiny budget of tokens give a report with a row per
mix, every run probed on the same held-out data; the report's numbers and its errors."""

import json

import pytest
import torch

from analysis_helpers import png_size, read_lines
from pretextual.analysis.ablate import Ablation, AblationError, RunResult, ablate, parse_mixes
from pretextual.analysis.plot import matplotlib_installed
from pretextual.analysis.report import mix_rows
from pretextual.cli import main
from pretextual.core.trainer import Trainer
from run_helpers import tiny_overrides, write_topic_task

PROBES = ("mlm_loss", "mlm_accuracy", "pair_cls_accuracy", "pair_mean_accuracy")


def overrides(corpus_file, cache_dir, tmp_path) -> list[str]:
    """The tiny run's overrides, less the keys ablate sets itself."""
    return [o for o in tiny_overrides(corpus_file, cache_dir, tmp_path / "unused")
            if not o.startswith(("trainer.output_dir=", "trainer.max_steps="))] + \
        ["data.eval_fraction=0.2"]


def test_two_mixes_on_one_budget_give_a_report_with_both_rows(corpus_file, cache_dir, tmp_path,
                                                              capsys):
    out = tmp_path / "ablation"
    assert main(["ablate", "--mixes", "bert,roberta", "--steps", "3", "--out", str(out),
                 *overrides(corpus_file, cache_dir, tmp_path)]) == 0
    assert f"report: {out / 'report.md'}" in capsys.readouterr().out

    results = json.loads((out / "report.json").read_text())
    assert results["mixes"] == ["bert", "roberta"]
    assert results["budget"] == int(3 * min(results["tokens_per_step"].values()))
    runs = {r["mix"]: r for r in results["runs"]}
    assert list(runs) == ["untrained", "bert", "roberta"]
    for mix in ("bert", "roberta"):
        run = runs[mix]
        # Stopped at the first step whose tokens reach the budget (trainer.max_tokens).
        lines = read_lines(out / run["run_dir"])
        tokens = [l["tokens"] for l in lines if "loss" in l]
        assert sum(tokens) == run["tokens"] and len(tokens) == run["steps"]
        assert sum(tokens[:-1]) < results["budget"] <= run["tokens"]
        assert json.loads((out / run["run_dir"] / "probes.json").read_text()) == run["probes"]
        assert all(isinstance(run["probes"][k], float) for k in PROBES)
    # Training moved the MLM probe off the untrained encoder's.
    assert runs["roberta"]["probes"]["mlm_loss"] < runs["untrained"]["probes"]["mlm_loss"]

    report = (out / "report.md").read_text()
    rows = [l for l in report.splitlines() if l.startswith("| ") and not l.startswith("| ---")]
    assert [r.split(" | ")[0] for r in rows[:4]] == ["| mix", "| untrained", "| bert", "| roberta"]
    assert f"pretextual ablate --mixes bert,roberta --steps 3 --seeds 1 --out {out}" in report
    assert f"| `runs/bert-seed0` | {runs['bert']['steps']} | {runs['bert']['tokens']:,} |" in report
    if matplotlib_installed():
        assert png_size(out / "probes.png") == (900, 600)
        assert png_size(out / "curves.png")[0] <= 1900  # fits a screen
        assert "![probes](probes.png)" in report
    else:
        assert "No plots: they need matplotlib" in report


def test_every_mix_starts_from_the_encoder_the_untrained_row_probes(tiny_config):
    bert, spanbert = (Trainer(tiny_config(recipe), log=lambda *_: None).model.bert.state_dict()
                      for recipe in ("bert", "spanbert"))
    assert all(torch.equal(bert[k], spanbert[k]) for k in bert)


def result(mix: str, seed: int, accuracy: float) -> RunResult:
    probes = {"mlm_loss": None, "mlm_accuracy": None, "pair_cls_accuracy": accuracy,
              "pair_mean_accuracy": accuracy}
    return RunResult(mix, seed, f"runs/{mix}-seed{seed}", 10, 1000 + seed, 2.0, probes)


def test_the_mix_table_gives_mean_and_spread_over_seeds_and_n_a_without_mlm():
    ablation = Ablation(["sop"], 10, 2, [], 1000, {"sop": 100.0}, "",
                        [result("sop", 0, 0.6), result("sop", 1, 0.7)])
    header, row = mix_rows(ablation)
    assert dict(zip(header, row)) == {
        "mix": "sop", "seeds": "2", "steps": "10", "tokens": "1,000", "wall time (s)": "2.0",
        "held-out MLM loss": "n/a", "held-out MLM accuracy": "n/a",
        "pair probe, [CLS]": "0.650 ± 0.071", "pair probe, mean-pooled": "0.650 ± 0.071"}


@pytest.mark.parametrize("call, message", [
    (lambda out: ablate(["roberta"], out, overrides=["trainer.seed=3"]),
     "trainer.seed: set by ablate for each run"),
    (lambda out: ablate(["roberta"], out, steps=0), "--steps and --seeds must be positive"),
    (lambda out: parse_mixes(" , "), "--mixes: no mix given"),
    (lambda out: parse_mixes("bert,x/bert.yaml"), "--mixes: a mix is named twice"),
])
def test_settings_ablate_cannot_honour_are_one_clear_error(tmp_path, call, message):
    with pytest.raises(AblationError, match=message):
        call(tmp_path)


def test_plugins_named_by_the_config_reach_every_run(corpus_file, cache_dir, tmp_path, monkeypatch):
    """plugins.modules given to ablate load in each of its runs, as in pretextual train."""
    steps_file = tmp_path / "steps.txt"
    (tmp_path / "step_recorder.py").write_text(
        "import pretextual\n\n"
        "@pretextual.hookimpl\n"
        "def pretextual_on_step_end(step, metrics, trainer):\n"
        f"    with open({str(steps_file)!r}, 'a') as f:\n"
        "        f.write(f'{trainer.cfg.trainer.seed} {step}\\n')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    ablate(["roberta"], tmp_path / "ablation", steps=2, seeds=2, log=lambda *_: None,
           overrides=overrides(corpus_file, cache_dir, tmp_path) + ["plugins.modules=[step_recorder]"])
    runs = steps_file.read_text().split("\n")[:-1]
    assert {line.split()[0] for line in runs} == {"0", "1"} and len(runs) >= 4


def test_running_it_again_into_the_same_out_replaces_its_runs(corpus_file, cache_dir, tmp_path):
    args = dict(steps=2, log=lambda *_: None, overrides=overrides(corpus_file, cache_dir, tmp_path))
    ablate(["roberta"], tmp_path / "ablation", **args)
    again = ablate(["roberta"], tmp_path / "ablation", **args)  # its runs' checkpoints are its own
    assert [r.mix for r in again.runs if r.steps] == ["roberta"]


def test_mixes_scored_downstream_with_each_pair_in_words(corpus_file, cache_dir, tmp_path, capsys):
    task = write_topic_task(tmp_path / "topics.jsonl")
    out = tmp_path / "ablation"
    assert main(["ablate", "--mixes", "bert,roberta", "--steps", "3", "--seeds", "2", "--out",
                 str(out), "--task", str(task), *overrides(corpus_file, cache_dir, tmp_path)]) == 0
    results = json.loads((out / "report.json").read_text())
    scores = results["downstream"]["tasks"][str(task)]
    assert len(scores["models"]) == 4  # two mixes x two seeds, the same folds for all
    assert {"untrained", "majority", "tfidf"} <= set(scores["baselines"])
    differences = results["mix_differences"]
    assert [(d["a"], d["b"], d["protocol"]) for d in differences] == [("bert", "roberta", "probe")]
    from pretextual.evaluation.report import verdict
    assert differences[0]["verdict"] == verdict(differences[0]["difference"], differences[0]["se"])
    report = (out / "report.md").read_text()
    assert "## Downstream" in report
    assert f"- {task} (probe): bert - roberta = " in report and " se" in report
    assert f"--task {task} --protocol probe" in report
