"""torchrun with 2 processes (gloo) trains the same as one process with the same global batch,
with DDP or FSDP2, and a run resumes with a different number of processes."""

import json
import os
import shutil
import subprocess
import sys

import pytest
from safetensors.torch import load_file

from run_helpers import tiny_overrides

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def step_losses(run_dir):
    lines = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [l["loss"] for l in lines if "loss/mlm" in l]


def final_weights(run_dir):
    return load_file(str(run_dir / "checkpoints" / "step-0000006" / "model.safetensors"))


def run(args, processes=1, port=29517):
    launcher = [sys.executable, "-m", "pretextual"] if processes == 1 else [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(processes),
        "--master_port", str(port), "-m", "pretextual"]
    result = subprocess.run(launcher + args, capture_output=True, text=True, timeout=600, env=ENV)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


@pytest.fixture(scope="module")
def single(corpus_file, cache_dir, tmp_path_factory):
    """The reference: one process, micro-batch 4 x 2 accumulation steps = global batch 8."""
    out = tmp_path_factory.mktemp("single")
    args = common(corpus_file, cache_dir)
    result = run(["train", "roberta", *args, "trainer.grad_accum_steps=2", f"trainer.output_dir={out}"])
    assert "global batch 8 = 4 x 1 processes x 2 accumulation" in result.stdout
    return out


def common(corpus_file, cache_dir):
    # Dropout off: each process has its own dropout stream; data and gradients are what's compared.
    return tiny_overrides(corpus_file, cache_dir, "unused", steps=6) + [
        "model.hidden_dropout_prob=0", "model.attention_probs_dropout_prob=0", "data.batch_size=4",
        "trainer.checkpoint_every=3", "trainer.keep_checkpoints=3"]


def assert_same_run(a, b):
    la, lb = step_losses(a), step_losses(b)
    assert len(la) == len(lb) == 6
    assert max(abs(x - y) for x, y in zip(la, lb)) < 1e-5
    wa, wb = final_weights(a), final_weights(b)
    assert wa.keys() == wb.keys()
    assert max(float((wa[k] - wb[k]).abs().max()) for k in wa) < 1e-5


@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_two_processes_match_one(mode, single, corpus_file, cache_dir, tmp_path):
    result = run(["train", "roberta", *common(corpus_file, cache_dir), f"trainer.fsdp={mode == 'fsdp'}",
                  f"trainer.output_dir={tmp_path}"], processes=2, port=29517 + (mode == "fsdp"))
    assert "global batch 8 = 4 x 2 processes x 1 accumulation" in result.stdout
    assert result.stdout.count("run directory:") == 1  # only rank 0 reports and writes
    assert_same_run(single, tmp_path)


def test_resume_with_a_different_world_size(single, corpus_file, cache_dir, tmp_path):
    run(["train", "roberta", *common(corpus_file, cache_dir), f"trainer.output_dir={tmp_path}"],
        processes=2, port=29519)
    shutil.rmtree(tmp_path / "checkpoints" / "step-0000006")  # as if stopped after step 3's checkpoint
    result = run(["train", "roberta", *common(corpus_file, cache_dir), "trainer.grad_accum_steps=2",
                  f"trainer.output_dir={tmp_path}", "--resume"])
    assert "resumed from" in result.stdout and "step-0000003" in result.stdout
    assert_same_run(single, tmp_path)
