"""Comparison 6, time to quality: models of about one size trained on the same corpus for the same
wall-clock budget by pretextual and by what a Hugging Face user runs, each checkpoint
scored downstream by ``pretextual evaluate`` (the frozen-feature probe of the word-order
task, same splits and seeds for every model).

pretextual: ``Trainer`` with the main job's recipe (:data:`RECIPE`: ModernBERT's tiny preset,
MLM only, sentences packed up to the sequence length, document attention), its default
learning rate and share of warm-up steps, the steps sized to the budget.
Hugging Face, one arm per model class (:data:`HF_ARMS`): ``DataCollatorForLanguageModeling``
(mlm_probability 0.15) + ``transformers.Trainer`` on line-by-line examples (one sentence
each, as run_mlm.py --line_by_line builds them), in a process of its own, training
``ModernBertForMaskedLM`` with the config pretextual's encoder exports as (the same model)
and ``BertForMaskedLM`` with the ``bert`` recipe's tiny preset (a BERT of about the same
size); the same tokenizer, batch size, warm-up share, linear decay, AdamW settings and
gradient clipping, and each arm's peak learning rate.

Each side first measures its seconds per step (a short run of its own, thrown away), so
that its learning-rate schedule ends at the budget, then trains from a fresh model. Its
clock starts when its trainer's ``train()`` is called and stops while a checkpoint is
written; a checkpoint is written at the first step end after each fraction of the budget
(:data:`FRACTIONS`), the last one ending the run.
"""

from __future__ import annotations

import contextlib
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from benchmarks.isolated import Isolated
from benchmarks.report import Report, Row
from benchmarks.workloads import QUALITY, Sizes, Workspace, hf_tokenizer
from pretextual.core.config import DEFAULT_RECIPE
from pretextual.plugins.hookspecs import hookimpl

RECIPE = DEFAULT_RECIPE
"""The main job's recipe: MLM only, the objective the Hugging Face classes train."""
TASK = "word-order"
"""Word order, not vocabulary, separates a pretrained encoder's frozen features from an
untrained one's at this scale (docs/evaluation.md); python-packages' probe does not."""
FRACTIONS = (0.05, 0.1, 0.2, 1 / 3, 0.4, 0.6, 0.8, 1.0)
"""Where in the budget each side writes a checkpoint (1/3: the 3x goal)."""
SMOKE_FRACTIONS = (0.5, 1.0)
"""Two checkpoints a side at the smoke sizes: the probe's fits dominate a smoke run."""
BUDGET_SECONDS = 270.0
"""Wall-clock training time of each side at the reference sizes."""
SMOKE_BUDGET_SECONDS = 2.0
CALIBRATION_SHARE = 0.08
"""The share of the budget each side's step-time measurement runs for (at least 3 steps)."""
SKIP_STEPS = 2
"""Steps of the measurement run not counted (the first steps are slow)."""


def _default_warmup_share() -> float:
    from pretextual.core.config import TrainerConfig
    defaults = TrainerConfig()
    return defaults.warmup_steps / defaults.max_steps


WARMUP_SHARE = _default_warmup_share()
"""pretextual's default trainer.warmup_steps over its default trainer.max_steps."""
EVAL_SEEDS = 3
SMOKE_EVAL_SEEDS = 1


@dataclass(frozen=True)
class HfArm:
    """One Hugging Face side: the transformers class it trains, the shipped recipe whose
    encoder config (exported as transformers reads it) it is built from, its peak
    learning rate (None: pretextual's) and why that rate, for the report."""

    model_class: str
    recipe: str
    lr: float | None
    why: str


HF_ARMS = (
    HfArm("ModernBertForMaskedLM", RECIPE, None,
          "pretextual's: the same model, so the same settings"),
    HfArm("BertForMaskedLM", "bert", 5e-4,
          "RoBERTa's for a model this size: at 3e-3 line-by-line training collapsed the "
          "post-LN encoder below its untrained probe score"),
)


# --- the pure logic ---------------------------------------------------------------------------

class Clock:
    """Training time: from :meth:`start`, not counting the time spent inside :meth:`paused`."""

    def __init__(self, now=time.perf_counter):
        self.now, self.started, self.excluded = now, None, 0.0

    def start(self) -> None:
        self.started, self.excluded = self.now(), 0.0

    def elapsed(self) -> float:
        return 0.0 if self.started is None else self.now() - self.started - self.excluded

    @contextlib.contextmanager
    def paused(self):
        begin = self.now()
        try:
            yield
        finally:
            self.excluded += self.now() - begin


