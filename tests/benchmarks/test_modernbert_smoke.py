"""The ModernBERT and document-attention comparisons run (`--smoke --only modernbert,attention`),
and their FLOP count matches the model's parameters. No timing is asserted."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import flops as F  # noqa: E402
from benchmarks.attention import dense_mask, document_ids  # noqa: E402


def test_smoke_run_writes_the_modernbert_and_attention_rows(tmp_path):
    pytest.importorskip("transformers")
    out = tmp_path / "benchmarks.md"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    result = subprocess.run([sys.executable, "-m", "benchmarks", "--smoke", "--only",
                             "modernbert,attention", "--out", str(out)],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    text = out.read_text(encoding="utf-8")
    for row in ("ModernBERT training step, fp32, against transformers' default",
                "ModernBERT training step, bf16 (bf16 autocast on both sides), against "
                "transformers with sparse_prediction=True", "FLOP-ratio ceiling 1.00x",
                "ModernBERT model FLOP utilisation, fp32",
                "document attention, forward, batch 4 x 4 heads x 64 x 64",
                "FlexAttention (eager) against SDPA", "forward + backward",
                "building the mask from document ids"):
        assert row in text, row


def test_modernbert_flops_count_the_models_parameters():
    from pretextual.architectures import architecture, sized_config

    spec = architecture("modernbert")
    config = sized_config(spec, "mini", {}, {}, vocab_size=1000, pad_token_id=0)
    model = spec.model(config)
    layers = sum(p.numel() for p in model.layers.parameters())
    counted = config.num_hidden_layers * F.modernbert_layer_parameters(config.hidden_size,
                                                                       config.intermediate_size)
    assert counted - layers == config.hidden_size  # layer 0 has no attn_norm
    assert F.attended_keys(8, None) == 64 and F.attended_keys(8, 1) == 8 + 2 * 7
    full = F.ModernBertStepWork(2, 64, 96, 1000, (32,), 32, global_every=1)
    local = F.ModernBertStepWork(2, 64, 96, 1000, (32,), 32, global_every=2, local_attention=8)
    assert local.flops() < full.flops()


def test_documents_split_each_row_and_the_mask_keeps_them_apart():
    docs = document_ids(3, 40, 4)
    assert all(len(torch.unique(row)) == 4 for row in docs)
    mask = dense_mask(docs)
    assert mask.shape == (3, 1, 40, 40)
    assert torch.equal(mask[:, 0], docs[:, :, None] == docs[:, None, :])
