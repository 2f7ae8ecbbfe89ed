"""Comparison 1 (training step throughput, synthetic and end to end on real
text) and comparison 4 (model FLOP utilisation against the measured matmul peak).

A training step on either side is what each framework's loop does per batch:
forward under optional bf16 autocast, backward, gradient clipping at the
configured norm, the optimizer step, zeroing the gradients, and reading the
loss as a Python float (both trainers log it every step).
"""

from __future__ import annotations

import contextlib
import time

import torch

from benchmarks import flops as F
from benchmarks.report import Report, Row, fmt_rate, fmt_ratio
from benchmarks.timing import interleave
from benchmarks.workloads import (Workspace, hf_attention, hf_model, hf_tokenizer,
                                  matching_optimizer, optimizer_description, synthetic_pair_batch,
                                  to_device)

IGNORE_INDEX = -100


def autocast(device: torch.device, bf16: bool):
    if not bf16:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16)


def pretextual_step(trainer, batch, bf16: bool) -> float:
    """One optimizer step as pretextual's Trainer takes it (one micro-batch)."""
    with autocast(trainer.device, bf16):
        total, _ = trainer.forward(batch, trainer.step)
    total.backward()
    max_norm = trainer.cfg.trainer.max_grad_norm
    if max_norm > 0:
        torch.nn.utils.clip_grad_norm_(trainer.model.parameters(), max_norm)
    trainer.optimizer.step()
    trainer.optimizer.zero_grad(set_to_none=True)
    return float(total)


def hf_step(model, optimizer, inputs, bf16: bool, max_norm: float, device) -> float:
    """One optimizer step as Hugging Face's Trainer takes it (one micro-batch)."""
    with autocast(device, bf16):
        loss = model(**inputs).loss
    loss.backward()
    if max_norm > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return float(loss)


def _hf_pretraining_inputs(batch) -> dict[str, torch.Tensor]:
    return {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"],
            "token_type_ids": batch["token_type_ids"], "labels": batch["mlm_labels"],
            "next_sentence_label": batch["next_sentence_label"]}


