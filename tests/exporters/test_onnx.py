"""The ONNX export through onnxruntime: named int64 inputs with dynamic axes, a pinned
opset, the same outputs as torch at other shapes with padding, int8 measured."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from export_helpers import TEXTS_A, TEXTS_B, padded_batch, reference_model, run_tokenizer
from pretextual.exporters import onnx as onnx_exporter
from pretextual.exporters import quantize
from pretextual.exporters.source import find_checkpoint, load_checkpoint_model
from pretextual.plugins.api import ExportOptions

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

TOLERANCE = 1e-4


def feeds(run_dir):
    """The two padded test batches as onnxruntime feeds (int64)."""
    return [{k: v.numpy() for k, v in padded_batch(run_tokenizer(run_dir), texts, 0).items()}
            for texts in (TEXTS_A, TEXTS_B)]


def max_diff_to_torch(session, run_dir) -> list[float]:
    ours = reference_model(run_dir).bert
    diffs = []
    for feed in feeds(run_dir):
        assert (feed["attention_mask"] == 0).any() and feed["input_ids"].dtype == np.int64
        last, pooled = session.run(["last_hidden_state", "pooler_output"], feed)
        with torch.no_grad():
            expected = ours(**{k: torch.from_numpy(v) for k, v in feed.items()})
        real = feed["attention_mask"].astype(bool)  # padding positions are meaningless
        diffs.append(max(np.abs(last - expected.last_hidden_state.numpy())[real].max(),
                         np.abs(pooled - expected.pooler_output.numpy()).max()))
    return diffs


def test_graph_interface(full_export):
    out, _ = full_export
    model = onnx.load(str(out / "model.onnx"))
    onnx.checker.check_model(model, full_check=True)
    assert [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")] == [18]
    inputs = {i.name: i.type.tensor_type for i in model.graph.input}
    assert list(inputs) == ["input_ids", "attention_mask", "token_type_ids"]
    for tensor_type in inputs.values():
        assert tensor_type.elem_type == onnx.TensorProto.INT64
        assert [d.dim_param for d in tensor_type.shape.dim] == ["batch_size", "sequence_length"]
    outputs = {o.name: [d.dim_param or d.dim_value for d in o.type.tensor_type.shape.dim]
               for o in model.graph.output}
    assert outputs == {"last_hidden_state": ["batch_size", "sequence_length", 128],
                       "pooler_output": ["batch_size", 128]}
    assert not (out / "model.onnx.data").exists()  # one file under 2 GB


def test_onnxruntime_matches_torch_at_two_shapes_with_padding(full_export, mlm_run):
    out, _ = full_export
    session = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    diffs = max_diff_to_torch(session, mlm_run)
    assert len(diffs) == 2 and max(diffs) <= TOLERANCE, diffs


def test_fully_masked_row_stays_finite(full_export, mlm_run):
    out, _ = full_export
    session = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    feed = feeds(mlm_run)[0]
    feed["attention_mask"][1] = 0
    assert all(np.isfinite(o).all() for o in session.run(None, feed))


def test_summary_reports_the_verification(full_export):
    out, report = full_export
    onnx_summary = report.summaries["onnx"]
    metrics = onnx_summary.metrics
    assert set(metrics) >= {"max_abs_diff_3x13", "max_abs_diff_1x5"}
    assert 0 <= metrics["max_abs_diff"] <= TOLERANCE
    assert any("onnxruntime vs torch: max abs diff" in line for line in onnx_summary.lines)
    assert "max abs diff" in "\n".join(report.lines())
    manifest = json.loads((out / "export.json").read_text())
    assert manifest["formats"]["onnx"]["metrics"]["max_abs_diff"] == metrics["max_abs_diff"]
    assert manifest["options"] == {"with_heads": True, "quantize": "int8"}


def test_int8_is_smaller_and_close_to_fp32(full_export, mlm_run):
    out, report = full_export
    metrics = report.summaries["onnx"].metrics
    assert metrics["int8_size_ratio"] < 0.5
    assert metrics["int8_cosine_mean"] >= 0.99 and metrics["int8_sample_tokens"] > 1000
    assert metrics["int8_sample_length"] == 32  # the trained length (tiny_overrides)
    assert np.isfinite(metrics["int8_speedup"]) and metrics["int8_speedup"] > 0
    lines = report.summaries["onnx"].lines
    line = next(l for l in lines if l.startswith("model_quantized.onnx"))
    assert "size" in line and "speed" in line and "cosine" in line
    slower = [l for l in lines if l.startswith("warning: model_quantized.onnx ran slower")]
    assert len(slower) == (metrics["int8_speedup"] < 1)
    fp32 = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    int8 = ort.InferenceSession(str(out / "model_quantized.onnx"), providers=["CPUExecutionProvider"])
    for feed in feeds(mlm_run):
        a = fp32.run(["last_hidden_state"], feed)[0][feed["attention_mask"] == 1]
        b = int8.run(["last_hidden_state"], feed)[0][feed["attention_mask"] == 1]
        cosine = (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))
        assert cosine.mean() >= 0.99


@pytest.mark.parametrize("length", [32, 512, 2048])
def test_int8_is_checked_on_text_as_long_as_the_model_was_trained_on(mlm_run, length):
    tokenizer = run_tokenizer(mlm_run)
    batches = quantize.corpus_feeds(tokenizer, 0, length)
    masks = np.concatenate([f["attention_mask"] for f in batches])
    assert all(f["input_ids"].shape[1] == length for f in batches)
    assert (masks.sum(1) == length).mean() > 0.9  # nearly every row fills the trained length
    assert abs(masks.sum() - quantize.SAMPLE_TOKENS) < 0.2 * quantize.SAMPLE_TOKENS
    assert all(len(f["input_ids"]) <= quantize.SAMPLE_BATCH for f in batches)


@pytest.mark.parametrize("speedup, warned", [(0.5, True), (0.98, True), (1.0, False), (1.7, False)])
def test_an_int8_model_slower_than_fp32_is_kept_with_a_warning(speedup, warned):
    metrics = {"int8_size_ratio": 0.26, "int8_speedup": speedup, "int8_cosine_mean": 0.999998,
               "int8_cosine_min": 0.99999, "int8_sample_tokens": 3829, "int8_sample_length": 128}
    lines = quantize.summary_lines(metrics, 4)
    assert lines[0] == (f"model_quantized.onnx: dynamic int8, 0.26x the fp32 size, {speedup:.2f}x "
                        f"the fp32 ONNX speed, cosine to fp32 0.999998 (min 0.999990) over 3829 "
                        f"tokens of 4 batches of the embedded corpus (up to 128 tokens a row)")
    if warned:
        assert lines[1:] == [f"warning: model_quantized.onnx ran slower than model.onnx on this "
                             f"machine ({speedup:.2f}x); it is kept as asked, but serve model.onnx "
                             f"unless int8 measures faster where you deploy"]
    else:
        assert lines[1:] == []


def test_external_data_above_the_one_file_limit(mlm_run, tmp_path, monkeypatch):
    monkeypatch.setattr(onnx_exporter, "ONE_FILE_LIMIT", 0)
    model = load_checkpoint_model(find_checkpoint(mlm_run))
    summary = onnx_exporter.export_onnx(model, tmp_path, ExportOptions())
    assert summary.files == ["model.onnx", "model.onnx.data"]
    assert (tmp_path / "model.onnx").stat().st_size < (tmp_path / "model.onnx.data").stat().st_size
    session = ort.InferenceSession(str(tmp_path / "model.onnx"), providers=["CPUExecutionProvider"])
    assert max(max_diff_to_torch(session, mlm_run)) <= TOLERANCE

    # int8 of an external-data model; a cosine floor it cannot reach fails with the numbers.
    monkeypatch.setattr(quantize, "corpus_feeds", lambda *args: feeds(mlm_run))
    monkeypatch.setattr(quantize, "MIN_COSINE", 1.5)
    with pytest.raises(quantize.PretextualError, match=r"int8 outputs drift from fp32: mean cosine "
                                                       r"[01]\.\d{6} < 1\.5 on \d+ tokens"):
        quantize.quantize_int8(model, tmp_path / "model.onnx", external_data=True)


def test_a_mismatch_fails_the_export_with_the_numbers(mlm_run, monkeypatch):
    model = load_checkpoint_model(find_checkpoint(mlm_run))

    class Shifted:  # a session whose outputs are off by 1e-3
        def run(self, names, feed):
            return [o + 1e-3 for o in onnx_exporter.torch_outputs(model.encoder, feed)]

    with pytest.raises(onnx_exporter.PretextualError, match=r"max abs diff 1\.0+e-03 > 0\.0001"):
        onnx_exporter.compare_with_torch(Shifted(), model.encoder)