@dataclass
class Checkpoint:
    """One saved model: the budget fraction it was due at, the training seconds and steps it had."""

    fraction: float
    seconds: float
    step: int
    path: str


@dataclass
class Schedule:
    """Which budget fractions have come due; the last one ends the run."""

    budget: float
    fractions: tuple[float, ...]
    taken: list[Checkpoint] = field(default_factory=list)

    def due(self, elapsed: float, ended: bool = False) -> list[float]:
        """The fractions not yet taken whose time has come (in order); all of them when the
        run has ``ended`` (its schedule's last step came before the budget was spent)."""
        done = {c.fraction for c in self.taken}
        return [f for f in self.fractions
                if f not in done and (ended or elapsed >= f * self.budget)]

    @property
    def finished(self) -> bool:
        return bool(self.taken) and self.taken[-1].fraction == self.fractions[-1]


def steps_for(budget: float, seconds_per_step: float) -> tuple[int, int]:
    """(max_steps, warmup_steps) of a schedule that ends at ``budget`` seconds, with
    pretextual's default share of warm-up steps."""
    steps = max(1, int(budget / max(seconds_per_step, 1e-9)))
    return steps, max(1, round(WARMUP_SHARE * steps))


def time_to_reach(points: list[tuple[float, float]], target: float) -> tuple[float | None, bool]:
    """When a curve of (seconds, score) first reaches ``target``, by linear interpolation
    between the two checkpoints around the crossing: (seconds, False); (seconds of the
    first checkpoint, True) when that one already reaches it (the time is an upper bound);
    (None, False) when no checkpoint does."""
    points = sorted(points)
    for i, (t, s) in enumerate(points):
        if s >= target:
            if i == 0:
                return t, True
            t0, s0 = points[i - 1]
            return t0 + (t - t0) * (target - s0) / (s - s0), False
    return None, False


def fmt_score(entry: dict) -> str:
    return f"{entry['mean']:.3f} +/- {entry['std']:.3f}"


def fmt_reach(seconds: float | None, bound: bool, budget: float) -> str:
    if seconds is None:
        return "not reached"
    return f"{'<= ' if bound else ''}{seconds:,.0f} s ({seconds / budget:.0%} of the budget)"


# --- pretextual's side ------------------------------------------------------------------------

class WallClockCheckpoints:
    """A training-hook plugin: a checkpoint (``trainer.save()``, its time off the clock) at
    the first step end after each fraction of the budget; at the last fraction, or at
    trainer.max_steps, it stops the run, whose own final checkpoint is then that one."""

    def __init__(self, schedule: Schedule, clock: Clock):
        self.schedule, self.clock = schedule, clock
        self.tokens = 0

    @hookimpl
    def pretextual_on_step_end(self, step, metrics, trainer):
        self.tokens += int(metrics["tokens"])
        elapsed = self.clock.elapsed()
        final = trainer.out / "checkpoints" / f"step-{step:07d}"
        due = self.schedule.due(elapsed, ended=step >= trainer.cfg.trainer.max_steps)
        if not due:
            return
        if due[-1] == self.schedule.fractions[-1]:
            trainer.should_stop = True  # the training loop writes this step's checkpoint
            path = final
        else:
            with self.clock.paused():
                path = trainer.save()
        self.schedule.taken += [Checkpoint(f, elapsed, step, str(path)) for f in due]


class StopAfter:
    """A training-hook plugin for the step-time measurement: stops after ``seconds``
    (and ``min_steps``), remembering when each step ended."""

    def __init__(self, seconds: float, min_steps: int, clock: Clock):
        self.seconds, self.min_steps, self.clock = seconds, min_steps, clock
        self.ends: list[float] = []

    @hookimpl
    def pretextual_on_step_end(self, step, metrics, trainer):
        self.ends.append(self.clock.elapsed())
        if self.clock.elapsed() >= self.seconds and step >= self.min_steps:
            trainer.should_stop = True


def seconds_per_step(ends: list[float]) -> float:
    """Mean step time from the step end times of a measurement run, its first steps left out."""
    skip = min(SKIP_STEPS, len(ends) - 2) if len(ends) > 2 else 0
    kept = ends[skip:]
    if len(kept) < 2:
        return kept[-1] / max(len(ends), 1)
    return (kept[-1] - kept[0]) / (len(kept) - 1)