def training_step(ws: Workspace, report: Report) -> None:
    """Synthetic full batches at the reference sizes, MLM + NSP, fp32 and bf16,
    with the matmul peak measured in the same rounds (for MFU)."""
    s, device = ws.sizes, ws.device
    trainer = ws.trainer("bert")  # MLM + NSP, the default recipe
    if trainer.mix.names != ["mlm", "nsp"]:
        raise RuntimeError(f"the bert recipe selects {trainer.mix.names}, expected mlm + nsp")
    generator = torch.Generator().manual_seed(1)
    batch = to_device(trainer.mix.batch_transform(synthetic_pair_batch(s, ws.vocab), generator),
                      device)
    predictions = int((batch["mlm_labels"] != IGNORE_INDEX).sum())
    tokens = s.batch * s.seq

    torch.manual_seed(0)
    hf = hf_model("BertForPreTraining", s, ws.vocab, device)
    hf_optimizer = matching_optimizer(hf, trainer.optimizer)
    hf_inputs = _hf_pretraining_inputs(batch)
    max_norm = trainer.cfg.trainer.max_grad_norm

    def pt(bf16):
        return lambda: (pretextual_step(trainer, batch, bf16), tokens)[1]

    def ref(bf16):
        return lambda: (hf_step(hf, hf_optimizer, hf_inputs, bf16, max_norm, device), tokens)[1]

    cases = {"pretextual fp32": pt(False), "hf fp32": ref(False),
             "pretextual bf16": pt(True), "hf bf16": ref(True)}
    shapes = F.peak_shapes(tokens, s.hidden, s.intermediate, smoke=s.smoke, device=device)
    gemms, gemm_meta = F.gemm_cases(shapes, device)
    cases.update(gemms)
    samples = interleave(cases, s.repeats, s.warmup, device)

    rate = {k: samples[k].rate for k in ("pretextual fp32", "hf fp32", "pretextual bf16", "hf bf16")}
    unit = "tokens/s"
    report.add(Row("1", "training step, fp32 (MLM + NSP, synthetic full batches)",
                   fmt_rate(rate["pretextual fp32"], unit), fmt_rate(rate["hf fp32"], unit),
                   rate["pretextual fp32"] / rate["hf fp32"],
                   fmt_ratio(rate["pretextual fp32"] / rate["hf fp32"]), 4.0, ">= 4x"))
    # The bf16 goal, read both ways: against Hugging Face in bf16 too (like for like),
    # and against Hugging Face fp32 (the baseline its numbers are quoted against).
    report.add(Row("1", "training step, bf16 autocast on both sides (same batches)",
                   fmt_rate(rate["pretextual bf16"], unit), fmt_rate(rate["hf bf16"], unit),
                   rate["pretextual bf16"] / rate["hf bf16"],
                   fmt_ratio(rate["pretextual bf16"] / rate["hf bf16"]), 7.0, ">= 7x"))
    report.add(Row("1", "training step, pretextual bf16 against Hugging Face fp32",
                   fmt_rate(rate["pretextual bf16"], unit), fmt_rate(rate["hf fp32"], unit),
                   rate["pretextual bf16"] / rate["hf fp32"],
                   fmt_ratio(rate["pretextual bf16"] / rate["hf fp32"]), 7.0, ">= 7x"))

    # Comparison 4: model FLOP utilisation.
    work = F.StepWork(s.layers, s.hidden, s.intermediate, ws.vocab.size, (s.seq,) * s.batch,
                      predictions, sentence_head=True)
    step_flops = work.flops()
    peak = F.peaks(samples, gemm_meta)
    goals = {"fp32": 0.85, "bf16": 0.60}
    mkl = max((samples[n].rate for n, (prec, lib, _) in gemm_meta.items()
               if prec == "fp32" and lib == "torch.matmul"), default=None)
    for precision in ("fp32", "bf16"):
        achieved = step_flops / samples[f"pretextual {precision}"].median_seconds
        hf_achieved = step_flops / samples[f"hf {precision}"].median_seconds
        mfu = achieved / peak[precision].flops_per_s
        hf_mfu = hf_achieved / peak[precision].flops_per_s
        report.add(Row("4", f"model FLOP utilisation, {precision} (of the {precision} matmul peak)",
                       f"{mfu:.0%} ({achieved / 1e9:,.0f} GFLOP/s)",
                       f"{hf_mfu:.0%} ({hf_achieved / 1e9:,.0f} GFLOP/s)", mfu, f"{mfu:.0%}",
                       goals[precision], f">= {goals[precision]:.0%}"))
    if mkl:
        report.details.append(
            f"MFU fp32 against torch.matmul's own best fp32 rate ({mkl / 1e9:,.0f} GFLOP/s, the "
            f"BLAS torch calls by default) instead of the machine's best: pretextual "
            f"{step_flops / samples['pretextual fp32'].median_seconds / mkl:.0%}, Hugging Face "
            f"{step_flops / samples['hf fp32'].median_seconds / mkl:.0%} (the table uses the best "
            f"rate any library reached, so this line is for comparison only).")
    report.details += [
        f"Training step: {s.describe()}; {predictions} MLM predictions per batch "
        f"({predictions / tokens:.1%} of the tokens); useful model FLOPs per step "
        f"{step_flops / 1e9:,.1f} GFLOP (per token {step_flops / tokens / 1e6:,.1f} MFLOP).",
        f"Optimizer (both sides): {optimizer_description(trainer.optimizer)}; gradient clipping "
        f"at {max_norm} (the fused AdamW is also what Hugging Face's Trainer picks by default, "
        f"optim=\"adamw_torch_fused\"). Hugging Face attention: {hf_attention(hf)}. Memory "
        f"allocator (both sides, one process): glibc malloc keeping freed memory for reuse, set "
        f"process-wide by pretextual's Trainer on the CPU (pretextual.core.fastpath.keep_freed_memory).",
        "Matmul peak measured in the same rounds: " + "; ".join(
            f"{p}: {peak[p].describe()}" for p in ("fp32", "bf16")) + ". All measured GEMMs: "
        + ", ".join(f"{name[5:]} {samples[name].rate / 1e9:,.0f}" for name in gemm_meta)
        + " GFLOP/s.",
        "Training-step medians (s): " + ", ".join(
            f"{k} {samples[k].median_seconds:.3f}" for k in rate) + "; spread of tokens/s over "
        "the rounds: " + ", ".join(
            f"{k} {samples[k].spread()[0]:,.0f}-{samples[k].spread()[1]:,.0f}" for k in rate) + ".",
        cpu_share_line(samples, rate),
    ]


def cpu_share_line(samples, names) -> str:
    threads = torch.get_num_threads()
    return ("CPU share (process CPU time / (wall time x threads), 1.0 = the cores were ours): "
            + ", ".join(f"{k} {samples[k].cpu_share(threads):.2f}" for k in names) + ".")


# --- end to end on real text -------------------------------------------------------------------

class Cycling:
    """An endless iterator over a DataLoader factory (a new pass when one ends)."""

    def __init__(self, make):
        self.make, self.it = make, iter(make())

    def __next__(self):
        try:
            return next(self.it)
        except StopIteration:
            self.it = iter(self.make())
            return next(self.it)


