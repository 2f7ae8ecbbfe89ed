"""``pretextual ablate``: train objective mixes on the same data, to the same budget of
tokens, with the same seeds; probe every model on the same held-out data; write a report.

The budget: mixes pack text differently (sentence pairs, full sentences, short segments),
so a step holds a different number of tokens in each. Each mix's tokens per step are
measured on its first batches; the budget is ``steps`` times the smallest of them, so the
sparsest mix trains ``steps`` steps and the others fewer. Each run's learning-rate
schedule is sized to its expected steps, and a training-hook plugin stops it as soon as
the budget is reached; the report gives the tokens each run really saw.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from pretextual.analysis.probes import ProbeData, probe_data, run_probes
from pretextual.analysis.report import UNTRAINED, write_report
from pretextual.core.budget import steps_for_tokens, tokens_per_step
from pretextual.core.config import load_config, recipe_names
from pretextual.core.documents import split_documents
from pretextual.core.prepare import tokenized_corpus
from pretextual.core.tokenizer import has_word_boundaries
from pretextual.core.trainer import Trainer
from pretextual.run import trainer_for
from pretextual.errors import PretextualError
from pretextual.plugins.api import BuildContext
from pretextual.plugins.manager import Plugins

RESERVED = ("trainer.output_dir", "trainer.seed", "trainer.max_steps", "trainer.max_tokens",
            "trainer.max_time", "trainer.log_every")
RUN_PROBES = "probes.json"


class AblationError(PretextualError):
    """An ablation that cannot be set up (the message names the option)."""


@dataclass
class RunResult:
    """One trained (or, for the baseline, untrained) model and its probes."""

    mix: str
    seed: int
    run_dir: str
    steps: int
    tokens: int
    wall_time: float
    probes: dict[str, float | None]


@dataclass
class Ablation:
    """Everything the report shows."""

    mixes: list[str]
    steps: int
    seeds: int
    overrides: list[str]
    budget: int
    tokens_per_step: dict[str, float]
    probe_data: str
    """What the probes were measured on, in words."""
    runs: list[RunResult]
    tasks: list[str] = field(default_factory=list)
    protocols: list[str] = field(default_factory=list)
    downstream: dict | None = None
    """``pretextual evaluate``'s document of every trained run on the tasks."""
    mix_differences: list[dict] = field(default_factory=list)
    """Each pair of mixes on each task and protocol: difference, its se, in words."""


def mix_label(source: str) -> str:
    """A recipe's name, or a YAML file's stem."""
    return source if source in recipe_names() else Path(source).stem


def parse_mixes(text: str) -> list[str]:
    """``bert,roberta`` -> the mixes; an AblationError for none or a repeated label."""
    mixes = [m.strip() for m in text.split(",") if m.strip()]
    labels = [mix_label(m) for m in mixes]
    if not mixes:
        raise AblationError("--mixes: no mix given (e.g. --mixes bert,roberta)")
    if len(set(labels)) != len(labels):
        raise AblationError(f"--mixes: a mix is named twice ({', '.join(labels)})")
    return mixes


def check_overrides(overrides: Sequence[str]) -> None:
    """The ablation sets the run directory, seed, steps and logging of each run itself."""
    for item in overrides:
        key = item.lstrip("~").split("=", 1)[0]
        if key in RESERVED:
            raise AblationError(f"{key}: set by ablate for each run (use --out, --seeds, --steps)")


def _probe_inputs(trainer: Trainer) -> ProbeData:
    """The probes' inputs: the held-out documents of the trainer's own split."""
    cfg = trainer.cfg
    _, docs = tokenized_corpus(cfg.data, log=lambda *_: None)
    _, held_out = split_documents(docs, cfg.data.eval_fraction)
    context = BuildContext(trainer.encoder_config, trainer.vocab, cfg.data.max_seq_length,
                           has_word_boundaries(trainer.tokenizer))
    return probe_data(held_out, context, trainer.plugins, cfg.data.batch_size)


