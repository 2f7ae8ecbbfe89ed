"""Crash safety: a run killed with SIGKILL at random moments resumes to bit-identical weights;
non-finite losses stop with a clear message; a pickle posing as a checkpoint never runs."""

import json
import math
import os
import pickle
import random
import signal
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file

from pretextual.core.checkpoint import list_checkpoints
from pretextual.core.trainer import Trainer
from pretextual.errors import CheckpointError, TrainingError
from run_helpers import tiny_overrides

STEPS = 30


def train_cmd(overrides, *extra):
    return [sys.executable, "-m", "pretextual", "train", "roberta", *overrides, *extra]


def weights(run_dir):
    return load_file(str(list_checkpoints(run_dir / "checkpoints")[-1] / "model.safetensors"))


def steps_logged(run_dir):
    path = run_dir / "metrics.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_sigkill_at_random_moments_then_resume_is_bit_identical(corpus_file, cache_dir, tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    common = lambda out: tiny_overrides(corpus_file, cache_dir, out, steps=STEPS) + [
        "trainer.checkpoint_every=2", "trainer.keep_checkpoints=2"]
    straight = tmp_path / "straight"
    subprocess.run(train_cmd(common(straight)), check=True, capture_output=True, env=env, timeout=300)

    rng = random.Random(7)
    for kill_after in (3, 11, 19):  # steps logged before the kill (a checkpoint exists), plus a random delay
        run = tmp_path / f"killed-{kill_after}"
        proc = subprocess.Popen(train_cmd(common(run)), stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, env=env)
        deadline = time.time() + 240
        while steps_logged(run) < kill_after and proc.poll() is None and time.time() < deadline:
            time.sleep(0.02)
        time.sleep(rng.uniform(0, 0.2))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert steps_logged(run) < STEPS, "the run finished before it could be killed"
        resumed = subprocess.run(train_cmd(common(run), "--resume"), capture_output=True, text=True,
                                 env=env, timeout=300)
        assert resumed.returncode == 0, resumed.stderr[-2000:]
        assert "resumed from" in resumed.stdout
        a, b = weights(straight), weights(run)
        assert all((a[k] == b[k]).all() for k in a), f"weights differ after a kill at {kill_after}"
        losses = lambda d: [json.loads(l)["loss"] for l in (d / "metrics.jsonl").read_text().splitlines()
                            if "loss/mlm" in json.loads(l)]
        assert losses(run) == losses(straight)
        assert not list((run / "checkpoints").glob(".tmp-*"))


def poison(trainer, call: int | None, value: float) -> None:
    """Make the first objective's loss non-finite on its ``call``-th call (every call: None)."""
    objective = trainer.mix.selected[0].objective
    real_loss, calls = objective.loss, {"n": 0}

    def poisoned(inputs):
        calls["n"] += 1
        out = real_loss(inputs)
        if call is None or calls["n"] == call:
            out.loss = out.loss * value
        return out

    objective.loss = poisoned


def test_nonfinite_loss_stops_naming_step_and_objective(tiny_config, tmp_path):
    cfg = tiny_config("roberta", "trainer.checkpoint_every=2", steps=6)
    trainer = Trainer(cfg, log=lambda *_: None)
    poison(trainer, 3, float("nan"))
    with pytest.raises(TrainingError, match=r"step 3: non-finite loss in loss/mlm; stopped, the last "
                                             r"good checkpoint .*step-0000002 is kept"):
        trainer.train()
    assert [p.name for p in list_checkpoints(tmp_path / "run" / "checkpoints")] == ["step-0000002"]


def test_nonfinite_loss_before_any_checkpoint_says_so(tiny_config, tmp_path):
    trainer = Trainer(tiny_config("roberta", steps=6), log=lambda *_: None)
    poison(trainer, 1, float("inf"))
    with pytest.raises(TrainingError, match=r"step 1: non-finite loss in loss/mlm; stopped, no "
                                             r"checkpoint had been written yet"):
        trainer.train()


