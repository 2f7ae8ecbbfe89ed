"""Comparison 2: masking throughput, from the same tokenized examples to padded
batch tensors with labels.

pretextual: ``collate`` (pad to the longest in the batch) then the objective's
batch transform (``mlm``: 80/10/10; ``wwm``: whole words from the batch's
word starts). Hugging Face: ``DataCollatorForLanguageModeling`` (its
``whole_word_mask=True`` for whole words, which needs each example's
offset_mapping and, since its padding cannot pad offsets, examples padded to
the sequence length when tokenized, as its users must).

Two sets of examples, both cut from the embedded corpus by the same tokenizer:
the corpus line by line (one sentence an example, Hugging Face's line_by_line)
and pretextual's packed examples (full sentences up to the sequence length).
Offsets for the packed examples are made from their word starts (pieces of a
word touch, words are one character apart), which gives Hugging Face exactly
the words pretextual sees. Throughput counts real (non-padding) tokens.
"""

from __future__ import annotations

import numpy as np
import torch

from benchmarks.report import Report, Row, fmt_rate, fmt_ratio
from benchmarks.timing import interleave
from benchmarks.workloads import Workspace, hf_tokenizer, word_starts_of
from pretextual.core.data import collate, full_sentences
from pretextual.core.documents import TokenizedDocuments
from pretextual.architectures.bert import BertConfig
from pretextual.plugins.api import BuildContext


def _offsets_from_word_starts(ids: np.ndarray, starts: np.ndarray, special: set[int]) -> list:
    offsets, position = [], 0
    for token, start in zip(ids.tolist(), starts.tolist()):
        if token in special:
            offsets.append((0, 0))
            continue
        if start:
            position += 1  # a space before every word
        offsets.append((position, position + 1))
        position += 1
    return offsets


def _pad(values: list, length: int, fill) -> list:
    return values + [fill] * (length - len(values))


def example_sets(ws: Workspace) -> dict[str, dict[str, list]]:
    """name -> {"pretextual": examples, "hf": examples, "hf_wwm": examples}."""
    s, vocab = ws.sizes, ws.vocab
    special = set(vocab.special_ids)
    tokenizer = hf_tokenizer(ws.tokenizer, vocab)
    lines = ws.lines
    limit = s.batch * s.masking_batches
    lines = lines[:limit] if len(lines) >= limit else lines

    enc = tokenizer(lines, truncation=True, max_length=s.seq, return_special_tokens_mask=True,
                    return_offsets_mapping=True)
    line_pt, line_hf, line_wwm = [], [], []
    for i, ids in enumerate(enc["input_ids"]):
        n = len(ids)
        line_pt.append({"input_ids": np.asarray(ids, dtype=np.int64),
                        "token_type_ids": np.zeros(n, dtype=np.int64),
                        "word_starts": word_starts_of(enc.word_ids(i))})
        line_hf.append({"input_ids": ids, "special_tokens_mask": enc["special_tokens_mask"][i]})
        line_wwm.append({"input_ids": _pad(ids, s.seq, vocab.pad_id),
                         "attention_mask": _pad([1] * n, s.seq, 0),
                         "special_tokens_mask": _pad(enc["special_tokens_mask"][i], s.seq, 1),
                         "offset_mapping": _pad([tuple(o) for o in enc["offset_mapping"][i]], s.seq, (0, 0))})

    docs = TokenizedDocuments.from_documents(ws.docs, ws.tokenizer)
    packed = full_sentences(s.seq, vocab)(docs, np.random.default_rng(0))[:limit]
    packed_hf, packed_wwm = [], []
    for e in packed:
        ids = e["input_ids"].tolist()
        n = len(ids)
        mask = [int(t in special) for t in ids]
        packed_hf.append({"input_ids": ids, "special_tokens_mask": mask})
        packed_wwm.append({"input_ids": _pad(ids, s.seq, vocab.pad_id),
                           "attention_mask": _pad([1] * n, s.seq, 0),
                           "special_tokens_mask": _pad(mask, s.seq, 1),
                           "offset_mapping": _pad(_offsets_from_word_starts(
                               e["input_ids"], e["word_starts"], special), s.seq, (0, 0))})
    return {"line by line": {"pretextual": line_pt, "hf": line_hf, "hf_wwm": line_wwm},
            f"packed to {s.seq}": {"pretextual": packed, "hf": packed_hf, "hf_wwm": packed_wwm}}


def masking(ws: Workspace, report: Report) -> None:
    from transformers import DataCollatorForLanguageModeling

    from pretextual.objectives import mlm, wwm

    s, vocab = ws.sizes, ws.vocab
    tokenizer = hf_tokenizer(ws.tokenizer, vocab)
    context = BuildContext(BertConfig(vocab_size=vocab.size), vocab, s.seq, True)
    transforms = {"mlm": mlm.build(mlm.MLMOptions(), context).batch_transform,
                  "wwm": wwm.build(mlm.MLMOptions(), context).batch_transform}
    collators = {"mlm": DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.15),
                 "wwm": DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.15,
                                                        whole_word_mask=True)}
    goals = {"mlm": 10.0, "wwm": 20.0}
    sets = example_sets(ws)
    details = []
    for set_name, examples in sets.items():
        pt_examples = examples["pretextual"]
        batches = [pt_examples[i:i + s.batch] for i in range(0, len(pt_examples) - s.batch + 1, s.batch)]
        tokens = sum(len(e["input_ids"]) for b in batches for e in b)
        hf_sets = {"mlm": examples["hf"], "wwm": examples["hf_wwm"]}

        def pt(kind):
            transform = transforms[kind]

            def run():
                generator = torch.Generator().manual_seed(0)
                for b in batches:
                    transform(collate(b, vocab), generator)
                return tokens
            return run

        def hf(kind):
            collator, hf_examples = collators[kind], hf_sets[kind]
            hf_batches = [hf_examples[i:i + s.batch] for i in range(0, len(batches) * s.batch, s.batch)]

            def run():
                for b in hf_batches:
                    collator(b)
                return tokens
            return run

        cases = {"pretextual mlm": pt("mlm"), "hf mlm": hf("mlm"),
                 "pretextual wwm": pt("wwm"), "hf wwm": hf("wwm")}
        samples = interleave(cases, s.repeats, s.warmup, settle=s.settle)
        for kind, label in (("mlm", "MLM 80/10/10"), ("wwm", "whole-word masking")):
            a, b = samples[f"pretextual {kind}"].rate, samples[f"hf {kind}"].rate
            report.add(Row("2", f"masking, {label}, {set_name} examples", fmt_rate(a, "tokens/s"),
                           fmt_rate(b, "tokens/s"), a / b, fmt_ratio(a / b), goals[kind],
                           f">= {goals[kind]:.0f}x"))
        details.append(f"{set_name}: {len(batches)} batches of {s.batch}, "
                       f"{tokens / (len(batches) * s.batch):.1f} real tokens per example")
    report.details.append("Masking examples: " + "; ".join(details) + ". One thread "
                          f"(torch.get_num_threads() = {torch.get_num_threads()}) as set for the run.")