def ablate(mixes: Sequence[str], out: str | Path, steps: int = 200, seeds: int = 1,
           overrides: Sequence[str] = (), strict_plugins: bool = False,
           log: Callable[[str], None] = print, tasks: Sequence[str] = (),
           protocols: Sequence[str] = ("probe",)) -> Ablation:
    """Run the ablation into ``out``: ``runs/<mix>-seed<k>/`` and the report (report.md,
    report.json, plots); returns the results. ``overrides`` apply to every mix; each
    trained run is then scored on ``tasks`` by ``pretextual evaluate``'s ``protocols``."""
    if steps <= 0 or seeds <= 0:
        raise AblationError(f"--steps and --seeds must be positive, got {steps} and {seeds}")
    check_overrides(overrides)
    from pretextual.evaluation.evaluate import EvalSettings
    from pretextual.evaluation.tasks import load_task
    settings = EvalSettings(protocols=tuple(protocols), seeds=1)
    settings.check()
    loaded_tasks = [load_task(t, Plugins(strict=strict_plugins)) for t in tasks]  # before training
    out = Path(out)
    quiet = lambda *_: None  # noqa: E731

    def config(mix: str, *extra: str):
        # No export or plot of each run unless asked for: they would only add to every wall time.
        return load_config(mix, ["trainer.export=", "trainer.plot=false", *overrides,
                                 "trainer.log_every=1", *extra])

    # Measure each mix's tokens per step (data only, nothing trained); the probe inputs come
    # from the first mix, whose held-out split and tokenizer every mix shares.
    log(f"measuring the tokens per step of {', '.join(mix_label(m) for m in mixes)}")
    per_step, data = {}, None
    for mix in mixes:
        # Only measured, never trained: nothing is written to its output_dir, whose run
        # directories (an earlier ablation's) are the ablation's own.
        cfg = config(mix, f"trainer.max_steps={steps}", f"trainer.output_dir={out / 'runs'}",
                     "trainer.overwrite_output_dir=true")
        trainer = trainer_for(cfg, Plugins.from_config(cfg, strict=strict_plugins), quiet)
        per_step[mix_label(mix)] = tokens_per_step(trainer.train_batches,
                                                   cfg.trainer.grad_accum_steps, 1)
        data = data or _probe_inputs(trainer)
    budget = int(steps * min(per_step.values()))
    log(f"budget: {budget:,} tokens per run ({steps} steps of the sparsest mix); "
        f"probes on {data.describe()}")

    runs: list[RunResult] = []
    for seed in range(seeds):
        for index, mix in enumerate(mixes):
            label = mix_label(mix)
            run_dir = out / "runs" / f"{label}-seed{seed}"
            max_steps = steps_for_tokens(budget, per_step[label])
            # The run directories are the ablation's own: running it again replaces them.
            cfg = config(mix, f"trainer.max_tokens={budget}", f"trainer.seed={seed}",
                         f"trainer.output_dir={run_dir}", "trainer.overwrite_output_dir=true")
            plugins = Plugins.from_config(cfg, strict=strict_plugins)  # plugins.modules too
            prefix = f"[{label} seed {seed}] "
            trainer = trainer_for(cfg, plugins, lambda message: log(prefix + message))
            if index == 0:  # every mix starts from this same encoder (same seed, built first)
                runs.append(RunResult(UNTRAINED, seed, "", 0, 0, 0.0,
                                      run_probes(trainer.model, data, trainer.device)))
            log(f"{prefix}training to {budget:,} tokens (about {max_steps} steps)")
            clock = time.perf_counter()
            trainer.train()
            wall = time.perf_counter() - clock
            result = RunResult(label, seed, str(run_dir), trainer.step, trainer.tokens_total, wall,
                               run_probes(trainer.model, data, trainer.device))
            (run_dir / RUN_PROBES).write_text(json.dumps(result.probes, indent=2) + "\n")
            log(f"{prefix}{result.steps} steps, {result.tokens:,} tokens, {wall:.0f} s; probes: "
                + ", ".join(f"{k}={v:.4f}" for k, v in result.probes.items() if v is not None))
            runs.append(result)
    ablation = Ablation([mix_label(m) for m in mixes], steps, seeds, list(overrides), budget,
                        per_step, data.describe(), runs, list(tasks), list(protocols))
    if loaded_tasks:
        from pretextual.evaluation.evaluate import evaluate
        trained = [r for r in runs if r.run_dir]
        log(f"downstream: {', '.join(tasks)} ({', '.join(protocols)})")
        ablation.downstream = evaluate([r.run_dir for r in trained], loaded_tasks, settings, log)
        ablation.mix_differences = mix_differences(ablation.downstream, trained)
    log(f"report: {write_report(ablation, out)}")
    return ablation


def mix_differences(document: dict, runs: list[RunResult]) -> list[dict]:
    """Each pair of mixes, on each task and protocol: the mean over pretraining seeds of
    the difference between their runs of one seed, and its standard error (the spread of
    those differences over the seeds, plus their own standard errors)."""
    from pretextual.evaluation.report import verdict
    run_of = {(r.mix, r.seed): r.run_dir for r in runs}
    mixes = list(dict.fromkeys(r.mix for r in runs))
    seeds = sorted({r.seed for r in runs})
    found = []
    for task, result in document["tasks"].items():
        pairs = {(p["a"], p["b"], p["protocol"]): p for p in result["pairs"]}
        for i, a in enumerate(mixes):
            for b in mixes[i + 1:]:
                for protocol in document["settings"]["protocols"]:
                    diffs, ses = [], []
                    for seed in seeds:
                        pair = pairs[(run_of[(a, seed)], run_of[(b, seed)], protocol)]
                        diffs.append(pair["difference"])
                        ses.append(pair["se"])
                    k = len(diffs)
                    mean = sum(diffs) / k
                    spread = sum((d - mean) ** 2 for d in diffs) / (k - 1) if k > 1 else 0.0
                    se = math.sqrt(spread / k + sum(e * e for e in ses) / k / k)
                    found.append({"task": task, "protocol": protocol, "a": a, "b": b,
                                  "difference": mean, "se": se, "verdict": verdict(mean, se)})
    return found
