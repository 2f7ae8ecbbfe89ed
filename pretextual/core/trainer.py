"""The training loop: AdamW with warm-up and linear decay, accumulation, clipping,
optional bf16 autocast, evaluation, metrics.jsonl and atomic checkpoints; one
process, or many under torchrun with DistributedDataParallel."""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from contextlib import nullcontext
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf
from tokenizers import Tokenizer
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                     get_optimizer_state_dict, set_model_state_dict,
                                                     set_optimizer_state_dict)
from tqdm import tqdm

import pretextual
from pretextual.accel import accelerate
from pretextual.core.checkpoint import (STATE_FILE, check_tokenizer, latest_checkpoint,
                                        list_checkpoints, remove_partial_checkpoints,
                                        save_checkpoint, tied_keys)
from pretextual.core.config import MODEL_SIZES, config_changes, to_yaml
from pretextual.core.data import MIN_SPLIT_DOCUMENTS, Batches, full_sentences, split_documents
from pretextual.core import distributed as dist_utils
from pretextual.core.encoder import EncoderConfig, count_parameters, preset_config
from pretextual.core.mix import (ObjectiveMix, PretrainingModel, check_objectives,
                                 resolved_objectives)
from pretextual.core.prepare import tokenized_corpus
from pretextual.core.tokenizer import (TOKENIZER_FILE, has_word_boundaries, read_tokenizer,
                                       tokenizer_sha256, vocab_of)
from pretextual.errors import (CheckpointError, ConfigError, DataError, PluginRunError,
                               PretextualError, TrainingError)
from pretextual.plugins.api import BuildContext
from pretextual.plugins.manager import Plugins

EVAL_SEED_OFFSET = 1_000_003  # eval batches use their own fixed stream
# Full (unsharded) state on the CPU: checkpoints do not depend on how the model was split.
# Not strict: a parameter no objective uses (the pooler under MLM alone) has no optimizer state.
FULL_STATE = StateDictOptions(full_state_dict=True, cpu_offload=True, strict=False)
# What a run writes in its directory, which trainer.overwrite_output_dir deletes (the
# tensorboard plugin hides an earlier run's events itself).
RUN_PLOT = "metrics.png"
"""The plot of the run's metrics (drawn at the end by the built-in plot plugin)."""
RUN_OUTPUTS = ("checkpoints", "metrics.jsonl", "export", RUN_PLOT)


def encoder_config(cfg: DictConfig, vocab_size: int, pad_token_id: int) -> EncoderConfig:
    """The encoder's sizes: the preset, with any model.* key that is set overriding it."""
    m = cfg.model
    overrides = {k: m[k] for k in MODEL_SIZES if m[k] is not None}
    if m.hidden_size is not None and m.intermediate_size is None:
        overrides["intermediate_size"] = 4 * m.hidden_size
    # The sizes were checked by config.validate (positive, hidden a multiple of heads).
    return preset_config(m.preset, vocab_size=vocab_size, pad_token_id=pad_token_id,
                         hidden_dropout_prob=m.hidden_dropout_prob,
                         attention_probs_dropout_prob=m.attention_probs_dropout_prob,
                         max_position_embeddings=m.max_position_embeddings, **overrides)


