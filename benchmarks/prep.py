"""Comparison 5: corpus preparation (tokenizing and building examples), in MB of text per second.

Both sides start from the corpus already read into sentences and use the same
tokenizer. pretextual: ``TokenizedDocuments.from_documents`` (what ``pretextual
train`` does before caching) then its default example builder
(``full_sentences``, packing to the sequence length). Hugging Face: the fast
tokenizer over the corpus line by line with truncation and special-tokens
masks (run_mlm's line_by_line preprocessing, as a ``datasets.map`` calls it),
in batches of 1,000 lines.
"""

from __future__ import annotations

import numpy as np

from benchmarks.report import Report, Row, fmt_ratio
from benchmarks.timing import interleave
from benchmarks.workloads import Workspace, hf_tokenizer
from pretextual.core.data import full_sentences
from pretextual.core.documents import TokenizedDocuments

HF_MAP_BATCH = 1000  # datasets.map's default batch size


def preparation(ws: Workspace, report: Report) -> None:
    s = ws.sizes
    lines = ws.lines
    text_mb = sum(len(line.encode("utf-8")) for line in lines) / 1e6
    tokenizer = hf_tokenizer(ws.tokenizer, ws.vocab)
    builder = full_sentences(s.seq, ws.vocab)

    def pretextual():
        docs = TokenizedDocuments.from_documents(ws.docs, ws.tokenizer)
        builder(docs, np.random.default_rng(0))
        return text_mb

    def hf():
        for start in range(0, len(lines), HF_MAP_BATCH):
            tokenizer(lines[start:start + HF_MAP_BATCH], truncation=True, max_length=s.seq,
                      return_special_tokens_mask=True)
        return text_mb

    samples = interleave({"pretextual": pretextual, "hf": hf}, s.repeats, s.warmup,
                         settle=s.settle)
    a, b = samples["pretextual"].rate, samples["hf"].rate
    report.add(Row("5", "corpus preparation (tokenize + build examples)", f"{a:.2f} MB/s",
                   f"{b:.2f} MB/s", a / b, fmt_ratio(a / b)))
    report.details.append(f"Corpus preparation: {text_mb:.2f} MB of text, {len(lines):,} lines, "
                          f"{len(ws.docs)} documents.")
