"""The benchmark command: every comparison of pretextual against Hugging Face.

    python -m benchmarks                 # full run at the reference sizes; writes docs/benchmarks.md
    python -m benchmarks --smoke         # tiny sizes, one round: checks it runs (CI); writes nothing
    python -m benchmarks --only train,mfu --out /tmp/bench.md

Each comparison runs its cases interleaved round by round after warm-up,
with a short idle before each case, and reports medians. pretextual runs in
this process; Hugging Face's training steps and each onnxruntime session run
in processes of their own (benchmarks/isolated.py), as their users run them.
transformers, onnx and onnxruntime are benchmark-only dependencies
(``pip install -e ".[bench]"``).
"""

from __future__ import annotations

import argparse
import datetime
import shlex
import sys
import tempfile
import time
import warnings
from dataclasses import replace
from pathlib import Path

import torch

from benchmarks.report import Report
from benchmarks.timing import OtherLoad, load_average, machine_info
from benchmarks.workloads import REFERENCE, SMOKE, Workspace

SECTIONS = ("train", "e2e", "mask", "onnx", "prep", "quality", "modernbert", "attention")
"""train: comparisons 1 (synthetic step) and 4 (MFU); e2e: comparison 1 on real text;
mask: 2; onnx: 3; prep: 5; quality: 6 (time to quality); modernbert: 7 (ModernBERT's
training step and MFU); attention: 8 (document-masked attention kernels)."""

DEFAULT_OUT = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"