def test_nonfinite_loss_can_skip_the_batch(tiny_config, tmp_path):
    cfg = tiny_config("roberta", "trainer.nonfinite=skip", steps=5)
    messages = []
    trainer = Trainer(cfg, log=messages.append)
    poison(trainer, 2, float("inf"))
    trainer.train()
    lines = [json.loads(l) for l in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [l.get("skipped", 0) for l in lines if "loss/mlm" in l] == [0, 1, 0, 0, 0]
    assert any("step 2: non-finite loss" in m and "skipped" in m for m in messages)
    assert all(v.isfinite().all() for v in weights(tmp_path / "run").values())


def test_a_loss_that_is_always_nan_stops_after_a_bounded_run_of_skips_and_saves_nothing(
        tiny_config, tmp_path):
    cfg = tiny_config("roberta", "trainer.nonfinite=skip", "trainer.max_skipped_steps=3",
                      "trainer.checkpoint_every=2", steps=10)
    trainer = Trainer(cfg, log=(messages := []).append)
    poison(trainer, None, float("nan"))
    with pytest.raises(TrainingError, match=r"^step 4: non-finite loss in loss/mlm; stopped after 4 "
                                             r"skipped steps in a row \(trainer.max_skipped_steps=3\)"):
        trainer.train()
    assert "warning: step 2: no checkpoint written, every step so far was skipped " \
           "(trainer.nonfinite=skip)" in messages
    assert list_checkpoints(tmp_path / "run" / "checkpoints") == []

    # A run shorter than the bound that skips every step ends in an error, not untrained weights.
    short = Trainer(tiny_config("roberta", "trainer.nonfinite=skip", "trainer.overwrite_output_dir=true",
                                steps=3), log=lambda *_: None)
    poison(short, None, float("nan"))
    with pytest.raises(TrainingError, match=r"^step 3: every step of the run was skipped"):
        short.train()
    assert list_checkpoints(tmp_path / "run" / "checkpoints") == []

    # Skips that end: the run trains on, and the bound counts only skips in a row.
    recovering = Trainer(tiny_config("roberta", "trainer.nonfinite=skip", "trainer.max_skipped_steps=1",
                                     "trainer.overwrite_output_dir=true", steps=6), log=lambda *_: None)
    poison(recovering, 1, float("nan"))
    poison(recovering, 3, float("nan"))
    recovering.train()
    assert [p.name for p in list_checkpoints(tmp_path / "run" / "checkpoints")][-1] == "step-0000006"


class _Exploit:
    def __reduce__(self):
        return (os.system, (f"touch {_Exploit.marker}",))


def test_a_pickle_posing_as_a_checkpoint_is_refused_without_running(tiny_config, tmp_path):
    cfg = tiny_config("roberta", steps=2)
    Trainer(cfg, log=lambda *_: None).train()
    ckpt = list_checkpoints(tmp_path / "run" / "checkpoints")[-1]
    _Exploit.marker = tmp_path / "pwned"
    payload = pickle.dumps({"weights": _Exploit()})
    for name in ("model.safetensors", "optimizer.safetensors"):
        (ckpt / name).write_bytes(payload)
    # An attacker can also fix up the checksums: the file must still not be unpickled.
    import hashlib
    meta = json.loads((ckpt / "trainer.json").read_text())
    meta["sha256"] = {n: hashlib.sha256(payload).hexdigest() for n in meta["sha256"]}
    from pretextual.core.checkpoint import META_CHECKSUM, meta_checksum, open_checkpoint
    meta[META_CHECKSUM] = meta_checksum(meta)
    (ckpt / "trainer.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="model.safetensors: not a safetensors file"):
        open_checkpoint(ckpt)
    with pytest.raises(CheckpointError, match="none of its 1 checkpoints verifies"):
        Trainer(cfg, log=lambda *_: None, resume=True).resume()
    assert not _Exploit.marker.exists()


def test_a_non_finite_evaluation_is_a_warning(tiny_config, tmp_path):
    trainer = Trainer(tiny_config("roberta", steps=3), log=(messages := []).append)
    objective = trainer.mix.selected[0].objective
    real_loss = objective.loss

    def nan_in_evaluation(inputs):
        out = real_loss(inputs)
        if not torch.is_grad_enabled():  # the evaluation runs under no_grad
            out.loss = out.loss * float("nan")
        return out

    objective.loss = nan_in_evaluation
    final = trainer.train()
    assert math.isnan(final["eval/loss/mlm"])
    assert "warning: step 3: the evaluation gave non-finite eval/loss, eval/loss/mlm" in messages
