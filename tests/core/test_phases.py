"""trainer.phases: phases of one run, each with its length, batch size, steps and peak
learning rate; metrics.jsonl says the phase; a run stopped inside phase 2 (or at the
boundary) and resumed gives the weights of an uninterrupted one; BERT's 128-then-512
recipe ships."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from pretextual.cli import main
from pretextual.core.config import load_config
from pretextual.core.trainer import Trainer
from pretextual.errors import ConfigError
from run_helpers import final_weights, tiny_overrides

PHASES = ("trainer.phases=[{steps: 6, max_seq_length: 16, batch_size: 8}, "
          "{steps: 4, max_seq_length: 32, batch_size: 4, lr: 5e-4, name: long}]")


def _train(corpus_file, cache_dir, run, *extra):
    overrides = tiny_overrides(corpus_file, cache_dir, run, 10)
    assert main(["train", "bert", *overrides, PHASES, "trainer.checkpoint_every=3",
                 "trainer.keep_checkpoints=10", *extra]) == 0
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_each_phase_trains_with_its_length_batch_and_learning_rate(corpus_file, cache_dir, tmp_path):
    records = _train(corpus_file, cache_dir, tmp_path / "run", "trainer.warmup_steps=1")
    steps = [r for r in records if "loss" in r]
    assert [r["phase"] for r in steps] == [0] * 6 + [1] * 4
    # one schedule over the 10 steps (linear decay after 1 warm-up step), scaled by each peak
    assert [round(r["lr"], 9) for r in steps] == [round(peak * f, 9) for peak, f in
                                                  [(1e-3, 1.0)] + [(1e-3, (10 - s) / 9) for s in range(1, 6)]
                                                  + [(5e-4, (10 - s) / 9) for s in range(6, 10)]]
    assert all(r["tokens"] <= 8 * 16 for r in steps[:6]) and all(r["tokens"] <= 4 * 32 for r in steps[6:])
    assert max(r["tokens"] for r in steps[6:]) > 4 * 16  # phase 2's examples are longer
    config = json.loads((tmp_path / "run" / "checkpoints" / "step-0000010" / "trainer.json")
                        .read_text())["config"]
    assert config["trainer"]["max_steps"] == 10


@pytest.mark.parametrize("resume_from", [9, 6])  # inside phase 2, and at its first step
def test_a_run_stopped_in_phase_two_resumes_to_the_same_weights(corpus_file, cache_dir, tmp_path,
                                                                  resume_from):
    _train(corpus_file, cache_dir, tmp_path / "straight")
    resumed = tmp_path / "resumed"
    _train(corpus_file, cache_dir, resumed)
    for ckpt in (resumed / "checkpoints").iterdir():
        if int(ckpt.name.split("-")[1]) > resume_from:
            shutil.rmtree(ckpt)
    records = _train(corpus_file, cache_dir, resumed, "--resume")
    a, b = final_weights(tmp_path / "straight"), final_weights(resumed)
    assert all(np.array_equal(a[k].numpy(), b[k].numpy()) for k in a)
    assert [r["phase"] for r in records if "loss" in r] == [0] * 6 + [1] * 4


def test_the_bert_128_512_recipe(corpus_file, cache_dir, tmp_path):
    cfg = load_config("bert-128-512")
    assert [(p.name, p.steps, p.max_seq_length) for p in cfg.trainer.phases] == [
        ("seq128", 900, 128), ("seq512", 100, 512)]
    short = load_config("bert-128-512", tiny_overrides(corpus_file, cache_dir, tmp_path / "run", 5)
                        + ["trainer.phases.0.steps=2", "trainer.phases.1.steps=1",
                           "trainer.phases.1.batch_size=2"])
    trainer = Trainer(short, log=lambda *_: None)
    assert trainer.train_batches[0]["input_ids"].shape[1] <= 128
    trainer.train()
    assert trainer.step == 3 and trainer.phase.name == "seq512"
    assert trainer.train_batches[0]["input_ids"].shape[0] == 2


@pytest.mark.parametrize("override, message", [
    ("trainer.phases=[{steps: 0}]", "trainer.phases[0].steps must be positive, got 0"),
    ("trainer.phases=[{steps: 5, max_seq_length: 1024}]",
     "trainer.phases[0].max_seq_length=1024: must be at least 8 and at most "
     "model.max_position_embeddings=512"),
])
def test_bad_phases_are_one_line(override, message):
    with pytest.raises(ConfigError) as error:
        load_config("bert", [override])
    assert str(error.value) == message
    with pytest.raises(ConfigError, match="^trainer.phases: each phase has its steps"):
        load_config("bert", ["trainer.phases=[{steps: 5}]", "trainer.max_tokens=100"])


def test_a_run_killed_during_phase_two_resumes_to_the_weights_of_an_uninterrupted_one(
        corpus_file, cache_dir, tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    phases = ("trainer.phases=[{steps: 6, max_seq_length: 16, batch_size: 8}, "
              "{steps: 16, max_seq_length: 32, batch_size: 4}]")

    def command(run, *extra):
        return [sys.executable, "-m", "pretextual", "train", "bert",
                *tiny_overrides(corpus_file, cache_dir, run, 22), phases,
                "trainer.checkpoint_every=2", *extra]

    subprocess.run(command(tmp_path / "straight"), check=True, capture_output=True, env=env,
                   timeout=300)
    killed = tmp_path / "killed"
    proc = subprocess.Popen(command(killed), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=env)
    metrics, deadline = killed / "metrics.jsonl", time.time() + 240
    while (not metrics.exists() or sum('"phase": 1' in line and '"loss"' in line
                                       for line in metrics.read_text().splitlines()) < 3) \
            and proc.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert '"step": 22' not in metrics.read_text(), "the run finished before it could be killed"
    resumed = subprocess.run(command(killed, "--resume"), capture_output=True, text=True, env=env,
                             timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "resumed from" in resumed.stdout and "phase 2/2" in resumed.stdout
    a, b = final_weights(tmp_path / "straight"), final_weights(killed)
    assert all(np.array_equal(a[k].numpy(), b[k].numpy()) for k in a)
