"""Comparison 7: pretextual's ModernBERT training step against transformers'
ModernBertForMaskedLM, tokens per second and model FLOP utilisation.

Both sides step the same masked full batch at the reference sizes (ModernBERT's own
intermediate ratio, 1.5x hidden) as train.py's comparison 1 does: pretextual's
Trainer (the roberta recipe, MLM only, model.architecture=modernbert) in this
process, and transformers in processes of their own given pretextual's allocator
setting (like for like), once as its users get it (sparse_prediction=False: logits
at every position) and once with sparse_prediction=True (logits at the labelled
positions only, as pretextual computes them: equal FLOPs).
"""

from __future__ import annotations

import contextlib

import torch

from benchmarks import flops as F
from benchmarks.isolated import Isolated
from benchmarks.report import Report, Row, fmt_rate, fmt_ratio
from benchmarks.timing import for_at_least, interleave
from benchmarks.train import (cpu_share_line, hf_step, pretextual_step,
                              require_allocator_setting)
from benchmarks.workloads import (OptimizerSpec, Workspace, masked_step, optimizer_description,
                                  to_device)
from pretextual.accel.allocator import keep_freed_memory

SIDES = {"hf": False, "hf sparse": True}
"""transformers' processes: name -> sparse_prediction."""


def hf_modernbert_config(config, vocab, sparse: bool):
    """transformers' ModernBertConfig of pretextual's encoder config, SDPA attention."""
    from transformers import ModernBertConfig

    return ModernBertConfig(
        vocab_size=config.vocab_size, hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size, num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads,
        max_position_embeddings=config.max_position_embeddings,
        global_attn_every_n_layers=config.global_attn_every_n_layers,
        local_attention=config.local_attention, global_rope_theta=config.global_rope_theta,
        local_rope_theta=config.local_rope_theta, pad_token_id=vocab.pad_id,
        cls_token_id=vocab.cls_id, sep_token_id=vocab.sep_id, bos_token_id=vocab.cls_id,
        eos_token_id=vocab.sep_id, sparse_prediction=sparse, attn_implementation="sdpa")


def hf_modernbert_side(config, vocab, batch, optimizer: OptimizerSpec, max_norm: float,
                       device: torch.device, sparse: bool, round_seconds: float) -> dict:
    """transformers' side, built in a process of its own (benchmarks.isolated) and given
    pretextual's allocator setting: ModernBertForMaskedLM stepped on ``batch``."""
    from transformers import ModernBertForMaskedLM

    kept = keep_freed_memory()
    torch.manual_seed(0)
    model = ModernBertForMaskedLM(hf_modernbert_config(config, vocab, sparse)).to(device).train()
    hf_optimizer = optimizer.build(model)
    inputs = to_device({"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"],
                        "labels": batch["mlm_labels"]}, device)
    tokens = batch["input_ids"].numel()

    def step(bf16):
        return for_at_least(lambda: (hf_step(model, hf_optimizer, inputs, bf16, max_norm, device),
                                     tokens)[1], round_seconds)

    return {"fp32": step(False), "bf16": step(True), "allocator": lambda: kept,
            "attention": lambda: model.config._attn_implementation}


