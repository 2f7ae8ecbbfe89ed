"""The training loop: the optimizer and learning-rate schedule by name, accumulation, clipping,
optional bf16 autocast, evaluation, metrics.jsonl and atomic checkpoints; one
process, or many under torchrun with DistributedDataParallel."""

from __future__ import annotations

import importlib.util
import itertools
import math
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Iterable

import torch
from omegaconf import DictConfig, OmegaConf
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                     get_optimizer_state_dict, set_model_state_dict,
                                                     set_optimizer_state_dict)

import pretextual
from pretextual.accel import accelerate
from pretextual.core import distributed as dist_utils
from pretextual.core.checkpoint import (check_tokenizer, latest_checkpoint, list_checkpoints,
                                        remove_partial_checkpoints, save_checkpoint, tied_keys)
from pretextual.core import console, phases
from pretextual.core.config import config_changes, to_yaml
from pretextual.core.config_checks import MODEL_SIZES
from pretextual.core.data import Batches
from pretextual.architectures import architecture, sized_config, transformer_layers
from pretextual.architectures.common import count_parameters
from pretextual.core.mix import (ObjectiveMix, PretrainingModel, check_objectives,
                                 resolved_objectives)
from pretextual.core.budget import TimeBudget, parse_duration, steps_for_tokens, tokens_per_step
from pretextual.core.init_from import load_weights, start_config, start_tokenizer
from pretextual.core.optim import ScheduleSettings, decay_groups
from pretextual.core.run_data import run_corpus, split_batches
from pretextual.core.sources import MixedBatches
from pretextual.core.run_dir import RunDirectory, latest_run, new_run_path, point_latest
from pretextual.core.step import MixForward, NonFinite, next_batch
from pretextual.core.tokenizer import TOKENIZER_FILE, has_word_boundaries, tokenizer_sha256, vocab_of
from pretextual.errors import CheckpointError, ConfigError, TrainingError, plugin_call
from pretextual.plugins.api import BuildContext, ExportedModel
from pretextual.plugins.manager import Plugins

# Full (unsharded) state on the CPU: checkpoints do not depend on how the model was split.
# Not strict: a parameter no objective uses (the pooler under MLM alone) has no optimizer state.
FULL_STATE = StateDictOptions(full_state_dict=True, cpu_offload=True, strict=False)
DEVICE_WORKERS = 4
"""DataLoader workers of a run on a GPU when data.num_workers is unset."""


def encoder_config(cfg: DictConfig, vocab_size: int, pad_token_id: int, plugins=None):
    """The encoder's config: the architecture's preset, with any model.* key that is set
    overriding it (checked by config.validate: positive, hidden a multiple of heads)."""
    m = cfg.model
    spec = architecture(m.architecture, plugins)
    return sized_config(spec, m.preset, {k: m[k] for k in MODEL_SIZES},
                        {k: m[k] for k in ("hidden_dropout_prob", "attention_probs_dropout_prob")},
                        vocab_size=vocab_size, pad_token_id=pad_token_id,
                        max_position_embeddings=m.max_position_embeddings)


def _export_formats(formats: str | None, plugins: Plugins) -> list[str]:
    """The exporter names of trainer.export, each registered (else one ConfigError line)."""
    names = list(dict.fromkeys(f.strip() for f in (formats or "").split(",") if f.strip()))
    for name in names:
        if name not in plugins.exporters:
            raise ConfigError(f"trainer.export: no plugin registers an exporter named {name!r} "
                              f"(known: {', '.join(sorted(plugins.exporters))})")
    return names


def _check_loggers(names, plugins: Plugins) -> None:
    """Each of trainer.loggers registered and its packages installed (else one ConfigError
    line): a logger asked for must not be found missing hours into the run. A logger on by
    default (``warn_if_missing``) says itself that it logs nothing."""
    for name in names:
        if ("logger", name) in plugins.clashes:
            raise ConfigError(f"trainer.loggers: {plugins.clashes[('logger', name)]}")
        spec = plugins.loggers.get(name)
        if spec is None:
            raise ConfigError(f"trainer.loggers: no plugin registers a logger named {name!r} "
                              f"(known: {', '.join(sorted(plugins.loggers))})")
        missing = [m for m in spec.requires if importlib.util.find_spec(m) is None]
        if missing and not spec.warn_if_missing:
            raise ConfigError(f"trainer.loggers: {name} needs the {missing[0]} package, which is "
                              f"not installed: {spec.install or f'pip install {missing[0]}'} "
                              f"(or leave {name} out of trainer.loggers)")