def _pretextual_loader(trainer, steps: int):
    if hasattr(trainer, "_loader") and hasattr(trainer, "_train_indices"):
        return lambda: trainer._loader(trainer.train_batches, trainer._train_indices(0)[:steps])
    return lambda: torch.utils.data.DataLoader(trainer.train_batches, batch_size=None,
                                               sampler=range(steps))


def end_to_end(ws: Workspace, report: Report) -> None:
    """Real text, MLM only: pretextual's roberta recipe (sentences packed up to
    the sequence length, masked in its pipeline) against BertForMaskedLM fed
    line-by-line examples padded to the longest in the batch by
    DataCollatorForLanguageModeling. Batch loading is inside the timed step.
    Counts real (non-padding) tokens per second."""
    from transformers import DataCollatorForLanguageModeling

    s, device = ws.sizes, ws.device
    trainer = ws.trainer("roberta")  # MLM only, full sentences
    rounds = s.warmup + s.repeats
    pt_batches = Cycling(_pretextual_loader(trainer, 2 * rounds + 2))

    tokenizer = hf_tokenizer(ws.tokenizer, ws.vocab)
    encoded = tokenizer(ws.lines, truncation=True, max_length=s.seq, return_special_tokens_mask=True)
    examples = [{"input_ids": ids, "special_tokens_mask": sm}
                for ids, sm in zip(encoded["input_ids"], encoded["special_tokens_mask"])]
    collator = DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.15)
    loader_generator = torch.Generator().manual_seed(0)
    hf_batches = Cycling(lambda: torch.utils.data.DataLoader(
        examples, batch_size=s.batch, shuffle=True, collate_fn=collator, generator=loader_generator))
    torch.manual_seed(0)
    hf = hf_model("BertForMaskedLM", s, ws.vocab, device)
    hf_optimizer = matching_optimizer(hf, trainer.optimizer)
    max_norm = trainer.cfg.trainer.max_grad_norm
    seen = {"pretextual": [0, 0], "hf": [0, 0]}  # real tokens, padded positions
    waited = {"pretextual": 0.0, "hf": 0.0}  # seconds spent getting batches
    spent = {"pretextual": 0.0, "hf": 0.0}  # seconds of whole steps (batch included)

    def fetch(source, name):
        start = time.perf_counter()
        batch = next(source)
        waited[name] += time.perf_counter() - start
        return batch

    def timed(name, batches, step):
        """One end-to-end step of one side: fetch (timed apart), count real tokens, step."""
        def run():
            start = time.perf_counter()
            batch = to_device(fetch(batches, name), device)
            real = int(batch["attention_mask"].sum())
            seen[name][0] += real
            seen[name][1] += batch["attention_mask"].numel()
            step(batch)
            spent[name] += time.perf_counter() - start
            return real
        return run

    def pt(bf16):
        return timed("pretextual", pt_batches, lambda batch: pretextual_step(trainer, batch, bf16))

    def ref(bf16):
        return timed("hf", hf_batches,
                     lambda batch: hf_step(hf, hf_optimizer, batch, bf16, max_norm, device))

    cases = {"pretextual fp32": pt(False), "hf fp32": ref(False),
             "pretextual bf16": pt(True), "hf bf16": ref(True)}
    samples = interleave(cases, s.repeats, s.warmup, device)
    unit = "real tokens/s"
    for precision in ("fp32", "bf16"):
        a, b = samples[f"pretextual {precision}"].rate, samples[f"hf {precision}"].rate
        report.add(Row("1", f"end to end on the embedded corpus, MLM, {precision} (real tokens, "
                            f"batch loading included)", fmt_rate(a, unit), fmt_rate(b, unit),
                       a / b, fmt_ratio(a / b)))
    report.details.append(
        f"End to end: {len(examples):,} line-by-line examples for Hugging Face (BertForMaskedLM, "
        f"DataCollatorForLanguageModeling, padded to the longest in the batch); pretextual's "
        f"roberta recipe (full sentences packed to {s.seq}). Share of real tokens in the batches "
        f"stepped: pretextual {seen['pretextual'][0] / max(1, seen['pretextual'][1]):.0%}, "
        f"Hugging Face {seen['hf'][0] / max(1, seen['hf'][1]):.0%}. Time spent getting the next "
        f"batch (DataLoader, no workers: collate + masking in the main process), as a share of "
        f"the step: pretextual {waited['pretextual'] / max(spent['pretextual'], 1e-9):.2%}, "
        f"Hugging Face {waited['hf'] / max(spent['hf'], 1e-9):.2%}. "
        + cpu_share_line(samples, list(cases)))