def _decay_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    # BERT excludes biases and LayerNorm weights from weight decay.
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (no_decay if p.ndim < 2 else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def _check_output_dir(out: Path) -> None:
    """Raise ConfigError naming trainer.output_dir when the run directory cannot be
    made: a part of the path is a file, or the nearest existing folder is not writable."""
    for part in (out, *out.parents):
        if part.exists():
            if not part.is_dir():
                raise ConfigError(f"trainer.output_dir={out}: {part} exists and is not a directory")
            if not os.access(part, os.W_OK | os.X_OK):
                raise ConfigError(f"trainer.output_dir={out}: {part} is not writable")
            return


def _resumed_tokenizer(out: Path) -> Tokenizer | None:
    """The tokenizer of the run to resume in ``out`` (its tokenizer.json), checked against
    its newest checkpoint before any text is tokenized with it; None when it has no
    checkpoint (the run then starts from scratch)."""
    checkpoints = list_checkpoints(out / "checkpoints")
    if not checkpoints:
        return None
    file = out / TOKENIZER_FILE
    if not file.is_file():
        raise CheckpointError(f"{file}: missing; a run resumes with the tokenizer it was "
                              f"trained with")
    tokenizer = read_tokenizer(file)
    vocab_of(tokenizer, str(file))  # DataError naming the file when a special token is missing
    try:  # the full verification is resume()'s; this only reads what the checkpoint recorded
        meta = json.loads((checkpoints[-1] / STATE_FILE).read_text())
    except (OSError, ValueError):
        meta = {}
    check_tokenizer(checkpoints[-1], meta, tokenizer, file)
    return tokenizer


def _export_formats(formats: str | None, plugins: Plugins) -> list[str]:
    """The exporter names of trainer.export, each registered (else one ConfigError line)."""
    names = list(dict.fromkeys(f.strip() for f in (formats or "").split(",") if f.strip()))
    for name in names:
        if name not in plugins.exporters:
            raise ConfigError(f"trainer.export: no plugin registers an exporter named {name!r} "
                              f"(known: {', '.join(sorted(plugins.exporters))})")
    return names


DEVICE_WORKERS = 4
"""DataLoader workers of a run on a GPU when data.num_workers is unset."""


def _adamw(groups, device: torch.device, **settings) -> torch.optim.AdamW:
    """AdamW, fused (one kernel for all parameters; on the CPU about 7x faster than the
    default foreach implementation) where torch has it for ``device``, else torch's default."""
    try:
        return torch.optim.AdamW(groups, fused=True, **settings)
    except RuntimeError:  # no fused kernel for this device or dtype
        return torch.optim.AdamW(groups, **settings)


class _MixForward(torch.nn.Module):
    """The whole forward of a step (encoder, heads, objectives) as one module, so
    DistributedDataParallel can wrap it and synchronise gradients in backward."""

    def __init__(self, model: PretrainingModel, mix: ObjectiveMix):
        super().__init__()
        self.model, self.mix = model, mix

    def forward(self, batch, step: int):
        return self.mix.loss(self.model, batch, step)


def _next_batch(loader):
    """The loader's next batch. One of pretextual's errors raised in a DataLoader worker
    comes back as torch re-raises it, its message the worker's whole traceback: raised
    again here as its last line, the error's own message."""
    try:
        return next(loader)
    except PretextualError as exc:
        text = str(exc)
        if not text.startswith("Caught "):
            raise
        last = text.strip().splitlines()[-1]
        raise type(exc)(last.split(": ", 1)[1] if ": " in last else last) from None


class _NonFinite:
    """The first step whose losses were not finite since the last read, kept on the device
    (recording costs no synchronisation), with the names of the losses that were not."""

    def __init__(self, device: torch.device):
        self.device, self.keys = device, None
        self.clear()

    def clear(self) -> None:
        self.step = torch.tensor(-1, device=self.device)
        self.bad = None

    def record(self, step: int, logs: dict[str, torch.Tensor]) -> None:
        if self.keys is None:
            self.keys = [k for k in sorted(logs) if k == "loss" or k.startswith("loss/")]
        bad = torch.stack([~torch.isfinite(torch.as_tensor(logs[k], device=self.device)).any()
                           for k in self.keys])
        first = (self.step < 0) & bad.any()
        self.step = torch.where(first, step, self.step)
        self.bad = bad if self.bad is None else torch.where(first, bad, self.bad)

    def first(self, world) -> tuple[int | None, list[str]]:
        """(the first non-finite step on any process, its non-finite losses) or (None, [])."""
        step, bad = dist_utils.first_flagged(self.step, self.bad, world)
        if step < 0:
            return None, []
        return step, [k for k, b in zip(self.keys, bad) if b and k != "loss"]


def _documents(n: int) -> str:
    return f"{n} document{'' if n == 1 else 's'}"


class Trainer:
    """One training run, set up from a resolved config.

    ``resume``: continue the run in trainer.output_dir from its newest checkpoint, with
    the tokenizer it was trained with. Without it a directory holding checkpoints is an
    error, unless trainer.overwrite_output_dir is set (they are then deleted)."""

    def __init__(self, cfg: DictConfig, plugins: Plugins | None = None, log=print,
                 resume: bool = False):
        self.cfg = cfg
        self.device = dist_utils.device_for(cfg.trainer.device)
        self.world = dist_utils.init_world(self.device)
        self.log = log if self.world.is_main else (lambda *_: None)
        self.plugins = plugins or Plugins.from_config(cfg)
        self.out = Path(cfg.trainer.output_dir)
        # Checked before any tokenizing or training, so a typo does not cost the run.
        _check_output_dir(self.out)
        self.export_formats = _export_formats(cfg.trainer.export, self.plugins)
        objectives = check_objectives(cfg.objectives, self.plugins)
        cfg.objectives = resolved_objectives(objectives)  # config.yaml records every option
        self.resuming = resume
        if not (resume and list_checkpoints(self.out / "checkpoints")):
            self._check_fresh_run_dir()
        self.should_stop = False  # plugins may set this from pretextual_on_step_end
        self.tokenizer, docs = self._tokenized_corpus()
        too_long = docs.sentences_longer_than(cfg.data.max_seq_length - 2)
        if too_long:
            self.log(f"note: {too_long} sentences of {cfg.data.prepared or cfg.data.corpus} are longer "
                     f"than the {cfg.data.max_seq_length - 2} tokens that data.max_seq_length="
                     f"{cfg.data.max_seq_length} leaves beside [CLS] and [SEP]; they are split into pieces")
        self.vocab = vocab_of(self.tokenizer)  # every tokenizer read from a file was checked there
        self.encoder_config = encoder_config(cfg, self.vocab.size, self.vocab.pad_id)
        context = BuildContext(self.encoder_config, self.vocab, cfg.data.max_seq_length,
                               has_word_boundaries(self.tokenizer))
        self.mix = ObjectiveMix(objectives, context)

        train_docs, eval_docs = split_documents(docs, cfg.data.eval_fraction)
        self._log_split(len(docs), len(eval_docs))
        builder = self.mix.example_builder or full_sentences(cfg.data.max_seq_length, self.vocab)
        seed = cfg.trainer.seed
        self.train_batches = Batches(train_docs, builder, self.mix.batch_transform, self.vocab,
                                     cfg.data.batch_size, seed)
        self.eval_batches = Batches(eval_docs, builder, self.mix.batch_transform, self.vocab,
                                    cfg.data.batch_size, seed + EVAL_SEED_OFFSET,
                                    drop_last=False) if len(eval_docs) else None
        # Build the first epochs now, so bad data fails before any step, naming the split;
        # then the first batch of each split, so a plugin's builder or transform that
        # breaks the batch fails here too.
        splits = [(self.train_batches, f"the training split: {_documents(len(train_docs))}")]
        if self.eval_batches is not None:
            splits.append((self.eval_batches, f"the held-out split: {_documents(len(eval_docs))}, "
                                              f"data.eval_fraction={cfg.data.eval_fraction}"))
        for batches, split in splits:
            try:
                # locate(0) raises for a training epoch shorter than one batch
                found = batches.locate(0) if batches is self.train_batches else batches.available(1)
            except ValueError as exc:
                raise DataError(f"data.corpus: too little text for data.batch_size="
                                f"{cfg.data.batch_size} ({split}): {exc}") from None
            except DataError as exc:
                raise DataError(f"{exc} ({split})") from None
            try:
                if found:
                    batches[0]
            except ValueError as exc:  # collate: a plugin's examples of another layout than a batch's
                if self.mix.example_builder is None:
                    raise
                raise PluginRunError(f"objectives.{self.mix.example_builder.name}: example_builder "
                                     f"made examples that do not make a batch ({split}): {exc}") from None

        self.task_probes = None
        if cfg.trainer.eval_tasks:  # loaded and checked now: a bad task file fails before training
            from pretextual.evaluation.probing import TaskProbes, probes_available
            if probes_available():
                self.task_probes = TaskProbes(list(cfg.trainer.eval_tasks), self.plugins,
                                              self.tokenizer, cfg.data.max_seq_length, self.vocab.size)
            else:
                self.log("warning: trainer.eval_tasks needs scikit-learn (pip install "
                         "'pretextual[eval]'); this run probes no downstream task")

        torch.manual_seed(seed)
        self.model = PretrainingModel(self.encoder_config, self.mix.heads).to(self.device)
        self.accelerations = accelerate(self.model, self.model.bert, self.device.type,
                                        cfg.trainer.compile, cfg.trainer.cpu_kernels, self.log)
        self.forward = _MixForward(self.model, self.mix)
        if cfg.trainer.fsdp and self.world.enabled:
            # FSDP2: each layer's parameters, gradients and optimizer state sharded over ranks.
            from torch.distributed.fsdp import fully_shard
            for layer in self.model.bert.encoder.layer:
                fully_shard(layer)
            fully_shard(self.forward)
        elif self.world.enabled:
            # Searching for unused parameters costs every backward a graph traversal: only
            # when some are (the pooler, when no objective reads it).
            self.forward = torch.nn.parallel.DistributedDataParallel(
                self.forward, device_ids=[self.device.index] if self.device.type == "cuda" else None,
                find_unused_parameters=self._has_unused_parameters())
        t = cfg.trainer
        self.optimizer = _adamw(_decay_groups(self.model, t.weight_decay), self.device, lr=t.lr,
                                betas=(t.adam_beta1, t.adam_beta2), eps=t.adam_eps)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, self._lr_factor)
        self._eval_loader = None
        self.step = 0
        self.start_step = 0  # the step train() started from: 0, or the resumed checkpoint's
        # "time" in metrics.jsonl: seconds since the run started, continued across resumes.
        self._started, self._time_offset = time.perf_counter(), 0.0

    def _log_split(self, documents: int, held_out: int) -> None:
        """Say when the held-out split is empty or far larger than data.eval_fraction asks."""
        fraction = self.cfg.data.eval_fraction
        if fraction > 0 and held_out == 0:
            self.log(f"warning: no held-out split, so no evaluation: the corpus has "
                     f"{_documents(documents)}, and a split keeps at least "
                     f"{MIN_SPLIT_DOCUMENTS} on each side (in a text file a blank line ends a "
                     f"document)")
        elif held_out > max(2 * fraction * documents, 1):
            self.log(f"note: {held_out} of the corpus's {documents} documents are held out for "
                     f"evaluation ({held_out / documents:.0%}; data.eval_fraction={fraction}), "
                     f"the fewest a split keeps")

    def _lr_factor(self, step: int) -> float:
        t = self.cfg.trainer
        if step < t.warmup_steps:
            return (step + 1) / t.warmup_steps
        return max(0.0, (t.max_steps - step) / max(1, t.max_steps - t.warmup_steps))

    def _check_fresh_run_dir(self) -> None:
        """A new run must not mix with an earlier one's checkpoints (rotation would keep
        theirs and delete its own) nor replace its export: ConfigError unless
        trainer.overwrite_output_dir."""
        earlier = list_checkpoints(self.out / "checkpoints")
        export = self.out / "export"
        what = (f"the checkpoints of an earlier run (newest {earlier[-1].name})" if earlier else
                "an earlier run's export/" if export.is_dir() and any(export.iterdir()) else "")
        if dist_utils.any_over_ranks(bool(what), self.world, self.device) \
                and not self.cfg.trainer.overwrite_output_dir:
            raise ConfigError(f"trainer.output_dir={self.out}: holds {what or 'an earlier run'}; "
                              f"continue it with --resume, or set "
                              f"trainer.overwrite_output_dir=true to delete it and start afresh")

    def _has_unused_parameters(self) -> bool:
        """Whether a step leaves some parameter without a gradient: one forward and backward
        of the first training batch, whose gradients and random draws are then undone."""
        batch = self._to_device(self.train_batches[self.train_indices()[0]])
        devices = [self.device] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices), self._autocast():
            total, _ = self.forward(batch, 0)
            total.backward()
        unused = any(p.grad is None for p in self.model.parameters() if p.requires_grad)
        self.model.zero_grad(set_to_none=True)
        return dist_utils.any_over_ranks(unused, self.world, self.device)

    def _tokenized_corpus(self):
        """The run's tokenizer and documents. The main process tokenizes (training the
        tokenizer, whose ties tokenizers breaks differently in each process, unless the run
        resumes with its own) and fills the cache; the others tokenize with its tokenizer,
        from the cache when it holds that one."""
        cfg, main = self.cfg, self.world.is_main
        required, source = None, ""
        if main and self.resuming:
            required, source = _resumed_tokenizer(self.out), f"{self.out / TOKENIZER_FILE}"
        if main:
            tokenizer, docs = tokenized_corpus(cfg.data, log=self.log, tokenizer=required)
        text = dist_utils.broadcast_text(tokenizer.to_str() if main else None, self.world,
                                          self.device)
        if not main:
            required, source = Tokenizer.from_str(text), "the main process's"
            tokenizer, docs = tokenized_corpus(cfg.data, log=self.log, tokenizer=required)
        if required is not None and tokenizer_sha256(tokenizer) != tokenizer_sha256(required):
            # only a prepared corpus comes with a tokenizer of its own
            raise DataError(f"data.prepared: {cfg.data.prepared} was prepared with another "
                            f"tokenizer than {source}")
        return tokenizer, docs

    @property
    def global_batch_size(self) -> int:
        """Examples per optimizer step: micro-batch x world size x accumulation steps."""
        return self.cfg.data.batch_size * self.world.world_size * self.cfg.trainer.grad_accum_steps

    # --- state -----------------------------------------------------------------------------

    def _meta(self) -> dict:
        return {"pretextual_version": pretextual.__version__,
                "encoder_config": self.encoder_config.to_dict(),
                "objectives": self.mix.names, "heads": sorted(self.mix.heads),
                "scheduler_last_epoch": self.scheduler.last_epoch,
                "world_size": self.world.world_size,
                "tokenizer_sha256": tokenizer_sha256(self.tokenizer),
                "config": OmegaConf.to_container(self.cfg)}

    def save(self) -> Path:
        """Write a checkpoint (the main process writes; every process takes part)."""
        rng = {f"torch.{r}": s for r, s in
               enumerate(dist_utils.gather_rng_states(self.world, self.device))}
        model_state = get_model_state_dict(self.model, options=FULL_STATE)
        optimizer_state = get_optimizer_state_dict(self.model, self.optimizer, options=FULL_STATE)
        path = self.out / "checkpoints" / f"step-{self.step:07d}"
        if self.world.is_main:
            path = save_checkpoint(self.out / "checkpoints", self.step, model_state, optimizer_state,
                                   self._meta(), rng, self.cfg.trainer.keep_checkpoints,
                                   tied_keys(self.model))
            self.plugins.hook.pretextual_on_checkpoint(step=self.step, path=str(path), trainer=self)
        dist_utils.barrier(self.world)
        return path

    def resume(self) -> bool:
        """Restore the newest good checkpoint of the run directory; False when there is none."""
        if self.world.is_main:
            remove_partial_checkpoints(self.out / "checkpoints")
        ckpt = latest_checkpoint(self.out / "checkpoints")
        if ckpt is None:
            found = list_checkpoints(self.out / "checkpoints")
            if found:  # never start over on top of them: they may be repairable
                raise CheckpointError(f"{self.out / 'checkpoints'}: none of its {len(found)} "
                                      f"checkpoints verifies (see the warnings above); nothing "
                                      f"was deleted")
            return False
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
        rng = tensors.get(f"rng.torch.{self.world.rank}")
        if rng is not None:
            dist_utils.set_rng_state(rng, self.device)
        else:  # a new rank after a change of world size: a fresh, seeded dropout stream
            torch.manual_seed(self.cfg.trainer.seed + 7919 * self.world.rank + ckpt.step)
        self.step = ckpt.step
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

    def train_indices(self, start_step: int = 0) -> list[int]:
        """Micro-batch ids this process reads from ``start_step`` to trainer.max_steps:
        global micro-batch (s*accum + a)*world + rank."""
        accum, w = self.cfg.trainer.grad_accum_steps, self.world
        return [(s * accum + a) * w.world_size + w.rank
                for s in range(start_step, self.cfg.trainer.max_steps) for a in range(accum)]

    def _to_device(self, batch):
        return {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}

    def _autocast(self):
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.cfg.trainer.bf16)

    def _write_metrics(self, record: dict) -> None:
        record["time"] = round(self._time_offset + time.perf_counter() - self._started, 3)
        with open(self.out / "metrics.jsonl", "a") as f:
            f.write(json.dumps(record) + "\n")

    def _start_run_dir(self, resumed: bool) -> None:
        if not self.world.is_main:
            return
        try:
            self.out.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"trainer.output_dir={self.out}: cannot create it ({exc.strerror})") from None
        if not resumed and self.cfg.trainer.overwrite_output_dir:
            for name in RUN_OUTPUTS:
                path = self.out / name
                if path.is_dir():
                    shutil.rmtree(path)
                elif path.exists():
                    path.unlink()
        (self.out / "config.yaml").write_text(to_yaml(self.cfg))
        (self.out / TOKENIZER_FILE).write_text(self.tokenizer.to_str())
        metrics = self.out / "metrics.jsonl"
        if not resumed and metrics.exists():  # a run that never wrote a checkpoint
            metrics.unlink()
        elif resumed and metrics.exists():  # drop lines logged after the checkpoint we resume from
            lines = [l for l in metrics.read_text().splitlines()
                     if json.loads(l).get("step", 0) <= self.step]
            metrics.write_text("".join(l + "\n" for l in lines))
            self._time_offset = max((json.loads(l).get("time", 0.0) for l in lines), default=0.0)

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
            batch = _next_batch(loader)
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
            batch = _next_batch(loader)
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
        """Train to trainer.max_steps; returns the last evaluation's metrics."""
        t = self.cfg.trainer
        resumed = self.resume() if self.resuming else False
        if self.resuming and not resumed:
            self.log(f"no checkpoint in {self.out / 'checkpoints'}; starting from scratch")
        if resumed and self.step >= t.max_steps:  # the run directory stays as it is
            self.log(f"nothing to train: the checkpoint is at step {self.step} and "
                     f"trainer.max_steps={t.max_steps} (raise trainer.max_steps to train on; "
                     f"`pretextual export` exports it)")
            return {}
        self.start_step = self.step
        self._start_run_dir(resumed)
        weights = ", ".join(f"{n} (weight {w:g})" for n, w in self.mix.weights(self.step).items())
        self.log(f"objectives: {weights} | encoder {count_parameters(self.model.bert):,} parameters "
                 f"| global batch {self.global_batch_size} = {self.cfg.data.batch_size} x "
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
        self.model.train()
        loader = iter(self.loader(self.train_batches, self.train_indices(self.step)))
        bar = tqdm(total=t.max_steps, initial=self.step, unit="step", dynamic_ncols=True,
                   disable=not (t.progress and self.world.is_main))
        last_eval: dict[str, float] = {}
        tokens_seen, clock = 0, time.perf_counter()
        watch = _NonFinite(self.device)
        while self.step < t.max_steps and not self.should_stop:
            logs, tokens = self._micro_steps(loader)
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
                bad_step, bad = watch.first(self.world)
                if bad_step is not None:
                    message = f"step {bad_step}: non-finite loss in {', '.join(bad) or 'loss'}"
                    if t.nonfinite == "stop":
                        kept = list_checkpoints(self.out / "checkpoints")
                        raise TrainingError(f"{message}; stopped, "
                                            + (f"the last good checkpoint {kept[-1]} is kept" if kept
                                               else "no checkpoint had been written yet")
                                            + " (trainer.nonfinite=skip skips such batches)")
                    self.log(f"warning: {message}; batch skipped (trainer.nonfinite=skip)")
                    watch.clear()
                    skipped = True
            if skipped:
                self.optimizer.zero_grad(set_to_none=True)
            else:
                if t.max_grad_norm > 0:
                    torch.nn.utils.clip_grad_norm_(self.model.parameters(), t.max_grad_norm)
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=True)
            lr = self.scheduler.get_last_lr()[0]
            self.scheduler.step()
            weights = self.mix.weights(self.step)
            self.step = step
            tokens_seen += tokens

            if logging:
                tokens, tokens_seen = dist_utils.sum_over_ranks((tokens, tokens_seen), self.world,
                                                                 self.device)
                if self.world.is_main:
                    now = time.perf_counter()
                    record = {"step": self.step, **logs,
                              **{f"weight/{k}": w for k, w in weights.items()},
                              "lr": lr, "tokens": tokens,
                              "tokens_per_s": tokens_seen / max(now - clock, 1e-9)}
                    if skipped:
                        record["skipped"] = 1
                    clock = now
                    self._write_metrics(record)
                    bar.set_postfix(loss=f"{record['loss']:.3f}",
                                    tok_s=f"{record['tokens_per_s']:.0f}")
                    self.plugins.hook.pretextual_on_step_end(step=self.step, metrics=record,
                                                             trainer=self)
                tokens_seen = 0
                # a plugin asks on the main process; every process stops at the same step
                self.should_stop = dist_utils.any_over_ranks(self.should_stop, self.world,
                                                             self.device)
            bar.update(1)

            done = self.step == t.max_steps or self.should_stop
            if (t.eval_every and self.step % t.eval_every == 0) or done:
                last_eval = self.evaluate()  # on every process (FSDP needs all to take part)
                if last_eval and self.world.is_main:
                    bad = [k for k, v in last_eval.items() if not math.isfinite(v)]
                    if bad:
                        self.log(f"warning: step {self.step}: the evaluation gave non-finite "
                                 f"{', '.join(bad)}")
                    record = {"step": self.step, **last_eval}
                    self._write_metrics(record)
                    self.plugins.hook.pretextual_on_eval(
                        step=self.step, metrics={k: v for k, v in record.items() if k != "step"},
                        trainer=self)
            if self.step % t.checkpoint_every == 0 or done:
                self.save()
        bar.close()
        if self.world.is_main:
            self.plugins.hook.pretextual_on_train_end(metrics=last_eval, trainer=self)
        return last_eval

    @property
    def final_checkpoint(self) -> Path:
        """The directory of the checkpoint at the current step."""
        return self.out / "checkpoints" / f"step-{self.step:07d}"
