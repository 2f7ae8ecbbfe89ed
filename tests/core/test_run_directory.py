"""A run directory holds one run: a new run does not mix with an earlier one's checkpoints,
and the run's tokenizer is fixed (resume and export refuse, or do not take, another)."""

import json
import re

import pytest

from pretextual.core.checkpoint import list_checkpoints
from pretextual.core.trainer import Trainer
from pretextual.errors import CheckpointError, ConfigError
from pretextual.exporters import export_checkpoint
from run_helpers import swapped_tokenizer

QUIET = {"log": lambda *_: None}


def names(run):
    return [p.name for p in list_checkpoints(run / "checkpoints")]


def test_a_new_run_refuses_an_earlier_runs_checkpoints_unless_told_to_overwrite(tiny_config, tmp_path):
    run = tmp_path / "run"
    Trainer(tiny_config("roberta", "trainer.checkpoint_every=5", steps=10), **QUIET).train()
    assert names(run) == ["step-0000005", "step-0000010"]

    message = (f"trainer.output_dir={run}: holds the checkpoints of an earlier run (newest "
               f"step-0000010); continue it with --resume, or set trainer.overwrite_output_dir=true")
    with pytest.raises(ConfigError, match=re.escape(message)):
        Trainer(tiny_config("roberta", steps=3), **QUIET)
    assert names(run) == ["step-0000005", "step-0000010"]

    # Overwriting: the new run's own checkpoint is kept (rotation by step number used to
    # delete it for the earlier run's), and metrics.jsonl holds only the new run.
    Trainer(tiny_config("roberta", "trainer.overwrite_output_dir=true", steps=3), **QUIET).train()
    assert names(run) == ["step-0000003"]
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert max(steps) == 3


def test_resume_takes_the_runs_tokenizer_even_when_the_cache_holds_another(tiny_config, tmp_path):
    cache = tmp_path / "cache"  # this test's own: it plants a foreign tokenizer there
    Trainer(tiny_config("roberta", f"data.cache_dir={cache}", steps=3), **QUIET).train()
    run_tokenizer = (tmp_path / "run" / "tokenizer.json").read_text()
    (cached,) = cache.glob("*/tokenizer.json")
    cached.write_text(swapped_tokenizer(cached.read_text()))

    resumed = Trainer(tiny_config("roberta", f"data.cache_dir={cache}", steps=5), **QUIET,
                      resume=True)
    assert resumed.tokenizer.to_str() == run_tokenizer
    resumed.train()
    assert resumed.step == 5 and names(tmp_path / "run")[-1] == "step-0000005"
    assert (tmp_path / "run" / "tokenizer.json").read_text() == run_tokenizer


def test_resume_and_export_refuse_a_tokenizer_the_checkpoint_was_not_trained_with(tiny_config, tmp_path):
    run = tmp_path / "run"
    Trainer(tiny_config("roberta", steps=3), **QUIET).train()
    (run / "tokenizer.json").write_text(swapped_tokenizer((run / "tokenizer.json").read_text()))

    with pytest.raises(CheckpointError, match=re.escape(
            f"{run / 'checkpoints' / 'step-0000003'}: was trained with another tokenizer than "
            f"{run / 'tokenizer.json'}")):
        Trainer(tiny_config("roberta", steps=5), **QUIET, resume=True).train()
    with pytest.raises(CheckpointError, match=re.escape(
            f"{run / 'tokenizer.json'}: is not the tokenizer {run / 'checkpoints' / 'step-0000003'} "
            f"was trained with")):
        export_checkpoint(run, tmp_path / "export", "safetensors", **QUIET)
