"""torchrun with 2 processes (gloo) trains the same as one process with the same global batch."""

import json
import os
import subprocess
import sys

import pytest
from safetensors.torch import load_file

from run_helpers import tiny_overrides


def step_losses(run_dir):
    lines = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [l["loss"] for l in lines if "loss/mlm" in l]


def run(cmd, env=None):
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def test_two_processes_match_one_process_with_the_same_global_batch(corpus_file, cache_dir, tmp_path):
    # Dropout off: each process has its own dropout stream, the data and gradients are what's compared.
    common = tiny_overrides(corpus_file, cache_dir, tmp_path / "x", steps=6) + [
        "model.hidden_dropout_prob=0", "model.attention_probs_dropout_prob=0", "data.batch_size=4"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
         "--master_port", "29517", "-m", "pretextual", "train", "roberta", *common,
         f"trainer.output_dir={tmp_path / 'two'}"], env)
    one = run([sys.executable, "-m", "pretextual", "train", "roberta", *common,
               "trainer.grad_accum_steps=2", f"trainer.output_dir={tmp_path / 'one'}"], env)
    assert "global batch 8 = 4 x 1 processes x 2 accumulation" in one.stdout
    a, b = step_losses(tmp_path / "one"), step_losses(tmp_path / "two")
    assert len(a) == len(b) == 6
    assert max(abs(x - y) for x, y in zip(a, b)) < 1e-5
    wa = load_file(str(tmp_path / "one" / "checkpoints" / "step-0000006" / "model.safetensors"))
    wb = load_file(str(tmp_path / "two" / "checkpoints" / "step-0000006" / "model.safetensors"))
    assert max(float((wa[k] - wb[k]).abs().max()) for k in wa) < 1e-5