def modernbert_training_step(ws: Workspace, report: Report) -> None:
    s, device = ws.sizes, ws.device
    trainer = ws.trainer("roberta", "model.architecture=modernbert",
                         f"model.intermediate_size={round(1.5 * s.hidden)}")
    config = trainer.model.bert.config
    if trainer.mix.names != ["mlm"] or config.architecture != "modernbert":
        raise RuntimeError(f"expected a modernbert MLM run, got {config.architecture} "
                           f"with {trainer.mix.names}")
    step = masked_step(trainer, s, ws.vocab, device)
    batch, predictions, tokens = step.batch, step.predictions, step.tokens
    max_norm, optimizer = step.max_norm, step.optimizer
    precisions = ws.precisions

    with contextlib.ExitStack() as stack:
        sides = {name: stack.enter_context(Isolated(
            "benchmarks.modernbert:hf_modernbert_side", config, ws.vocab,
            {k: v.clone() for k, v in step.host_batch.items()}, optimizer, max_norm, device, sparse,
            s.round_seconds, threads=torch.get_num_threads())) for name, sparse in SIDES.items()}
        for side in sides.values():
            require_allocator_setting(side.call("allocator"))
        attention = sides["hf"].call("attention")
        cases = {}
        for p in precisions:
            cases[f"pretextual {p}"] = for_at_least(
                lambda bf16=p == "bf16": (pretextual_step(trainer, batch, bf16), tokens)[1],
                s.round_seconds)
            cases.update({f"{name} {p}": side.case(p) for name, side in sides.items()})
        shapes = F.peak_shapes(tokens, s.hidden, 2 * config.intermediate_size, smoke=s.smoke,
                               device=device)
        gemms, gemm_meta = F.gemm_cases(shapes, device, min_flops=0.0 if s.smoke else 2e10)
        cases.update(gemms)
        samples = interleave(cases, s.repeats, s.warmup, device, settle=s.settle)

    steps = [k for k in cases if not k.startswith("gemm ")]
    rate = {k: samples[k].rate for k in steps}
    work = {name: F.ModernBertStepWork(
        config.num_hidden_layers, config.hidden_size, config.intermediate_size, config.vocab_size,
        (s.seq,) * s.batch, rows, config.global_attn_every_n_layers, config.local_attention)
        for name, rows in (("pretextual", predictions), ("hf", tokens), ("hf sparse", predictions))}
    ceiling = {name: work[name].flops() / work["pretextual"].flops() for name in SIDES}
    unit = "tokens/s"
    goals = {"hf": 2.0, "hf sparse": 1.0}
    against = {"hf": "transformers' default (sparse_prediction=False: logits at every position)",
               "hf sparse": "transformers with sparse_prediction=True (logits at the labelled "
                            "positions only, equal FLOPs)"}
    for precision in precisions:
        for name in SIDES:
            ours, theirs = rate[f"pretextual {precision}"], rate[f"{name} {precision}"]
            ratio = ours / theirs
            report.add(Row("7", f"ModernBERT training step, {precision}"
                                f"{' (bf16 autocast on both sides)' if precision == 'bf16' else ''}"
                                f", against {against[name]}; FLOP-ratio ceiling "
                                f"{ceiling[name]:.2f}x", fmt_rate(ours, unit),
                           fmt_rate(theirs, unit), ratio, fmt_ratio(ratio), goals[name],
                           f">= {goals[name]:g}x" if name == "hf" else "> 1x"))
    peak = F.peaks(samples, gemm_meta)
    for precision in precisions:
        # Useful FLOPs: the sparse head's for pretextual and transformers' sparse side, the
        # dense head's for transformers' default (it does that work, at every position).
        achieved = {name: work[name].flops() * rate[f"{name} {precision}"] / tokens
                    for name in ("pretextual", *SIDES)}
        mfu = {name: value / peak[precision].flops_per_s for name, value in achieved.items()}
        report.add(Row("7", f"ModernBERT model FLOP utilisation, {precision} (of the {precision} "
                            f"matmul peak; transformers' column: default / sparse_prediction=True, "
                            f"each over the FLOPs it does)",
                       f"{mfu['pretextual']:.0%} ({achieved['pretextual'] / 1e9:,.0f} GFLOP/s)",
                       f"{mfu['hf']:.0%} / {mfu['hf sparse']:.0%}", mfu["pretextual"],
                       f"{mfu['pretextual']:.0%}"))
    flops = {name: w.flops() for name, w in work.items()}
    report.details += [
        f"ModernBERT (7): {config.num_hidden_layers} layers, hidden {config.hidden_size}, "
        f"{config.num_attention_heads} heads, intermediate {config.intermediate_size} (GeGLU), "
        f"global attention every {config.global_attn_every_n_layers} layers and a window of "
        f"{config.local_attention} in the others, vocab {config.vocab_size}, sequence {s.seq}, "
        f"batch {s.batch}; {predictions} MLM predictions per batch ({predictions / tokens:.1%}). "
        f"FLOPs per step: pretextual {flops['pretextual'] / 1e9:,.1f} GFLOP, transformers' "
        f"default {flops['hf'] / 1e9:,.1f}, sparse_prediction=True "
        f"{flops['hf sparse'] / 1e9:,.1f}. Optimizer (both sides): "
        f"{optimizer_description(trainer.optimizer)}; clipping at {max_norm}. transformers' "
        f"attention: {attention}; its processes given pretextual's allocator setting.",
        f"ModernBERT matmul peak in the same rounds: "
        + "; ".join(f"{p}: {peak[p].describe()}" for p in ("fp32", "bf16")) + ".",
        "ModernBERT training-step times (s, from the median rates): " + ", ".join(
            f"{k} {tokens / rate[k]:.3f}" for k in rate) + "; spread of tokens/s over the "
        "rounds: " + ", ".join(f"{k} {samples[k].spread()[0]:,.0f}-{samples[k].spread()[1]:,.0f}"
                               for k in rate) + ".",
        "ModernBERT: " + cpu_share_line(samples, rate),
    ]