def _pretextual_config(ws: Workspace, *overrides: str):
    return ws.config(RECIPE, "trainer.export=", "trainer.plot=false", "trainer.loggers=[]",
                     "trainer.log_every=1", "trainer.eval_every=0", "trainer.seed=0",
                     "trainer.checkpoint_every=1000000000", "trainer.keep_checkpoints=1000",
                     *overrides, sized=False)


def hf_config_json(ws: Workspace, recipe: str, model_class: str) -> dict:
    """config.json of ``recipe``'s encoder at the workspace's vocabulary, as pretextual
    exports it for ``model_class``: the Hugging Face side builds its model from it."""
    from pretextual.core.trainer import encoder_config
    from pretextual.exporters.hf import config_json

    cfg = ws.config(recipe, sized=False)
    return config_json(encoder_config(cfg, ws.vocab.size, ws.vocab.pad_id), model_class, ws.vocab)


def pretextual_side(ws: Workspace, budget: float, fractions: tuple[float, ...],
                    measure: float) -> dict:
    from pretextual.core.trainer import Trainer
    from pretextual.plugins.manager import Plugins

    quiet = lambda *_: None  # noqa: E731
    clock = Clock()
    cfg = _pretextual_config(ws, "trainer.max_steps=1000000")
    stop = StopAfter(measure, SKIP_STEPS + 3, clock)
    plugins = Plugins.from_config(cfg)
    plugins.register(stop, name="bench-measure")
    trainer = Trainer(cfg, plugins, quiet)
    clock.start()
    trainer.train()
    per_step = seconds_per_step(stop.ends)
    del trainer

    max_steps, warmup = steps_for(budget, per_step)
    cfg = _pretextual_config(ws, f"trainer.max_steps={max_steps}", f"trainer.warmup_steps={warmup}")
    clock, schedule = Clock(), Schedule(budget, fractions)
    saver = WallClockCheckpoints(schedule, clock)
    plugins = Plugins.from_config(cfg)
    plugins.register(saver, name="bench-wall-clock-checkpoints")
    trainer = Trainer(cfg, plugins, quiet)
    clock.start()
    trainer.train()
    optimizer = trainer.optimizer.defaults
    return {"checkpoints": schedule.taken, "seconds_per_step": per_step, "max_steps": max_steps,
            "warmup": warmup, "steps": trainer.step, "tokens": saver.tokens,
            "parameters": sum(p.numel() for p in trainer.model.bert.parameters()),
            "lr": optimizer["lr"], "betas": tuple(optimizer["betas"]), "eps": optimizer["eps"],
            "weight_decay": trainer.cfg.trainer.weight_decay,
            "max_grad_norm": trainer.cfg.trainer.max_grad_norm}


# --- Hugging Face's side (in a process of its own) ----------------------------------------------

class _Examples(torch.utils.data.Dataset):
    def __init__(self, rows):
        self.rows = rows

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return self.rows[i]


def _hf_callback(schedule: Schedule | None, clock: Clock, save, stop_after: float | None = None):
    from transformers import TrainerCallback

    class WallClock(TrainerCallback):
        """Checkpoints at the budget fractions (save_pretrained of model and tokenizer,
        off the clock), the last ending the run; or, measuring, a stop after ``stop_after``."""

        ends: list[float] = []

        def on_train_begin(self, args, state, control, **kwargs):
            clock.start()

        def on_step_end(self, args, state, control, **kwargs):
            elapsed = clock.elapsed()
            self.ends.append(elapsed)
            if schedule is None:
                if elapsed >= stop_after and state.global_step >= SKIP_STEPS + 3:
                    control.should_training_stop = True
                return
            due = schedule.due(elapsed, ended=state.global_step >= state.max_steps)
            last = schedule.fractions[-1]
            if not due:
                return
            with clock.paused():
                path = save(state.global_step)
            schedule.taken += [Checkpoint(f, elapsed, state.global_step, path) for f in due]
            if due[-1] == last:
                control.should_training_stop = True

    callback = WallClock()
    callback.ends = []
    return callback


def hf_quality_side(sizes: Sizes, device: torch.device, root: Path, settings: dict) -> dict:
    """Built in the child process: the run, called once."""
    return {"run": lambda: _hf_run(sizes, device, root, settings)}