def _registered(key: str, name: str, registry: dict, kind: str):
    """The spec registered as ``name``, else one ConfigError line naming the known ones."""
    if name not in registry:
        raise ConfigError(f"{key}: no plugin registers an {kind.replace('_', ' ')} named "
                          f"{name!r} (known: {', '.join(sorted(registry))})")
    return registry[name]


class Trainer:
    """One training run, set up from a resolved config.

    ``run_name`` names the run's directory when trainer.output_dir is unset
    (runs/<run_name>-<time>). ``documents``: the run's Documents, instead of data.corpus.
    ``start``: the model model.init_from names, loaded (pretextual.run.trainer_for). ``resume``: continue the run in trainer.output_dir (unset:
    the one runs/latest points at) from its newest checkpoint, with
    the tokenizer it was trained with. Without it a directory holding checkpoints, an
    export or files that are not a run's is an error, unless trainer.overwrite_output_dir
    is set (the earlier run's outputs are then deleted). train() holds the directory
    while it runs: a second process training there gets an error."""

    def __init__(self, cfg: DictConfig, plugins: Plugins | None = None, log=print,
                 resume: bool = False, run_name: str = "run", documents: list | None = None,
                 start: ExportedModel | None = None):
        self.cfg = cfg
        self.device = dist_utils.device_for(cfg.trainer.device)
        self.world = dist_utils.init_world(self.device)
        self.log = log if self.world.is_main else (lambda *_: None)
        if cfg.trainer.output_dir is None:
            if resume:  # every process reads the link: the run directory is shared storage
                cfg.trainer.output_dir = str(latest_run())
            else:  # one name for all processes, whose clocks may differ by a second
                chosen = str(new_run_path(run_name)) if self.world.is_main else None
                cfg.trainer.output_dir = dist_utils.broadcast_text(chosen, self.world, self.device)
        self.plugins = plugins or Plugins.from_config(cfg)
        self.run_dir = RunDirectory(cfg.trainer.output_dir, self.world.is_main, self.log)
        self.out = self.run_dir.path
        # Checked before any tokenizing or training, so a typo does not cost the run.
        self.run_dir.check_writable()
        self.run_dir.check_free()
        self.export_formats = _export_formats(cfg.trainer.export, self.plugins)
        self._optimizer = _registered("trainer.optimizer", cfg.trainer.optimizer,
                                      self.plugins.optimizers, "optimizer").build
        self._schedule = _registered("trainer.lr_schedule", cfg.trainer.lr_schedule,
                                     self.plugins.lr_schedules, "lr_schedule").build
        _check_loggers(cfg.trainer.loggers, self.plugins)
        objectives = check_objectives(cfg.objectives, self.plugins)
        cfg.objectives = resolved_objectives(objectives)  # config.yaml records every option
        self.resuming = resume
        if not (resume and list_checkpoints(self.run_dir.checkpoints)):
            self._check_fresh_run_dir()
        self.should_stop = False  # plugins may set this from pretextual_on_step_end
        resumed_run = resume and bool(list_checkpoints(self.run_dir.checkpoints))
        if cfg.model.init_from and start is None:
            raise ConfigError(f"model.init_from={cfg.model.init_from}: build the Trainer with "
                              f"pretextual.run.trainer_for, which loads it")
        self.start = start
        required = self.run_dir.resumed_tokenizer() if self.world.is_main and resume else None
        source = str(self.out / TOKENIZER_FILE)
        if required is None and self.start is not None and not cfg.data.tokenizer:
            required, source = start_tokenizer(self.start), f"model.init_from={cfg.model.init_from}"
        self.tokenizer, docs = run_corpus(cfg.data, self.world, self.device, self.log, required,
                                          source, documents)
        self.vocab = vocab_of(self.tokenizer)  # every tokenizer read from a file was checked there
        if self.start is not None:
            self.encoder_config = start_config(cfg, self.start, self.vocab.size, self.plugins)
        else:
            self.encoder_config = encoder_config(cfg, self.vocab.size, self.vocab.pad_id, self.plugins)
        self.architecture = self.plugins.architecture(self.encoder_config.architecture)
        cfg.model.architecture = self.architecture.name  # init_from's, when it set it
        if cfg.data.document_attention is None:  # recorded in config.yaml as the run used it
            cfg.data.document_attention = self.architecture.document_attention
        self.phases = phases.plan(cfg)
        if cfg.trainer.phases:
            cfg.trainer.max_steps = self.phases[-1].end
        self._objectives, self._docs = objectives, docs
        self._use_phase(self.phases[0])
        self.task_probes = None
        if cfg.trainer.eval_tasks:  # loaded and checked now: a bad task file fails before training
            from pretextual.evaluation.probing import TaskProbes, probes_available
            if probes_available():
                self.task_probes = TaskProbes(list(cfg.trainer.eval_tasks), self.plugins,
                                              self.tokenizer, cfg.data.max_seq_length, self.vocab.size)
            else:
                self.log("warning: trainer.eval_tasks needs scikit-learn (pip install "
                         "'pretextual[eval]'); this run probes no downstream task")

        torch.manual_seed(cfg.trainer.seed)
        self.model = PretrainingModel(self.architecture.model(self.encoder_config), self.mix.heads)
        if self.start is not None and not resumed_run:  # a resume loads its own checkpoint
            load_weights(self.model, self.start, cfg.model.init_from, self.log)
        self.start = None  # its tensors are copied; let them go
        self.model.to(self.device)
        self.accelerations = accelerate(self.model.bert, self.device.type, cfg.trainer.compile)
        self.forward = MixForward(self.model, self.mix)
        if cfg.trainer.fsdp and self.world.enabled:
            # FSDP2: each layer's parameters, gradients and optimizer state sharded over ranks.
            from torch.distributed.fsdp import fully_shard
            for layer in transformer_layers(self.model.bert):
                fully_shard(layer)
            fully_shard(self.forward)
        elif self.world.enabled:
            # Searching for unused parameters costs every backward a graph traversal: only
            # when some are (the pooler, when no objective reads it).
            self.forward = torch.nn.parallel.DistributedDataParallel(
                self.forward, device_ids=[self.device.index] if self.device.type == "cuda" else None,
                find_unused_parameters=self._has_unused_parameters())
        t = cfg.trainer
        if t.max_tokens is not None:
            per_step = tokens_per_step(self.train_batches, t.grad_accum_steps, self.world.world_size)
            t.max_steps = steps_for_tokens(t.max_tokens, per_step)
            if not t.phases:  # the one phase is the run: as long as the budget now says
                self.phases = phases.plan(cfg)
                self.phase = self.phases[0]
            self.log(f"trainer.max_tokens={t.max_tokens:,}: about {t.max_steps:,} steps of "
                     f"{per_step:,.0f} tokens, the length the schedule is sized to")
        self.optimizer = plugin_call(f"trainer.optimizer={t.optimizer}", "build()", self._optimizer,
                                     decay_groups(self.model, t.weight_decay), t)
        self._lr_factor = self._schedule(ScheduleSettings.of(t))
        if t.warmup_steps > t.max_steps:
            self.log(f"warning: trainer.warmup_steps={t.warmup_steps} is more than trainer.max_steps="
                     f"{t.max_steps}: the learning rate rises for the whole run and peaks at "
                     f"{t.max_steps / t.warmup_steps:.0%} of trainer.lr (lower trainer.warmup_steps)")
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, self._lr_factor)
        self.step = 0
        self._apply_phase_lr()
        self.updates = 0  # optimizer steps made (a skipped batch makes none)
        self.start_step = 0  # the step train() started from: 0, or the resumed checkpoint's
        self.tokens_trained, self.train_seconds = 0, 0.0  # by train(), over all processes
        self.tokens_total = 0  # of the whole run, continued across resumes
        # "time" in metrics.jsonl: seconds since the run started, continued across resumes.
        self._started, self._time_offset = time.perf_counter(), 0.0

    def _check_fresh_run_dir(self) -> None:
        """A new run must not mix with an earlier one's checkpoints (rotation would keep
        theirs and delete its own), replace its export, or write into a directory of files
        that are not a run's: ConfigError unless trainer.overwrite_output_dir."""
        what = self.run_dir.earlier_run() if self.world.is_main else ""
        if dist_utils.any_over_ranks(bool(what), self.world, self.device) \
                and not self.cfg.trainer.overwrite_output_dir:
            raise ConfigError(f"trainer.output_dir={self.out}: "
                              f"{what or 'holds an earlier run (on the main process)'}")

    def _has_unused_parameters(self) -> bool:
        """Whether a step leaves some parameter without a gradient: one forward and backward
        of the first training batch, whose gradients and random draws are then undone."""
        batch = self._to_device(self.train_batches[next(iter(self.train_indices()))])
        devices = [self.device] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices), self._autocast():
            total, _ = self.forward(batch, 0)
            total.backward()
        unused = any(p.grad is None for p in self.model.parameters() if p.requires_grad)
        self.model.zero_grad(set_to_none=True)
        return dist_utils.any_over_ranks(unused, self.world, self.device)

    def _use_phase(self, phase: phases.Phase) -> None:
        """Build the objectives and the training and held-out batches of ``phase`` (its
        sequence length and batch size) and train with them from now on, at its peak
        learning rate. Called for the first phase before the model exists."""
        self.phase = phase
        data = phases.data_config(self.cfg.data, phase)
        context = BuildContext(self.encoder_config, self.vocab, phase.max_seq_length,
                               has_word_boundaries(self.tokenizer))
        self.mix = ObjectiveMix(self._objectives, context)
        self.train_batches, self.eval_batches = split_batches(
            self._docs, data, self.mix, self.vocab,
            self.cfg.trainer.seed + phases.PHASE_SEED_OFFSET * phase.index, self.log,
            micro_per_step=self.cfg.trainer.grad_accum_steps * self.world.world_size)
        self._eval_loader = None
        forward = getattr(self, "forward", None)
        if forward is not None:  # the heads stay the model's; the losses are the new mix's
            getattr(forward, "module", forward).mix = self.mix
        if getattr(self, "scheduler", None) is not None:
            self._apply_phase_lr()

    def _apply_phase_lr(self) -> None:
        """The schedule scales the phase's peak learning rate, from this step on."""
        self.scheduler.base_lrs = [self.phase.lr] * len(self.optimizer.param_groups)
        for group in self.optimizer.param_groups:
            group["lr"] = self.phase.lr * self.scheduler.lr_lambdas[0](self.step)

    @property
    def global_batch_size(self) -> int:
        """Examples per optimizer step: micro-batch x world size x accumulation steps."""
        return self.phase.batch_size * self.world.world_size * self.cfg.trainer.grad_accum_steps

    # --- state -----------------------------------------------------------------------------

    def _meta(self) -> dict:
        return {"pretextual_version": pretextual.__version__,
                "architecture": self.architecture.name,
                "encoder_config": self.encoder_config.to_dict(),
                "objectives": self.mix.names, "heads": sorted(self.mix.heads),
                "scheduler_last_epoch": self.scheduler.last_epoch,
                "world_size": self.world.world_size,
                "tokenizer_sha256": tokenizer_sha256(self.tokenizer),
                "updates": self.updates, "tokens": self.tokens_total,
                "config": OmegaConf.to_container(self.cfg)}

    def save(self) -> Path | None:
        """Write a checkpoint (the main process writes; every process takes part). None,
        with a warning, while every step so far was skipped: untrained weights are never
        labelled with a step."""
        if self.updates == 0:
            if self.step >= self.cfg.trainer.max_steps or self.should_stop:
                raise TrainingError(f"step {self.step}: every step of the run was skipped "
                                    f"(non-finite losses, trainer.nonfinite=skip); no checkpoint "
                                    f"of the untrained weights is written")
            self.log(f"warning: step {self.step}: no checkpoint written, every step so far was "
                     f"skipped (trainer.nonfinite=skip)")
            return None
        rng = {f"torch.{r}": s for r, s in
               enumerate(dist_utils.gather_rng_states(self.world, self.device))}
        model_state = get_model_state_dict(self.model, options=FULL_STATE)
        optimizer_state = get_optimizer_state_dict(self.model, self.optimizer, options=FULL_STATE)
        path = self.run_dir.checkpoints / f"step-{self.step:07d}"
        if self.world.is_main:
            path = save_checkpoint(self.run_dir.checkpoints, self.step, model_state, optimizer_state,
                                   self._meta(), rng, self.cfg.trainer.keep_checkpoints,
                                   tied_keys(self.model))
            self.plugins.hook.pretextual_on_checkpoint(step=self.step, path=str(path), trainer=self)
        dist_utils.barrier(self.world)
        return path

    def resume(self) -> bool:
        """Restore the newest good checkpoint of the run directory; False when there is none."""
        if self.world.is_main:
            remove_partial_checkpoints(self.run_dir.checkpoints)
        ckpt = latest_checkpoint(self.run_dir.checkpoints)
        if ckpt is None:
            found = list_checkpoints(self.run_dir.checkpoints)
            if found:  # never start over on top of them: they may be repairable
                raise CheckpointError(f"{self.run_dir.checkpoints}: none of its {len(found)} "
                                      f"checkpoints verifies (see the warnings above); nothing "
                                      f"was deleted")
            return False
        theirs = ckpt.meta.get("architecture", "bert")  # written before there was a choice
        if theirs != self.architecture.name:
            raise CheckpointError(f"{ckpt.path}: was written for model.architecture={theirs}, "
                                  f"not {self.architecture.name}")
        if ckpt.meta["encoder_config"] != self.encoder_config.to_dict():
            raise CheckpointError(f"{ckpt.path}: was written for a different model "
                                  f"({ckpt.meta['encoder_config']}); check model.* and data.*")
        check_tokenizer(ckpt.path, ckpt.meta, self.tokenizer, self.out / TOKENIZER_FILE)
        state = ckpt.model_state()
        expected = set(get_model_state_dict(self.model).keys())
        if set(state) != expected:
            diff = sorted(set(state) ^ expected)
            raise CheckpointError(f"{ckpt.path}: does not fit this model (differs in {diff[0]}"
                                  f"{f' and {len(diff) - 1} more' if len(diff) > 1 else ''})")
        set_model_state_dict(self.model, state, options=FULL_STATE)
        tensors = ckpt.optimizer_tensors()
        # The moments come from the checkpoint, the hyperparameters from this run's config
        # (loading the state would bring back the old lr, betas, eps and weight decay).
        configured = [{k: v for k, v in g.items() if k != "params"} for g in self.optimizer.param_groups]
        set_optimizer_state_dict(self.model, self.optimizer, ckpt.optimizer_state(), options=FULL_STATE)
        for group, settings in zip(self.optimizer.param_groups, configured):
            group.update(settings)  # initial_lr among them: the base the schedule scales
        # Rebuilt at the checkpoint's step: its constructor sets the learning rate of that step.
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, self._lr_factor, last_epoch=ckpt.meta["scheduler_last_epoch"] - 1)
        self.step = ckpt.step
        self._apply_phase_lr()
        self.tokens_total = int(ckpt.meta.get("tokens", 0))
        rng = tensors.get(f"rng.torch.{self.world.rank}")
        if rng is not None:
            dist_utils.set_rng_state(rng, self.device)
        else:  # a new rank after a change of world size: a fresh, seeded dropout stream
            torch.manual_seed(self.cfg.trainer.seed + 7919 * self.world.rank + ckpt.step)
        self.updates = int(ckpt.meta.get("updates", ckpt.step))
        self.log(f"resumed from {ckpt.path} at step {self.step}")
        saved = ckpt.meta.get("config", {})
        changes = config_changes(saved, self.cfg)
        try:
            before = (saved["data"]["batch_size"] * ckpt.meta["world_size"]
                      * saved["trainer"]["grad_accum_steps"])
        except (KeyError, TypeError):
            before = self.global_batch_size
        if before != self.global_batch_size:  # the process count is no config key
            changes.append(f"global batch: {before} -> {self.global_batch_size} (data.batch_size "
                           f"x processes x trainer.grad_accum_steps)")
        if changes and self.step < self.cfg.trainer.max_steps:
            self.log(f"note: the config differs from the checkpoint's, and the run goes on with "
                     f"the new values (config.yaml records them): {'; '.join(changes)}")
        return True

    # --- loop ------------------------------------------------------------------------------

    def loader(self, batches: Batches, indices) -> torch.utils.data.DataLoader:
        """The DataLoader the run reads ``batches`` through (data.num_workers workers
        preparing batches ahead, kept alive for another pass), yielding the batches at
        ``indices`` in order."""
        workers = self.cfg.data.num_workers
        if workers is None:
            workers = 0 if self.device.type == "cpu" else DEVICE_WORKERS
        # Its own generator: a DataLoader otherwise draws its base seed from the global RNG,
        # which would shift dropout after a resume. Batches carry their own seeds anyway.
        return torch.utils.data.DataLoader(batches, batch_size=None, sampler=indices,
                                           generator=torch.Generator(), num_workers=workers,
                                           pin_memory=self.device.type == "cuda",
                                           persistent_workers=workers > 0,
                                           prefetch_factor=4 if workers else None)

    def train_indices(self, start_step: int = 0) -> Iterable[int]:
        """Micro-batch ids this process reads from ``start_step`` to the end of the phase
        (on and on under a token or time budget, whose end the run finds as it goes):
        micro-batch (s*accum + a)*world + rank of the phase's stream, s counted from the
        phase's first step."""
        t, w, first = self.cfg.trainer, self.world, self.phase.start
        budget = t.max_tokens is not None or t.max_time is not None
        steps = itertools.count(start_step) if budget else range(start_step, self.phase.end)
        return (((s - first) * t.grad_accum_steps + a) * w.world_size + w.rank
                for s in steps for a in range(t.grad_accum_steps))

    def _to_device(self, batch):
        return {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}

    def _autocast(self):
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.cfg.trainer.bf16)

    def _say_phase(self) -> None:
        """The data line of the phase beginning (its phase line too, in a run of several)."""
        t, docs = self.cfg.trainer, self.train_batches.docs
        if len(self.phases) > 1:
            self.log(self.phase.describe(len(self.phases)))
        self.log(console.data_line(len(docs), docs.num_tokens(), self.phase.end - self.phase.start,
                                   self.global_batch_size, self.phase.max_seq_length, t.max_time))

    def _run_time(self) -> float:
        """Seconds since the run started, continued across resumes (metrics.jsonl's time)."""
        return self._time_offset + time.perf_counter() - self._started

    def _spend_budget(self, tokens: int, logging: bool, progress) -> None:
        """After a step: stop once trainer.max_tokens or trainer.max_time is spent (every
        process at the same step), and at the logged steps size the schedule to the steps
        the tokens or the time left take at the rate so far (one plan for all processes:
        the token counts are global sums, the time plans averaged)."""
        t = self.cfg.trainer
        planned = None
        if t.max_tokens is not None:
            (step_tokens,) = dist_utils.sum_over_ranks((tokens,), self.world, self.device)
            self.tokens_total += step_tokens
            self.should_stop = self.should_stop or self.tokens_total >= t.max_tokens
            rate = self.tokens_total / self.step  # a function of the batches: resumes exactly
            planned = self.step + math.ceil((t.max_tokens - self.tokens_total) / rate)
        if self._time_budget is not None:
            now = self._run_time()
            self.should_stop = dist_utils.any_over_ranks(
                self.should_stop or self._time_budget.spent(now), self.world, self.device)
            (plans,) = dist_utils.sum_over_ranks((self._time_budget.plan(self.step, now),),
                                                 self.world, self.device)
            planned = plans // self.world.world_size
        if planned is not None and logging and not self.should_stop:
            t.max_steps = max(planned, self.step + 1)
            self.scheduler.lr_lambdas[0] = self._schedule(ScheduleSettings.of(t))
            progress.total = t.max_steps

    def _source_shares(self) -> dict[str, float]:
        """Under data.sources: each source's share of the micro-batches trained on so far."""
        if not isinstance(self.train_batches, MixedBatches):
            return {}
        n = self.step * self.cfg.trainer.grad_accum_steps * self.world.world_size
        counts = self.train_batches.counts(n)
        return {f"source/{name}/share": int(c) / n for name, c in zip(self.train_batches.names, counts)}

    def _write_metrics(self, record: dict) -> None:
        record["time"] = round(self._run_time(), 3)
        self.run_dir.append_metrics(record)

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Mean loss per objective and each metric over the held-out batches, each batch
        weighted by its examples (the last batch of the split may be smaller), and the
        downstream probe of each of trainer.eval_tasks."""
        probes = self.task_probes(self.model.bert, self.device) if self.task_probes else {}
        if self.eval_batches is None:
            return probes
        self.model.eval()
        sums: dict[str, float] = {}
        examples = 0
        n = self.eval_batches.available(self.cfg.trainer.eval_batches)
        if self._eval_loader is None:  # built once: its workers serve every evaluation
            self._eval_loader = self.loader(self.eval_batches, range(n))
        loader = iter(self._eval_loader)
        for _ in range(n):
            batch = next_batch(loader)
            rows = batch["input_ids"].shape[0]
            with self._autocast():  # through the wrapper: FSDP must gather the sharded weights
                total, logs = self.forward(self._to_device(batch), self.step)
            for key, value in {"loss": total, **logs}.items():
                sums[f"eval/{key}"] = sums.get(f"eval/{key}", 0.0) + float(value) * rows
            examples += rows
        self.model.train()
        return {**{k: v / examples for k, v in sums.items()}, **probes}

    def _gradient_sync(self, sync: bool):
        if isinstance(self.forward, torch.nn.parallel.DistributedDataParallel) and not sync:
            return self.forward.no_sync()
        if hasattr(self.forward, "set_requires_gradient_sync"):  # FSDP2
            self.forward.set_requires_gradient_sync(sync)
        return nullcontext()

    def _micro_steps(self, loader) -> tuple[dict[str, torch.Tensor], int]:
        """Forward and backward over the accumulation steps; returns mean logs and tokens."""
        accum = self.cfg.trainer.grad_accum_steps
        logs_sum: dict[str, torch.Tensor] = {}
        tokens = 0
        for a in range(accum):
            batch = next_batch(loader)
            tokens += int(batch["attention_mask"].sum())  # on the host: no device sync
            batch = self._to_device(batch)
            # Synchronise gradients across processes only on the last micro-batch of the step.
            with self._gradient_sync(a == accum - 1):
                with self._autocast():
                    total, logs = self.forward(batch, self.step)
                (total / accum).backward()
            for key, value in {"loss": total.detach(), **logs}.items():
                logs_sum[key] = logs_sum.get(key, 0.0) + value / accum
        return logs_sum, tokens

    def train(self) -> dict[str, float]:
        """Train to trainer.max_steps; returns the last evaluation's metrics. The run
        directory is held from the start to the end, however it ends."""
        self.run_dir.claim()
        if self.world.is_main:
            point_latest(self.out, self.log)
        try:
            return self._train()
        finally:
            self.run_dir.release()

    def _train(self) -> dict[str, float]:
        t = self.cfg.trainer
        if not (self.resuming and list_checkpoints(self.run_dir.checkpoints)):
            self._check_fresh_run_dir()  # again, now that no other run can write there
        resumed = self.resume() if self.resuming else False
        if self.resuming and not resumed:
            self.log(f"no checkpoint in {self.run_dir.checkpoints}; starting from scratch")
        self.start_step = self.step
        if resumed and self.step >= t.max_steps:  # the run directory stays as it is
            self.log(f"nothing to train: the checkpoint is at step {self.step} and "
                     f"trainer.max_steps={t.max_steps} (raise trainer.max_steps to train on; "
                     f"`pretextual export` exports it)")
            return {}
        self._time_offset = self.run_dir.start(to_yaml(self.cfg), self.tokenizer,
                                               self.cfg.trainer.overwrite_output_dir,
                                               self.step if resumed else None)
        if phases.phase_at(self.phases, self.step) != self.phase:  # resumed in a later phase
            self._use_phase(phases.phase_at(self.phases, self.step))
        self._say_phase()
        weights = ", ".join(f"{s.name} ({console.schedule_text(s.schedule, s.options)})"
                            for s in self.mix.selected)
        self.log(f"objectives: {weights} | encoder {count_parameters(self.model.bert):,} parameters "
                 f"| global batch {self.global_batch_size} = {self.phase.batch_size} x "
                 f"{self.world.world_size} processes x {t.grad_accum_steps} accumulation "
                 f"| device {self.device}"
                 + "".join(f" | {applied}" for applied in self.accelerations))
        if self.world.is_main:
            self.plugins.hook.pretextual_on_train_start(trainer=self)
        if self.task_probes is not None and self.step == 0:
            # the untrained encoder's probe: where the downstream curve starts
            probes = self.task_probes(self.model.bert, self.device)
            if self.world.is_main:
                self._write_metrics({"step": 0, **probes})
                self.log(console.eval_line(0, probes) + " (the untrained encoder)")
        self.model.train()
        loader = iter(self.loader(self.train_batches, self.train_indices(self.step)))
        progress = console.Progress(t.max_steps, self.step, t.progress and self.world.is_main,
                                    t.print_every or max(1, t.max_steps // 20), self.log)
        last_eval: dict[str, float] = {}
        tokens_seen, clock = 0, time.perf_counter()
        self.tokens_trained, train_start = 0, clock  # this session's, for the closing summary
        watch = NonFinite(self.device, t.nonfinite, t.max_skipped_steps)
        self._time_budget = None if t.max_time is None else TimeBudget(
            parse_duration(t.max_time), self.step, self._run_time(), t.max_steps)
        while self.step < t.max_steps and not self.should_stop:
            if self.step == self.phase.end:  # the next phase: its data from its first batch
                self._use_phase(phases.phase_at(self.phases, self.step))
                self._say_phase()
                loader = iter(self.loader(self.train_batches, self.train_indices(self.step)))
            logs, tokens = self._micro_steps(loader)
            logged = None  # this step's metrics line, on the main process
            step = self.step + 1
            logging = step % t.log_every == 0 or step == t.max_steps
            # The losses reach the host only where something reads them (each read waits for
            # the device): logged, evaluated and checkpointed steps, and every step under
            # trainer.nonfinite=skip, which must know before the update whether to make it.
            read = (logging or t.nonfinite == "skip" or step % t.checkpoint_every == 0
                    or bool(t.eval_every and step % t.eval_every == 0))
            watch.record(step, logs)
            skipped = False
            if read:
                logs = dist_utils.mean_over_ranks(logs, self.world, self.device)
                skipped = watch.check(self.world, self.run_dir.checkpoints, self.log)
            if skipped:
                self.optimizer.zero_grad(set_to_none=True)
            else:
                if t.max_grad_norm > 0:
                    torch.nn.utils.clip_grad_norm_(self.model.parameters(), t.max_grad_norm)
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=True)
                self.updates += 1
            lr = self.optimizer.param_groups[0]["lr"]  # this step's (a phase may have set it)
            self.scheduler.step()
            weights = self.mix.weights(self.step)
            self.step = step
            tokens_seen += tokens
            self._spend_budget(tokens, logging, progress)

            if logging:
                tokens, tokens_seen = dist_utils.sum_over_ranks((tokens, tokens_seen), self.world,
                                                                 self.device)
                if self.world.is_main:
                    now = time.perf_counter()
                    record = {"step": self.step, **logs,
                              **{f"weight/{k}": w for k, w in weights.items()},
                              **self.mix.option_values(self.step - 1),
                              **({"phase": self.phase.index} if len(self.phases) > 1 else {}),
                              "lr": lr, "tokens": tokens,
                              "tokens_per_s": tokens_seen / max(now - clock, 1e-9)}
                    record.update(self._source_shares())
                    if skipped:
                        record["skipped"] = 1
                    clock = now
                    self._write_metrics(record)
                    logged = record
                    self.plugins.hook.pretextual_on_step_end(step=self.step, metrics=record,
                                                             trainer=self)
                self.tokens_trained += tokens_seen
                if t.max_tokens is None:  # else counted at every step, by the budget
                    self.tokens_total += tokens_seen
                tokens_seen = 0
                # a plugin asks on the main process; every process stops at the same step
                self.should_stop = dist_utils.any_over_ranks(self.should_stop, self.world,
                                                             self.device)
            progress.update(self.step, logged)

            done = self.step == t.max_steps or self.should_stop
            if (t.eval_every and self.step % t.eval_every == 0) or done:
                last_eval = self.evaluate()  # on every process (FSDP needs all to take part)
                if last_eval and self.world.is_main:
                    bad = [k for k, v in last_eval.items() if not math.isfinite(v)]
                    if bad:
                        self.log(f"warning: step {self.step}: the evaluation gave non-finite "
                                 f"{', '.join(bad)}")
                    record = {"step": self.step, **last_eval,
                              **({"phase": self.phase.index} if len(self.phases) > 1 else {})}
                    self._write_metrics(record)
                    progress.write(console.eval_line(self.step, last_eval))
                    self.plugins.hook.pretextual_on_eval(
                        step=self.step, metrics={k: v for k, v in record.items() if k != "step"},
                        trainer=self)
            if self.step % t.checkpoint_every == 0 or done:
                self.save()
        progress.close()
        self.train_seconds = time.perf_counter() - train_start
        if self.world.is_main:
            self.plugins.hook.pretextual_on_train_end(metrics=last_eval, trainer=self)
        return last_eval

    @property
    def final_checkpoint(self) -> Path:
        """The directory of the checkpoint at the current step."""
        return self.run_dir.checkpoints / f"step-{self.step:07d}"
