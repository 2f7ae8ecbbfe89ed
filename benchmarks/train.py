"""Comparison 1 (training step throughput, synthetic and end to end on real
text) and comparison 4 (model FLOP utilisation against the measured matmul peak).

A training step on either side is what each framework's loop does per batch:
forward under optional bf16 autocast, backward, gradient clipping at the
configured norm, the optimizer step, zeroing the gradients, and reading the
loss as a Python float (both trainers log it every step).
"""

from __future__ import annotations

import contextlib
import itertools
import time

import torch

from benchmarks import flops as F
from benchmarks.report import Report, Row, fmt_rate, fmt_ratio
from benchmarks.timing import for_at_least, interleave
from benchmarks.isolated import Isolated
from benchmarks.workloads import (OptimizerSpec, Workspace, hf_config, hf_model, hf_tokenizer,
                                  masked_step, optimizer_description, to_device)
from pretextual.accel.allocator import keep_freed_memory



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
    return float(total.detach())


def hf_step(model, optimizer, inputs, bf16: bool, max_norm: float, device) -> float:
    """One optimizer step as Hugging Face's Trainer takes it (one micro-batch)."""
    with autocast(device, bf16):
        loss = model(**inputs).loss
    loss.backward()
    if max_norm > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return float(loss.detach())


def _hf_pretraining_inputs(batch) -> dict[str, torch.Tensor]:
    return {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"],
            "token_type_ids": batch["token_type_ids"], "labels": batch["mlm_labels"],
            "next_sentence_label": batch["next_sentence_label"]}


def hf_pretraining_side(sizes, vocab, batch, optimizer: OptimizerSpec, max_norm: float,
                        device: torch.device, keep_freed: bool) -> dict:
    """Hugging Face's side of comparison 1, built in a process of its own
    (benchmarks.isolated): BertForPreTraining stepped on ``batch`` in fp32 and
    bf16. ``keep_freed``: give the process pretextual's allocator setting
    (otherwise glibc's defaults, as a Hugging Face user's process has)."""
    kept = keep_freed and keep_freed_memory()
    torch.manual_seed(0)
    hf = hf_model("BertForPreTraining", sizes, vocab, device)
    hf_optimizer = optimizer.build(hf)
    inputs = to_device(_hf_pretraining_inputs(batch), device)
    tokens = sizes.batch * sizes.seq

    def step(bf16):
        return for_at_least(lambda: (hf_step(hf, hf_optimizer, inputs, bf16, max_norm, device),
                                     tokens)[1], sizes.round_seconds)

    return {"fp32": step(False), "bf16": step(True), "allocator": lambda: kept}


HF_SIDES = {"hf": False, "hf+alloc": True}
"""Hugging Face's processes: name -> whether it gets pretextual's allocator setting."""


def require_allocator_setting(applied: bool) -> None:
    """The 'hf+alloc' rows mean something only where the setting took (glibc)."""
    if not applied:
        raise RuntimeError("glibc's malloc settings could not be applied here (not glibc?), so "
                           "'Hugging Face given pretextual's allocator setting' cannot be measured")