def _hf_run(sizes: Sizes, device: torch.device, root: Path, settings: dict) -> dict:
    import transformers
    from transformers import DataCollatorForLanguageModeling, TrainingArguments

    transformers.logging.set_verbosity_error()
    ws = Workspace.reopen(sizes, device, root)
    tokenizer = hf_tokenizer(ws.tokenizer, ws.vocab)
    # Saved with the checkpoints: `pretextual evaluate` then probes them at the length they
    # were trained on, as it probes pretextual's (else at up to 128 tokens).
    tokenizer.model_max_length = sizes.seq
    encoded = tokenizer(ws.lines, truncation=True, max_length=sizes.seq,
                        return_special_tokens_mask=True)
    examples = _Examples([{"input_ids": ids, "special_tokens_mask": sm}
                          for ids, sm in zip(encoded["input_ids"], encoded["special_tokens_mask"])])
    collator = DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.15)
    out = Path(settings["out"])

    config = transformers.AutoConfig.for_model(**settings["config"], attn_implementation="sdpa")

    def trainer(max_steps: int, warmup: int, callback, run: str):
        transformers.set_seed(0)  # as run_mlm.py: before the model is built
        model = getattr(transformers, settings["model_class"])(config).to(device).train()
        args = TrainingArguments(
            output_dir=str(out / run), per_device_train_batch_size=sizes.batch,
            learning_rate=settings["lr"], weight_decay=settings["weight_decay"],
            adam_beta1=settings["betas"][0], adam_beta2=settings["betas"][1],
            adam_epsilon=settings["eps"], max_grad_norm=settings["max_grad_norm"],
            lr_scheduler_type="linear", max_steps=max_steps, warmup_steps=warmup,
            save_strategy="no", report_to="none", disable_tqdm=True, seed=0,
            use_cpu=device.type == "cpu", dataloader_num_workers=0)
        return transformers.Trainer(model=model, args=args, train_dataset=examples,
                                    data_collator=collator, callbacks=[callback]), model

    measure = _hf_callback(None, Clock(), None, settings["measure"])
    hf, _ = trainer(10 ** 6, 1, measure, "measure")
    hf.train()
    per_step = seconds_per_step(measure.ends)
    del hf

    budget = settings["budget"]
    max_steps, warmup = steps_for(budget, per_step)
    schedule = Schedule(budget, tuple(settings["fractions"]))
    model_box = {}

    def save(step: int) -> str:
        path = out / "checkpoints" / f"step-{step:07d}"
        model_box["model"].save_pretrained(path)
        tokenizer.save_pretrained(path)
        return str(path)

    callback = _hf_callback(schedule, Clock(), save)
    hf, model_box["model"] = trainer(max_steps, warmup, callback, "run")
    hf.train()
    return {"checkpoints": schedule.taken, "seconds_per_step": per_step, "max_steps": max_steps,
            "warmup": warmup, "steps": hf.state.global_step, "examples": len(examples),
            "parameters": model_box["model"].base_model.num_parameters(),
            "optimizer": type(hf.optimizer.optimizer if hasattr(hf.optimizer, "optimizer")
                              else hf.optimizer).__name__,
            "optim": getattr(hf.args.optim, "value", str(hf.args.optim)),
            "scheduler": getattr(hf.args.lr_scheduler_type, "value",
                                 str(hf.args.lr_scheduler_type))}


# --- the section ------------------------------------------------------------------------------

