"""What `pretextual train` prints: the data and objectives lines, plain progress lines when
output is not a terminal, one line per evaluation, and the closing summary."""

import json
import re
import sys

from pretextual.cli import main
from pretextual.core.console import count, duration, metrics_text
from run_helpers import tiny_overrides


def _train(corpus_file, cache_dir, tmp_path, capsys, *extra, steps=6):
    out = tmp_path / "run"
    overrides = [o for o in tiny_overrides(corpus_file, cache_dir, out, steps=steps)
                 if not o.startswith("trainer.progress=")]
    assert main(["train", "bert", *overrides, *extra]) == 0
    captured = capsys.readouterr()
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return captured, records, out


def test_output_to_a_file_has_plain_progress_lines_eval_lines_and_a_summary(
        corpus_file, cache_dir, tmp_path, capsys):
    (out, err), records, run = _train(corpus_file, cache_dir, tmp_path, capsys,
                                      "trainer.print_every=2", "trainer.eval_every=3",
                                      "trainer.export=safetensors")
    assert "\r" not in out + err  # no progress bar redrawn in a log file
    steps = {r["step"]: r for r in records if "loss" in r}
    evals = {r["step"]: r for r in records if "eval/loss" in r}
    progress = re.findall(r"^step (\d+)/6 \(\d+%\) \| loss (\S+) \|.* \| lr (\S+) \|", out, re.M)
    assert [(int(s), float(loss), float(lr)) for s, loss, lr in progress] == [
        (s, float(f"{steps[s]['loss']:.4g}"), float(f"{steps[s]['lr']:.3g}")) for s in (2, 4, 6)]
    lines = out.splitlines()
    for step in (3, 6):
        line = f"eval step {step}: {metrics_text(evals[step], 'eval/')}"
        assert line in lines
        assert f"mlm: loss {evals[step]['eval/loss/mlm']:.4g} accuracy " in line
    tokens = sum(r["tokens"] for r in steps.values())
    summary = next(i for i, line in enumerate(lines) if line.startswith("trained steps 0-6: "))
    assert lines[summary].startswith(f"trained steps 0-6: {count(tokens)} tokens in 0:00:")
    assert lines[summary + 1] == f"held-out: {metrics_text(evals[6], 'eval/')}"
    assert lines[summary + 2] == (
        f"export: {run / 'export'} (BertForPreTraining); in transformers: "
        f"AutoModelForMaskedLM.from_pretrained('{run / 'export'}') and AutoTokenizer likewise")


def test_the_start_lines_show_the_data_read_and_each_weight_schedule(
        corpus_file, cache_dir, tmp_path, capsys):
    (out, _), _, _ = _train(corpus_file, cache_dir, tmp_path, capsys,
                            "objectives.nsp.schedule=linear", "objectives.nsp.start_weight=0",
                            "objectives.nsp.weight=0.5", "objectives.nsp.schedule_steps=4",
                            "trainer.progress=false")
    assert "objectives: mlm (weight 1), nsp (weight 0 -> 0.5 linearly over steps 0-4) |" in out
    found = re.search(r"^training data: (\d+) documents, ([\d,]+) tokens \| 6 steps x 8 examples "
                      r"x up to 32 tokens = up to ([\d,]+) tokens, about (\S+) epochs$", out, re.M)
    documents, tokens = int(found.group(1)), int(found.group(2).replace(",", ""))
    assert documents == 57  # the corpus's 60 documents less the 5% held out (at least 3)
    assert int(found.group(3).replace(",", "")) == 6 * 8 * 32
    assert float(found.group(4)) == float(f"{6 * 8 * 32 / tokens:.3g}")


def test_on_a_terminal_the_bar_is_drawn_and_the_plain_lines_are_not(
        corpus_file, cache_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    (out, err), _, _ = _train(corpus_file, cache_dir, tmp_path, capsys, "trainer.print_every=2")
    assert "\r" in err and "6/6" in err  # tqdm's bar, redrawn in place
    assert not re.search(r"^step \d+/6", out, re.M)


def test_counts_and_durations_read_at_a_glance():
    assert [count(n) for n in (999, 1234, 4_100_000, 2.5e9)] == ["999", "1,234", "4.1M", "2.5B"]
    assert [duration(s) for s in (0, 59.6, 3725)] == ["0:00:00", "0:01:00", "1:02:05"]