NOTES = [
    "Training step (1): pretextual's `Trainer` built from the `bert` recipe (MLM + NSP) at the "
    "reference sizes, stepped with its own forward (`Trainer.forward`: one encoder pass, sparse "
    "MLM head at the labelled positions only), against transformers' `BertForPreTraining` with "
    "`attn_implementation=\"sdpa\"` on the same masked batch tensors. Both sides: backward, "
    "gradient clipping, the optimizer pretextual's Trainer builds (Hugging Face gets an instance "
    "with the same class and settings, and its Trainer's no-decay grouping), zero_grad, loss "
    "read as a float. bf16 rows use `torch.autocast(dtype=torch.bfloat16)` on both sides. "
    "Hugging Face steps in processes of its own, spawned for the comparison: one with glibc's "
    "malloc defaults, as its users run it (the rows without a qualifier), and one given the "
    "process-wide allocator setting pretextual's Trainer makes (rows that say so), which "
    "measures how much of the lead is that setting.",
    "End to end (1): real text of the embedded corpus. Hugging Face: line-by-line examples "
    "(one sentence each) padded to the longest in the batch by `DataCollatorForLanguageModeling`, "
    "`BertForMaskedLM`. pretextual: the `roberta` recipe (MLM only; sentences packed up to the "
    "sequence length; masking in its data pipeline). Both read batches from a DataLoader with "
    "no worker processes, inside the timed step; only real (non-padding) tokens count. The "
    "tokenizer is the same WordPiece for both, trained on the corpus and filled to the "
    "reference vocabulary size with [unusedN] entries.",
    "Masking (2): the time from a list of tokenized examples to padded tensors with labels. "
    "Hugging Face's whole-word masking needs offset mappings, which its padding cannot pad, so "
    "its examples are padded to the sequence length at tokenization (as its users do); only "
    "real tokens count on both sides.",
    "Inference (3): see `benchmarks/inference.py`; speed-ups are over pretextual's encoder "
    "in torch eager (`torch.inference_mode`, same thread count).",
    "MFU (4): useful model FLOPs per training step (6 x layer parameters per token, attention "
    "scores and their use, the MLM head only at labelled positions, pooler and NSP head per "
    "sequence; nothing for padding or for unlabelled MLM positions) divided by the median step "
    "time, over the best median GEMM rate measured in the same rounds (large squares and the "
    "model's own feed-forward shapes, fp32 through torch.matmul and through oneDNN, bf16 "
    "through torch.matmul; each case repeats its GEMM back to back for 20 GFLOP, so the rate is "
    "a steady one). Hugging Face's column is the same useful FLOPs over its step time. The "
    "ceiling rows time every matmul of pretextual's step alone, with the step's shapes and "
    "operand layouts (`benchmarks/flops.py` step_gemms, the same FLOPs as the useful count to "
    "within 0.5%), in the same rounds: the MFU the step would have if nothing but its matmuls "
    "took time.",
    "Corpus preparation (5): see `benchmarks/prep.py`.",
    "Time to quality (6): the main job's vocabulary, sequence length and batch (8192, 64, 64) "
    "and its model trained on the embedded corpus for the same wall-clock budget by "
    "pretextual (`Trainer`, the main job's `modernbert` recipe: ModernBERT's tiny preset, MLM "
    "only, sentences packed, document attention, its default learning rate and warm-up "
    "share, the steps sized to the budget) and by transformers (`DataCollatorForLanguageModeling` "
    "with mlm_probability 0.15, `transformers.Trainer`, line-by-line examples, in a process of "
    "its own; same tokenizer, batch size, warm-up share, linear decay, AdamW settings and "
    "clipping), once with `ModernBertForMaskedLM` built from the config pretextual exports its "
    "encoder as (the same model, pretextual's learning rate) and once with `BertForMaskedLM` "
    "at the `bert` recipe's tiny preset (an encoder 3% larger; a peak learning rate of 5e-4, "
    "as pretextual's 3e-3 collapsed it). Each side writes checkpoints at fixed "
    "fractions of its training time (the time spent writing them is not counted), and "
    "`pretextual evaluate` scores every checkpoint with the frozen-feature probe of the "
    "word-order task (held-out stdlib docstring sentences, half with adjacent words swapped, "
    "grouped cross-validation), same splits and seeds for all. Time to a score is "
    "interpolated linearly between checkpoints; see `benchmarks/quality.py`.",
    "ModernBERT training step (7): pretextual's `Trainer` with `model.architecture=modernbert` "
    "(the `roberta` recipe: MLM only, logits at the labelled positions only) at the reference "
    "sizes with ModernBERT's intermediate ratio (1.5x hidden), against transformers' "
    "`ModernBertForMaskedLM` (`attn_implementation=\"sdpa\"`) on the same masked batch, stepped "
    "as in comparison 1, in processes of its own given pretextual's allocator setting: once as "
    "configured by default (`sparse_prediction=False`, logits at every position) and once with "
    "`sparse_prediction=True` (equal FLOPs). The FLOP-ratio ceiling is transformers' FLOPs per "
    "step over pretextual's (`benchmarks/flops.py` ModernBertStepWork: local layers count their "
    "window only): the speed-up fewer FLOPs alone would give at equal efficiency. See "
    "`benchmarks/modernbert.py`.",
    "Document attention (8): `F.scaled_dot_product_attention` with a dense block-diagonal mask "
    "(boolean, and additive as the model passes it) against FlexAttention with a BlockMask "
    "(`torch.compile`d, and eager), on random tensors with about four documents per row; the "
    "call alone, and the building of each mask from document ids. See `benchmarks/attention.py`.",
    "Interleaving: every case runs once per round, rounds alternate the order, and each case "
    f"starts after {REFERENCE.settle} s of idle, so the threads the previous case left spinning (OpenMP's, "
    "onnxruntime's), in this process or another, are asleep; without it onnxruntime measured "
    "up to 1.7x slower than when run alone. A case in another process is timed there, around "
    "the case only. A training case (synthetic and end to end, either side) repeats its step "
    f"within a round until {REFERENCE.round_seconds:g} s have passed, so a fast step's round "
    "spans several steps, about as long as the slower side's one, and a stall of a shared "
    "machine weighs on both alike (`benchmarks/timing.py` for_at_least).",
    "No timing is asserted anywhere; CI runs `python -m benchmarks --smoke` (tiny sizes, one "
    "round) so the benchmark cannot rot.",
]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true",
                        help="tiny sizes and one round: proves the benchmark runs (writes no file "
                             "unless --out is given)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    parser.add_argument("--threads", type=int, default=2, help="torch/onnxruntime threads (default 2)")
    parser.add_argument("--repeats", type=int, help="timed rounds per comparison")
    parser.add_argument("--warmup", type=int, help="untimed rounds before them")
    parser.add_argument("--only", default=",".join(SECTIONS),
                        help=f"comma-separated sections to run (default all: {','.join(SECTIONS)})")
    parser.add_argument("--precisions", default="fp32,bf16",
                        help="training precisions to time (default fp32,bf16; fp32 alone where "
                             "the CPU has no native bf16 and a bf16 step takes a minute)")
    parser.add_argument("--out", type=Path,
                        help=f"where to write the markdown table (default {DEFAULT_OUT} for a "
                             f"full run of every section; none for --smoke)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> Report:
    args = parse_args(argv)
    only = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = sorted(set(only) - set(SECTIONS))
    if unknown:
        raise SystemExit(f"--only: unknown section(s) {', '.join(unknown)} (known: {', '.join(SECTIONS)})")
    precisions = tuple(p.strip() for p in args.precisions.split(",") if p.strip())
    if not precisions or set(precisions) - {"fp32", "bf16"}:
        raise SystemExit(f"--precisions: {args.precisions!r} (known: fp32, bf16)")
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no CUDA device")
    torch.set_num_threads(args.threads)
    sizes = SMOKE if args.smoke else REFERENCE
    if args.repeats is not None:
        sizes = replace(sizes, repeats=args.repeats)
    if args.warmup is not None:
        sizes = replace(sizes, warmup=args.warmup)
    out = args.out
    if out is None and not args.smoke and only == list(SECTIONS):
        out = DEFAULT_OUT

    command = "python -m benchmarks" + "".join(f" {shlex.quote(a)}" for a in (argv if argv is not None else sys.argv[1:]))
    mode = ("smoke (tiny sizes, one round: proves the benchmark runs; the numbers mean nothing)"
            if args.smoke else f"reference sizes, {sizes.repeats} timed rounds after {sizes.warmup} "
                               f"warm-up rounds")
    machine = machine_info(device)
    machine["date (UTC)"] = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M")
    machine["load average at start (1 min)"] = load_average()
    report = Report(command=command, mode=mode, machine=machine, notes=list(NOTES), smoke=args.smoke)
    if device.type == "cuda":
        report.notes.append("On CUDA, MFU is against the GPU's measured fp32 and bf16 GEMM peaks; "
                            "the masking, ONNX and preparation comparisons run on the CPU.")
    else:
        report.notes.append("`--device cuda` runs the same comparisons on a GPU (MFU against its "
                            "measured bf16 and fp32 GEMM peaks). These numbers are CPU-only: the "
                            "benchmark has not been run on a GPU.")

    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="pretextual-bench-") as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ws = Workspace.create(sizes, device, Path(tmp), precisions)
        runners = _runners()
        busy: dict[str, float | None] = {}
        for section in SECTIONS:
            if section not in only:
                continue
            t, others = time.perf_counter(), OtherLoad()
            print(f"[benchmarks] {section} ...", file=sys.stderr, flush=True)
            runners[section](ws, report)
            share = others.share()
            busy[section] = share
            report.details.append(
                f"Section {section} took {time.perf_counter() - t:.0f} s; other processes used "
                + ("n/a" if share is None else f"{share:.0%}") + " of the cores meanwhile.")
    report.machine["load average at end (1 min)"] = load_average()
    measured = {k: v for k, v in busy.items() if v is not None}
    if measured:
        worst = max(measured, key=measured.get)
        report.machine["other processes' share of the cores (busiest section)"] = (
            f"{measured[worst]:.0%} ({worst})")
        if measured[worst] > 0.10:
            report.warning = (f"Other processes used {measured[worst]:.0%} of the cores during the "
                              f"'{worst}' section of this run: its numbers understate what a quiet "
                              f"machine gives (see Details).")
    report.machine["wall time of the run"] = f"{time.perf_counter() - started:.0f} s"

    print(report.markdown())
    if out is not None:
        report.write(out)
        print(f"[benchmarks] wrote {out}", file=sys.stderr)
    return report


def _runners():
    from benchmarks.inference import onnx_inference
    from benchmarks.attention import document_attention
    from benchmarks.masking import masking
    from benchmarks.modernbert import modernbert_training_step
    from benchmarks.prep import preparation
    from benchmarks.quality import time_to_quality
    from benchmarks.train import end_to_end, training_step

    return {"train": training_step, "e2e": end_to_end, "mask": masking, "onnx": onnx_inference,
            "prep": preparation, "quality": time_to_quality,
            "modernbert": modernbert_training_step, "attention": document_attention}