def downstream(paths: dict[str, list[str]], seeds: int) -> tuple[dict, dict[str, dict]]:
    """The probe of every checkpoint on the task, on the same splits and seeds (each seed's
    folds are fixed by the task and the seed): the baselines (majority, TF-IDF, each side's
    untrained encoder) with the final checkpoints, then each other checkpoint alone, so
    no pair of models is compared (``evaluate`` compares every two models it is given).
    Returns the final checkpoints' result and, by side, its untrained encoder's score."""
    from pretextual.evaluation.encoders import load_encoder
    from pretextual.evaluation.evaluate import UNTRAINED, EvalSettings, evaluate
    from pretextual.evaluation.tasks import load_task
    from pretextual.plugins.manager import Plugins

    task = load_task(TASK, Plugins())
    quiet = lambda *_: None  # noqa: E731
    settings = EvalSettings(protocols=("probe",), seeds=seeds)
    finals = {name: side[-1] for name, side in paths.items()}
    result = evaluate(list(finals.values()), [task], settings, log=quiet)["tasks"][TASK]
    # Which baseline is whose twin: evaluate labels the first model's "untrained" and the
    # first of each other key (architecture, config, seed, tokenizer, length) "untrained:<model>".
    keys = {name: load_encoder(path).key() for name, path in finals.items()}
    labels: dict[tuple, str] = {}
    for name, key in keys.items():
        labels.setdefault(key, UNTRAINED if not labels else f"{UNTRAINED}:{finals[name]}")
    floors = {name: result["baselines"][labels[key]]["probe"] for name, key in keys.items()}
    alone = replace(settings, baselines=False)
    for path in dict.fromkeys(p for side in paths.values() for p in side):
        if path not in result["models"]:
            result["models"][path] = evaluate([path], [task], alone,
                                              log=quiet)["tasks"][TASK]["models"][path]
    return result, floors


def time_to_quality(ws: Workspace, report: Report) -> None:
    """The section: pretextual's side, each Hugging Face arm in a process of its own, then
    every checkpoint scored downstream, and the rows of pretextual against each arm."""
    if not ws.sizes.smoke:
        root = ws.root / "quality"
        root.mkdir()
        ws = Workspace.create(QUALITY, ws.device, root)
    s = ws.sizes
    budget = SMOKE_BUDGET_SECONDS if s.smoke else BUDGET_SECONDS
    fractions = SMOKE_FRACTIONS if s.smoke else FRACTIONS
    seeds = SMOKE_EVAL_SEEDS if s.smoke else EVAL_SEEDS
    measure = max(CALIBRATION_SHARE * budget, 0.5)
    started = time.perf_counter()

    def say(message: str) -> None:
        print(f"[benchmarks] quality ({time.perf_counter() - started:.0f} s): {message}",
              file=sys.stderr, flush=True)

    say(f"pretextual ({RECIPE} recipe), {budget:.0f} s")
    sides = {"pretextual": pretextual_side(ws, budget, fractions, measure)}
    ours = sides["pretextual"]
    for arm in HF_ARMS:
        say(f"Hugging Face ({arm.model_class}, transformers.Trainer), {budget:.0f} s")
        settings = {"out": tempfile.mkdtemp(prefix=f"hf-{arm.model_class}-", dir=ws.root),
                    "budget": budget, "fractions": fractions, "measure": measure,
                    **{k: ours[k] for k in ("betas", "eps", "weight_decay", "max_grad_norm")},
                    "lr": ours["lr"] if arm.lr is None else arm.lr,
                    "model_class": arm.model_class,
                    "config": hf_config_json(ws, arm.recipe, arm.model_class)}
        with Isolated("benchmarks.quality:hf_quality_side", s, ws.device, ws.root, settings,
                      threads=torch.get_num_threads()) as side:
            sides[arm.model_class] = {**side.call("run"), "lr": settings["lr"], "arm": arm}

    paths = {name: [c.path for c in side["checkpoints"]] for name, side in sides.items()}
    count = len({p for side in paths.values() for p in side})
    say(f"evaluating {count} checkpoints on {TASK} ({seeds} seeds)")
    result, floors = downstream(paths, seeds)
    score = {name: [result["models"][c.path]["probe"] for c in side["checkpoints"]]
             for name, side in sides.items()}
    for arm in HF_ARMS:
        add_rows(report, ours, sides[arm.model_class], arm.model_class, score["pretextual"],
                 score[arm.model_class], floors["pretextual"], floors[arm.model_class],
                 result["metric"], budget, seeds)
    details(report, sides, result, budget, seeds, s)


def curve(side: dict, scores: list[dict]) -> list[tuple[float, float]]:
    """A side's (training seconds, mean score) at each of its checkpoints."""
    return [(c.seconds, e["mean"]) for c, e in zip(side["checkpoints"], scores)]