def training_step(ws: Workspace, report: Report) -> None:
    """Synthetic full batches at the reference sizes, MLM + NSP, fp32 and bf16,
    with the matmul peak measured in the same rounds (for MFU). Hugging Face
    steps in processes of its own: one as its users run it, one given
    pretextual's allocator setting."""
    s, device = ws.sizes, ws.device
    trainer = ws.trainer("bert")  # MLM + NSP, the default recipe
    if trainer.mix.names != ["mlm", "nsp"]:
        raise RuntimeError(f"the bert recipe selects {trainer.mix.names}, expected mlm + nsp")
    # The same model under torch.compile (compiling takes minutes on a small CPU: not at the
    # smoke sizes, where test_step_equivalence checks its losses).
    variants = {} if s.smoke else {"compiled": ws.trainer("bert", "trainer.compile=true")}
    precisions = ws.precisions
    step = masked_step(trainer, s, ws.vocab, device)
    batch, predictions, tokens = step.batch, step.predictions, step.tokens
    max_norm, optimizer = step.max_norm, step.optimizer

    def pt(bf16, t=trainer):
        return for_at_least(lambda: (pretextual_step(t, batch, bf16), tokens)[1], s.round_seconds)

    with contextlib.ExitStack() as stack:
        # A copy for each child: pickling for a child moves a tensor's storage to shared memory.
        sides = {name: stack.enter_context(Isolated(
            "benchmarks.train:hf_pretraining_side", s, ws.vocab,
            {k: v.clone() for k, v in step.host_batch.items()}, optimizer, max_norm, device, keep,
            threads=torch.get_num_threads())) for name, keep in HF_SIDES.items()}
        require_allocator_setting(sides["hf+alloc"].call("allocator"))
        cases = {}
        for p in precisions:
            cases[f"pretextual {p}"] = pt(p == "bf16")
            cases.update({f"pretextual {variant} {p}": pt(p == "bf16", t)
                          for variant, t in variants.items()})
            cases.update({f"{name} {p}": side.case(p) for name, side in sides.items()})
        shapes = F.peak_shapes(tokens, s.hidden, s.intermediate, smoke=s.smoke, device=device)
        gemms, gemm_meta = F.gemm_cases(shapes, device, min_flops=0.0 if s.smoke else 2e10)
        cases.update(gemms)
        for precision, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
            if precision in precisions:
                cases[f"step matmuls {precision}"] = F.step_gemms(
                    s.layers, s.hidden, s.heads, s.intermediate, ws.vocab.size, s.batch, s.seq,
                    predictions, dtype, device)
        samples = interleave(cases, s.repeats, s.warmup, device, settle=s.settle)

    steps = [k for k in cases if not k.startswith(("gemm ", "step matmuls"))]
    rate = {k: samples[k].rate for k in steps}
    # A round may hold several steps (Sizes.round_seconds): a step's time is its tokens over the median rate.
    step_seconds = {k: tokens / rate[k] for k in steps}
    unit = "tokens/s"

    def compare(what, ours, theirs, goal=None):
        ratio = rate[ours] / rate[theirs]
        report.add(Row("1", what, fmt_rate(rate[ours], unit), fmt_rate(rate[theirs], unit),
                       ratio, fmt_ratio(ratio), goal, f">= {goal:g}x" if goal else ""))

    # Hugging Face's dense MLM head computes logits at every position; the FLOPs it does per
    # step over pretextual's sparse ones bound what pretextual's lead can be at equal efficiency.
    work = F.StepWork(s.layers, s.hidden, s.intermediate, ws.vocab.size, (s.seq,) * s.batch,
                      predictions, sentence_head=True)
    hf_work = F.StepWork(s.layers, s.hidden, s.intermediate, ws.vocab.size, (s.seq,) * s.batch,
                         tokens, sentence_head=True)
    flop_ratio = hf_work.flops() / work.flops()
    ceiling = f" (FLOP-ratio ceiling at equal efficiency {flop_ratio:.2f}x)"
    # The headline is like for like: Hugging Face given the one process-wide allocator setting
    # pretextual's Trainer makes on the CPU, which any process can make.
    goals = {"fp32": 3.0, "bf16": 4.0}
    for precision in precisions:
        compare(f"training step, {precision}, like for like: Hugging Face {precision} given "
                f"pretextual's allocator setting{ceiling}", f"pretextual {precision}",
                f"hf+alloc {precision}", goals[precision])
    for precision in precisions:
        compare(f"training step, {precision}, against Hugging Face as its users run it (MLM + "
                f"NSP, synthetic full batches{', bf16 autocast on both sides' if precision == 'bf16' else ''})",
                f"pretextual {precision}", f"hf {precision}")
    for precision in precisions:
        if "compiled" in variants:
            compare(f"training step, {precision}: torch.compile of the model over the model in "
                    f"eager", f"pretextual compiled {precision}", f"pretextual {precision}")
    if "hf+alloc fp32" in rate:
        compare("training step, fp32: the allocator setting's gain, measured on Hugging Face "
                "(its process given the setting over one without)", "hf+alloc fp32", "hf fp32")

    # Comparison 4: model FLOP utilisation.
    step_flops = work.flops()
    peak = F.peaks(samples, gemm_meta)
    ws.peaks.update(peak)
    goals = {"fp32": 0.85, "bf16": 0.40}
    mkl = max((samples[n].rate for n, (prec, lib, _) in gemm_meta.items()
               if prec == "fp32" and lib == "torch.matmul"), default=None)
    for precision in precisions:
        achieved = step_flops / step_seconds[f"pretextual {precision}"]
        hf_achieved = step_flops / step_seconds[f"hf {precision}"]
        mfu = achieved / peak[precision].flops_per_s
        hf_mfu = hf_achieved / peak[precision].flops_per_s
        report.add(Row("4", f"model FLOP utilisation, {precision} (of the {precision} matmul peak)",
                       f"{mfu:.0%} ({achieved / 1e9:,.0f} GFLOP/s)",
                       f"{hf_mfu:.0%} ({hf_achieved / 1e9:,.0f} GFLOP/s)", mfu, f"{mfu:.0%}",
                       goals[precision], f">= {goals[precision]:.0%}"))
        # The ceiling: the same FLOPs over the time of the step's matmuls alone.
        alone = samples[f"step matmuls {precision}"].median_seconds
        step = step_seconds[f"pretextual {precision}"]
        ceiling = step_flops / alone / peak[precision].flops_per_s
        budget = step_flops / (goals[precision] * peak[precision].flops_per_s)  # the goal's step time
        report.add(Row("4", f"model FLOP utilisation ceiling, {precision}: the step's matmuls alone, "
                            f"as if nothing else took time (pretextual's step: "
                            f"{step * 1e3:,.0f} ms)",
                       f"{ceiling:.0%} ({alone * 1e3:,.0f} ms a step)", "", ceiling,
                       f"{ceiling:.0%}"))
        report.details.append(
            f"MFU ceiling, {precision}: the step's matmuls alone (benchmarks/flops.py step_gemms: "
            f"every linear layer forward and both backward products, attention's batched "
            f"matmuls, the MLM head at the predicted rows) took {alone * 1e3:,.0f} ms, "
            f"{alone / step:.0%} of pretextual's {step * 1e3:,.0f} ms step; the rest of the step "
            f"(elementwise work, casts, softmax, LayerNorm, dropout, the optimizer) took "
            f"{(step - alone) * 1e3:,.0f} ms, where the {goals[precision]:.0%} goal "
            + (f"leaves {(budget - alone) * 1e3:,.0f} ms." if budget > alone else
               "is out of reach even if it took none."))
    if "bf16" not in precisions:
        report.details.append(
            f"bf16 not timed (--precisions {','.join(precisions)}): this machine's bf16 matmul "
            f"peak is {peak['bf16'].flops_per_s / 1e9:,.0f} GFLOP/s against fp32's "
            f"{peak['fp32'].flops_per_s / 1e9:,.0f}.")
    if mkl and "fp32" in precisions:
        report.details.append(
            f"MFU fp32 against torch.matmul's own best fp32 rate ({mkl / 1e9:,.0f} GFLOP/s, the "
            f"BLAS torch calls by default) instead of the machine's best: pretextual "
            f"{step_flops / step_seconds['pretextual fp32'] / mkl:.0%}, Hugging Face "
            f"{step_flops / step_seconds['hf fp32'] / mkl:.0%} (the table uses the best "
            f"rate any library reached, so this line is for comparison only).")
    report.details += [
        f"Training step: {s.describe()}; {predictions} MLM predictions per batch "
        f"({predictions / tokens:.1%} of the tokens); useful model FLOPs per step "
        f"{step_flops / 1e9:,.1f} GFLOP (per token {step_flops / tokens / 1e6:,.1f} MFLOP).",
        f"Optimizer (both sides): {optimizer_description(trainer.optimizer)}; gradient clipping "
        f"at {max_norm} (the fused AdamW is also what Hugging Face's Trainer picks by default, "
        f"optim=\"adamw_torch_fused\"). Hugging Face attention: "
        f"{hf_config(s, ws.vocab)._attn_implementation}. Processes: pretextual steps in the "
        f"benchmark's process, where its Trainer sets glibc's malloc to keep freed memory for "
        f"reuse (pretextual.accel.allocator.keep_freed_memory); Hugging Face steps in two spawned "
        f"processes of its own (benchmarks/isolated.py), 'hf' with glibc's defaults as its users "
        f"run it and 'hf+alloc' with the same setting as pretextual; all cases interleaved round "
        f"by round, each timed in its own process.",
        "Matmul peak measured in the same rounds: " + "; ".join(
            f"{p}: {peak[p].describe()}" for p in ("fp32", "bf16")) + ". All measured GEMMs: "
        + ", ".join(f"{name[5:]} {samples[name].rate / 1e9:,.0f}" for name in gemm_meta)
        + " GFLOP/s.",
        "Training-step times (s, from the median rates): " + ", ".join(
            f"{k} {step_seconds[k]:.3f}" for k in rate) + "; spread of tokens/s over "
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
    return lambda: trainer.loader(trainer.train_batches,
                                  list(itertools.islice(trainer.train_indices(), steps)))


class Stepper:
    """End-to-end steps of one side: fetch the next batch (timed apart), count its
    real tokens, step; keeps the totals for the report."""

    def __init__(self, batches, step, device: torch.device):
        self.batches, self.step, self.device = batches, step, device
        self.stats = {"real": 0, "positions": 0, "waited": 0.0, "spent": 0.0}

    def case(self, bf16: bool):
        def run():
            start = time.perf_counter()
            batch = to_device(next(self.batches), self.device)
            self.stats["waited"] += time.perf_counter() - start
            real = int(batch["attention_mask"].sum())
            self.stats["real"] += real
            self.stats["positions"] += batch["attention_mask"].numel()
            self.step(batch, bf16)
            self.stats["spent"] += time.perf_counter() - start
            return real
        return run


def hf_mlm_side(sizes, device: torch.device, root, optimizer: OptimizerSpec, max_norm: float,
                keep_freed: bool) -> dict:
    """Hugging Face's side of the end-to-end comparison, built in a process of its
    own: line-by-line examples of the workspace's corpus, padded to the longest in
    the batch by DataCollatorForLanguageModeling, BertForMaskedLM."""
    from transformers import DataCollatorForLanguageModeling

    kept = keep_freed and keep_freed_memory()
    ws = Workspace.reopen(sizes, device, root)
    tokenizer = hf_tokenizer(ws.tokenizer, ws.vocab)
    encoded = tokenizer(ws.lines, truncation=True, max_length=sizes.seq,
                        return_special_tokens_mask=True)
    examples = [{"input_ids": ids, "special_tokens_mask": sm}
                for ids, sm in zip(encoded["input_ids"], encoded["special_tokens_mask"])]
    collator = DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.15)
    loader_generator = torch.Generator().manual_seed(0)
    batches = Cycling(lambda: torch.utils.data.DataLoader(
        examples, batch_size=sizes.batch, shuffle=True, collate_fn=collator,
        generator=loader_generator))
    torch.manual_seed(0)
    hf = hf_model("BertForMaskedLM", sizes, ws.vocab, device)
    hf_optimizer = optimizer.build(hf)
    stepper = Stepper(batches, lambda batch, bf16: hf_step(hf, hf_optimizer, batch, bf16,
                                                           max_norm, device), device)
    return {"fp32": for_at_least(stepper.case(False), sizes.round_seconds),
            "bf16": for_at_least(stepper.case(True), sizes.round_seconds),
            "stats": lambda: {**stepper.stats, "examples": len(examples)},
            "allocator": lambda: kept}


