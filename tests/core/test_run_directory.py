"""A run directory holds one run: one process writes it at a time, a new run does not mix
with an earlier one's checkpoints nor with files that are not a run's, and the run's
tokenizer is fixed (resume and export refuse, or do not take, another)."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

from pretextual.core.checkpoint import list_checkpoints
from pretextual.core.trainer import Trainer
from pretextual.errors import CheckpointError, ConfigError
from pretextual.exporters import export_checkpoint
from run_helpers import swapped_tokenizer, tiny_overrides

QUIET = {"log": lambda *_: None}


def names(run):
    return [p.name for p in list_checkpoints(run / "checkpoints")]


def test_a_new_run_refuses_an_earlier_runs_checkpoints_unless_told_to_overwrite(tiny_config, tmp_path):
    run = tmp_path / "run"
    Trainer(tiny_config("roberta", "trainer.checkpoint_every=5", steps=10), **QUIET).train()
    assert names(run) == ["step-0000005", "step-0000010"]

    message = (f"trainer.output_dir={run}: holds the checkpoints of an earlier run (newest "
               f"step-0000010); continue it with --resume, choose another trainer.output_dir, or set "
               f"trainer.overwrite_output_dir=true")
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


def test_a_directory_that_is_not_a_run_is_refused_and_kept_unless_told_to_overwrite(tiny_config, tmp_path):
    run = tmp_path / "run"  # as transformers' save_pretrained leaves it
    run.mkdir()
    mine = {"config.json": b'{"model_type": "bert"}', "tokenizer.json": b'{"version": "1.0"}',
            "model.safetensors": b"weights"}
    for name, data in mine.items():
        (run / name).write_bytes(data)
    message = (f"trainer.output_dir={run}: holds files that are not a pretextual run's (config.json, "
               f"model.safetensors, tokenizer.json); choose another trainer.output_dir, or set "
               f"trainer.overwrite_output_dir=true to train there anyway (a run writes config.yaml, "
               f"tokenizer.json, checkpoints, metrics.jsonl, export, metrics.png and replaces "
               f"whatever has those names; it deletes nothing else)")
    with pytest.raises(ConfigError, match=re.escape(message)):
        Trainer(tiny_config("roberta", steps=2), **QUIET)
    assert {p.name: p.read_bytes() for p in run.iterdir()} == mine

    # Told to: the run is written beside them, and nothing it does not write is touched.
    Trainer(tiny_config("roberta", "trainer.overwrite_output_dir=true", steps=2), **QUIET).train()
    assert (run / "config.json").read_bytes() == mine["config.json"]
    assert (run / "model.safetensors").read_bytes() == mine["model.safetensors"]
    assert names(run) == ["step-0000002"]
    # From now on it is a run's directory: --resume continues it without the flag.
    Trainer(tiny_config("roberta", steps=3), **QUIET, resume=True).train()
    assert names(run)[-1] == "step-0000003"


def _wait_for(predicate, proc, what, timeout=240):
    deadline = time.time() + timeout
    while not predicate():
        assert proc.poll() is None, f"the first run ended before {what}"
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_a_second_process_cannot_write_a_run_directory_in_use_and_kill_9_leaves_no_lock(
        corpus_file, cache_dir, tmp_path):
    run = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "pretextual", "train", "roberta",
           *tiny_overrides(corpus_file, cache_dir, run, steps=100_000), "trainer.checkpoint_every=5"]
    first = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        _wait_for(lambda: (run / "checkpoints" / "step-0000005").is_dir(), first, "its first checkpoint")
        message = (f"pretextual: error: trainer.output_dir={run}: another process (pid {first.pid}) is "
                   f"training in it; wait for it to end or choose another trainer.output_dir")
        for extra in ([], ["--resume"], ["trainer.overwrite_output_dir=true"]):
            second = subprocess.run(cmd + extra, capture_output=True, text=True, env=env, timeout=300)
            assert second.returncode == 2, second.stderr[-2000:]
            assert second.stderr.strip().splitlines()[-1] == message, extra
        config = (run / "config.yaml").read_text()
        assert first.poll() is None  # the first run trains on, untouched
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    assert (run / "config.yaml").read_text() == config
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == sorted(set(steps))  # one writer: no step twice

    # The system released the lock of the killed process: a resume takes the directory.
    resumed = subprocess.run(cmd[:-2] + ["trainer.max_steps=" + str(int(names(run)[-1][5:]) + 1),
                                         "--resume"], capture_output=True, text=True, env=env, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "resumed from" in resumed.stdout


def test_a_filesystem_without_locks_trains_and_says_the_run_is_unprotected(tiny_config, tmp_path,
                                                                           monkeypatch):
    import errno
    import fcntl

    def no_locks(fd, operation):  # what flock does on a mount without lock support
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(fcntl, "flock", no_locks)
    messages = []
    Trainer(tiny_config("roberta", steps=2), log=messages.append).train()
    assert (f"warning: trainer.output_dir={tmp_path / 'run'}: cannot lock it (No locks available); "
            f"make sure no other run writes there") in messages
    assert names(tmp_path / "run") == ["step-0000002"]
