"""Dynamic int8 quantization of model.onnx with onnxruntime, measured against fp32.

Weights become int8 and activations are quantized on the fly, so no
calibration data is needed. The result is kept only if its outputs stay close
to fp32 on real text (the embedded corpus): mean cosine similarity of the
token vectors at least :data:`MIN_COSINE`. One that runs slower than fp32 on the
exporting machine is kept, since it was asked for, with a warning in the export summary.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from pretextual.core.corpus import embedded_corpus
from pretextual.errors import PretextualError
from pretextual.exporters.onnx_runtime import ONNX_FILE, cpu_session, quiet
from pretextual.plugins.api import ExportedModel, ExportSummary

INT8_FILE = "model_quantized.onnx"
MIN_COSINE = 0.99
SAMPLE_TOKENS = 8192  # about this many tokens are compared, at any trained length
SAMPLE_BATCH = 16
TIMING_ROUNDS = 3
CHARS_PER_TOKEN = 10  # more than any tokenizer's average, so a text fills ``length`` tokens


def corpus_feeds(tokenizer: Tokenizer, pad_id: int, length: int) -> list[dict[str, np.ndarray]]:
    """Padded batches of at most SAMPLE_BATCH texts spread over the embedded corpus, each
    cut at ``length`` tokens (the trained length, so the check covers every position the
    model was trained on): SAMPLE_TOKENS // length texts (at least one), so about
    SAMPLE_TOKENS tokens at any length up to SAMPLE_TOKENS."""
    sentences = [s for doc in embedded_corpus() for s in doc.sentences]
    count = max(1, SAMPLE_TOKENS // length)
    texts = [_text_from(sentences, start, CHARS_PER_TOKEN * length)
             for start in range(0, len(sentences), max(1, len(sentences) // count))][:count]
    tok = Tokenizer.from_str(tokenizer.to_str())
    tok.enable_truncation(max_length=length)
    tok.enable_padding(pad_id=pad_id, pad_token=tok.id_to_token(pad_id))
    feeds = []
    for start in range(0, len(texts), SAMPLE_BATCH):
        encodings = tok.encode_batch(texts[start:start + SAMPLE_BATCH])
        feeds.append({"input_ids": np.array([e.ids for e in encodings], dtype=np.int64),
                      "attention_mask": np.array([e.attention_mask for e in encodings], dtype=np.int64),
                      "token_type_ids": np.array([e.type_ids for e in encodings], dtype=np.int64)})
    return feeds


def _text_from(sentences: list[str], start: int, chars: int) -> str:
    """Consecutive sentences from ``start`` (on into the next documents) until ``chars`` long."""
    end = start
    total = 0
    while end < len(sentences) and total < chars:
        total += len(sentences[end]) + 1
        end += 1
    return " ".join(sentences[start:end])


def token_cosines(a: np.ndarray, b: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Cosine similarity of each non-padding token's vector in ``a`` and ``b``."""
    a, b = a[mask.astype(bool)], b[mask.astype(bool)]
    return (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1) + 1e-12)


def _timed_pass(session, feeds) -> float:
    start = time.perf_counter()
    for feed in feeds:
        session.run(["last_hidden_state"], feed)
    return time.perf_counter() - start


def quantize_int8(model: ExportedModel, fp32_path: Path, external_data: bool) -> ExportSummary:
    """Write model_quantized.onnx next to ``fp32_path`` and measure it against fp32:
    size ratio, speedup (best of TIMING_ROUNDS passes over the sample) and cosine."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    int8_path = fp32_path.with_name(INT8_FILE)
    with quiet(""):  # its advice to pre-process did not change size, speed or cosine here
        quantize_dynamic(fp32_path, int8_path, weight_type=QuantType.QInt8,
                         use_external_data_format=external_data)
    files = sorted(p.name for p in fp32_path.parent.iterdir() if p.name.startswith(INT8_FILE))
    fp32_size = sum(p.stat().st_size for p in fp32_path.parent.iterdir()
                    if p.name.startswith(fp32_path.name))
    int8_size = sum((fp32_path.parent / f).stat().st_size for f in files)

    fp32, int8 = cpu_session(fp32_path), cpu_session(int8_path)
    feeds = corpus_feeds(model.tokenizer, model.config.pad_token_id, model.max_seq_length)
    cosines = np.concatenate([
        token_cosines(fp32.run(["last_hidden_state"], f)[0], int8.run(["last_hidden_state"], f)[0],
                      f["attention_mask"]) for f in feeds])
    fp32_s = min(_timed_pass(fp32, feeds) for _ in range(TIMING_ROUNDS))
    int8_s = min(_timed_pass(int8, feeds) for _ in range(TIMING_ROUNDS))
    metrics = {"int8_size_ratio": int8_size / fp32_size, "int8_speedup": fp32_s / int8_s,
               "int8_cosine_mean": float(cosines.mean()), "int8_cosine_min": float(cosines.min()),
               "int8_sample_tokens": int(cosines.size),
               "int8_sample_length": max(f["input_ids"].shape[1] for f in feeds)}
    if metrics["int8_cosine_mean"] < MIN_COSINE:
        raise PretextualError(f"onnx: int8 outputs drift from fp32: mean cosine "
                              f"{metrics['int8_cosine_mean']:.6f} < {MIN_COSINE} on "
                              f"{cosines.size} tokens of the embedded corpus; export without "
                              f"--quantize")
    return ExportSummary(files=files, metrics=metrics, lines=summary_lines(metrics, len(feeds)))


def summary_lines(metrics: dict, batches: int) -> list[str]:
    """The lines printed for the int8 model: its numbers, and a warning when it ran
    slower than fp32 (kept, since it was asked for, but not the one to serve here)."""
    lines = [f"{INT8_FILE}: dynamic int8, {metrics['int8_size_ratio']:.2f}x the fp32 size, "
             f"{metrics['int8_speedup']:.2f}x the fp32 ONNX speed, cosine to fp32 "
             f"{metrics['int8_cosine_mean']:.6f} (min {metrics['int8_cosine_min']:.6f}) over "
             f"{metrics['int8_sample_tokens']} tokens of {batches} batches of the embedded corpus "
             f"(up to {metrics['int8_sample_length']} tokens a row)"]
    if round(metrics["int8_speedup"], 2) < 1:  # as printed: "1.00x" is not slower
        lines.append(f"warning: {INT8_FILE} ran slower than {ONNX_FILE} on this machine "
                     f"({metrics['int8_speedup']:.2f}x); it is kept as asked, but serve "
                     f"{ONNX_FILE} unless int8 measures faster where you deploy")
    return lines