def add_rows(report: Report, ours: dict, theirs: dict, name: str, ours_score: list[dict],
             theirs_score: list[dict], ours_floor: dict, theirs_floor: dict, metric: str,
             budget: float, seeds: int) -> None:
    """The rows of pretextual against one Hugging Face arm (``name``, its model class)."""
    what = f"time to quality against {name}: {TASK} probe {metric}"
    for c_ours, c_hf, e_ours, e_hf in zip(ours["checkpoints"], theirs["checkpoints"],
                                          ours_score, theirs_score):
        ratio = e_ours["mean"] / e_hf["mean"] if e_hf["mean"] else None
        report.add(Row("6", f"{what} at {c_ours.fraction:.0%} of the {budget:.0f} s budget "
                            f"(mean +/- sd over {seeds} seed(s); training seconds, step)",
                       f"{fmt_score(e_ours)} ({c_ours.seconds:,.0f} s, step {c_ours.step})",
                       f"{fmt_score(e_hf)} ({c_hf.seconds:,.0f} s, step {c_hf.step})",
                       ratio, "" if ratio is None else f"{ratio:.2f}x"))
    report.add(Row("6", f"{what}, the untrained encoder (each side's model and tokenizer, "
                        f"pretextual's initialisation)",
                   fmt_score(ours_floor), fmt_score(theirs_floor), None, ""))

    hf_time, hf_final = theirs["checkpoints"][-1].seconds, theirs_score[-1]["mean"]
    ours_time, ours_final = ours["checkpoints"][-1].seconds, ours_score[-1]["mean"]
    t, bound = time_to_reach(curve(ours, ours_score), hf_final)
    speedup = 0.0 if t is None else hf_time / max(t, 1e-9)
    ratio_text = "not reached" if t is None else f"{'>= ' if bound else ''}{speedup:.1f}x"
    if hf_final <= theirs_floor["mean"]:
        # A score the untrained encoder already has is no quality to reach: no verdict.
        speedup, ratio_text = None, (f"n/a: Hugging Face's final score is not above its "
                                     f"untrained encoder's ({theirs_floor['mean']:.3f})")
    report.add(Row("6", f"{what}: time to reach Hugging Face's final score "
                        f"({hf_final:.3f}); ratio: Hugging Face's time over pretextual's",
                   fmt_reach(t, bound, budget), f"{hf_time:,.0f} s (its final checkpoint)",
                   speedup, ratio_text, 3.0, ">= 3x (a third of the time)"))
    t_hf, bound_hf = time_to_reach(curve(theirs, theirs_score), ours_final)
    report.add(Row("6", f"{what}: time to reach pretextual's final score ({ours_final:.3f})",
                   f"{ours_time:,.0f} s (its final checkpoint)", fmt_reach(t_hf, bound_hf, budget),
                   None, ""))


def details(report: Report, sides: dict, result: dict, budget: float, seeds: int,
            sizes: Sizes) -> None:
    """What each side trained, and with which settings, under the table."""
    ours = sides["pretextual"]
    arms = "; ".join(
        f"{name} (built from the {side['arm'].recipe} recipe's config, {side['parameters']:,} "
        f"parameters; optim {side['optim']}, {side['scheduler']} schedule, learning rate "
        f"{side['lr']}: {side['arm'].why}): {side['steps']} steps of {side['max_steps']} "
        f"({side['warmup']} warm-up), sized from {side['seconds_per_step']:.3f} s a step; "
        f"{side['examples']:,} line-by-line examples"
        for name, side in sides.items() if name != "pretextual")
    other = {k: v for k, v in result["baselines"].items() if not k.startswith("untrained")}
    report.details.append(
        f"Time to quality: vocab {sizes.vocab}, sequence {sizes.seq}, batch {sizes.batch}; "
        f"budget {budget:.0f} s of training time per side. pretextual ({RECIPE} recipe, "
        f"{ours['parameters']:,} parameters, learning rate {ours['lr']}): {ours['steps']} steps "
        f"of a schedule of {ours['max_steps']} ({ours['warmup']} warm-up), sized from the "
        f"{ours['seconds_per_step']:.3f} s a step its measurement run took; {ours['tokens']:,} "
        f"real tokens. Hugging Face: {arms}. All: AdamW betas {ours['betas']}, eps "
        f"{ours['eps']}, weight decay {ours['weight_decay']}, clipping {ours['max_grad_norm']}, "
        f"linear decay to 0 at the schedule's end. Downstream: `pretextual evaluate` probe of "
        f"{TASK} ({result['n']} examples, grouped 5-fold cross-validation, {seeds} seed(s)); "
        f"other baselines: " + ", ".join(f"{k} {fmt_score(v)}" for k, v in other.items()) + ".")