def end_to_end(ws: Workspace, report: Report) -> None:
    """Real text, MLM only: pretextual's roberta recipe (sentences packed up to
    the sequence length, masked in its pipeline) against BertForMaskedLM fed
    line-by-line examples padded to the longest in the batch by
    DataCollatorForLanguageModeling (in processes of its own, as in
    :func:`training_step`). Batch loading is inside the timed step. Counts real
    (non-padding) tokens per second."""
    s, device = ws.sizes, ws.device
    trainer = ws.trainer("roberta")  # MLM only, full sentences
    rounds = s.warmup + s.repeats
    ours = Stepper(Cycling(_pretextual_loader(trainer, 2 * rounds + 2)),
                   lambda batch, bf16: pretextual_step(trainer, batch, bf16), device)
    optimizer = OptimizerSpec.of(trainer.optimizer)
    max_norm = trainer.cfg.trainer.max_grad_norm
    with contextlib.ExitStack() as stack:
        sides = {name: stack.enter_context(Isolated(
            "benchmarks.train:hf_mlm_side", s, device, ws.root, optimizer, max_norm, keep,
            threads=torch.get_num_threads())) for name, keep in HF_SIDES.items()}
        require_allocator_setting(sides["hf+alloc"].call("allocator"))
        cases = {f"pretextual {p}": for_at_least(ours.case(p == "bf16"), s.round_seconds)
                 for p in ws.precisions}
        for name, side in sides.items():
            cases.update({f"{name} {p}": side.case(p) for p in ws.precisions})
        samples = interleave(cases, s.repeats, s.warmup, device, settle=s.settle)
        stats = {"pretextual": ours.stats, **{name: side.call("stats") for name, side in sides.items()}}
    unit = "real tokens/s"
    for precision in ws.precisions:
        for name, label in (("hf", ""), ("hf+alloc", ", against Hugging Face given pretextual's "
                                                      "allocator setting")):
            a, b = samples[f"pretextual {precision}"].rate, samples[f"{name} {precision}"].rate
            report.add(Row("1", f"end to end on the embedded corpus, MLM, {precision} (real "
                                f"tokens, batch loading included{label})", fmt_rate(a, unit),
                           fmt_rate(b, unit), a / b, fmt_ratio(a / b)))

    def share(name, part, whole):
        return stats[name][part] / max(stats[name][whole], 1e-9)

    report.details.append(
        f"End to end: {stats['hf']['examples']:,} line-by-line examples for Hugging Face "
        f"(BertForMaskedLM, DataCollatorForLanguageModeling, padded to the longest in the "
        f"batch); pretextual's roberta recipe (full sentences packed to {s.seq}). Share of real "
        f"tokens in the batches stepped: pretextual {share('pretextual', 'real', 'positions'):.0%}, "
        f"Hugging Face {share('hf', 'real', 'positions'):.0%}. Time spent getting the next batch "
        f"(DataLoader, no workers: collate + masking in the stepping process), as a share of the "
        f"step: pretextual {share('pretextual', 'waited', 'spent'):.2%}, Hugging Face "
        f"{share('hf', 'waited', 'spent'):.2%}. " + cpu_share_line(samples, list(cases)))
