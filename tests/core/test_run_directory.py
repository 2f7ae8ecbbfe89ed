"""A run directory holds one run: a new run does not mix with an earlier one's checkpoints,
and the run's tokenizer is fixed (resume and export refuse, or do not take, another)."""

import json
import re
import shutil

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
    (run / "metrics.png").write_bytes(b"the earlier run's plot")
    Trainer(tiny_config("roberta", "trainer.overwrite_output_dir=true", steps=3), **QUIET).train()
    assert names(run) == ["step-0000003"] and not (run / "metrics.png").exists()
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

    refused = re.escape(f"{run / 'tokenizer.json'}: is not the tokenizer "
                        f"{run / 'checkpoints' / 'step-0000003'} was trained with")
    with pytest.raises(CheckpointError, match=refused):
        Trainer(tiny_config("roberta", steps=5), **QUIET, resume=True).train()
    with pytest.raises(CheckpointError, match=refused):
        export_checkpoint(run, tmp_path / "export", "safetensors", **QUIET)


def test_an_earlier_export_is_kept_without_checkpoints_and_on_a_resume_that_finds_none(
        tiny_config, tmp_path):
    run = tmp_path / "run"
    Trainer(tiny_config("roberta", "trainer.export=safetensors", steps=3), **QUIET).train()
    shutil.rmtree(run / "checkpoints")
    model = (run / "export" / "model.safetensors").read_bytes()
    for resume in (False, True):
        with pytest.raises(ConfigError, match=re.escape(f"trainer.output_dir={run}: holds an "
                                                        f"earlier run's export/; continue it")):
            Trainer(tiny_config("roberta", steps=3), **QUIET, resume=resume)
    assert (run / "export" / "model.safetensors").read_bytes() == model


def test_resume_where_no_checkpoint_verifies_stops_and_deletes_nothing(tiny_config, tmp_path):
    run = tmp_path / "run"
    Trainer(tiny_config("roberta", "trainer.checkpoint_every=2", steps=4), **QUIET).train()
    for ckpt in list_checkpoints(run / "checkpoints"):
        with open(ckpt / "model.safetensors", "ab") as f:
            f.write(b"junk")  # as a half-finished copy leaves it
    trainer = Trainer(tiny_config("roberta", steps=6), **QUIET, resume=True)
    with pytest.raises(CheckpointError, match=re.escape(
            f"{run / 'checkpoints'}: none of its 2 checkpoints verifies")):
        trainer.train()
    assert names(run) == ["step-0000002", "step-0000004"]


def test_a_foreign_run_tokenizer_is_refused_before_it_tokenizes_or_touches_the_cache(
        tiny_config, tmp_path):
    cache = tmp_path / "cache"
    Trainer(tiny_config("roberta", f"data.cache_dir={cache}", steps=3), **QUIET).train()
    cached = {f: f.read_bytes() for f in cache.rglob("*") if f.is_file()}
    run_file = tmp_path / "run" / "tokenizer.json"
    run_file.write_text(swapped_tokenizer(run_file.read_text()))
    with pytest.raises(CheckpointError, match=re.escape(f"{run_file}: is not the tokenizer")):
        Trainer(tiny_config("roberta", f"data.cache_dir={cache}", steps=5), **QUIET, resume=True)
    assert {f: f.read_bytes() for f in cache.rglob("*") if f.is_file()} == cached
