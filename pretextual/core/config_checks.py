"""The checks of a loaded config that span several keys or that its types cannot
express: ranges, model shapes, the device name, and whether the model can fit in
memory at all. Each failure is one ConfigError line naming the key."""

from __future__ import annotations

import math
import os
from urllib.parse import urlparse
from pathlib import Path

from omegaconf import DictConfig

from pretextual.architectures import SIZES as MODEL_SIZES
from pretextual.architectures import architecture, sized_config
from pretextual.errors import ConfigError, PluginError
NO_OBJECTIVE = "objectives: no objective selected (e.g. objectives.mlm.weight=1)"
WANDB_MODES = ("online", "offline", "disabled")
"""What trainer.wandb_mode may be: the modes of wandb.init."""


def validate(cfg: DictConfig) -> None:
    """Checks that span several keys or that the types cannot express."""
    m, d, t = cfg.model, cfg.data, cfg.trainer
    spec = model_architecture(cfg)
    if m.preset not in spec.presets:
        raise ConfigError(f"model.preset: {m.architecture} has no preset {m.preset!r} "
                          f"(known: {', '.join(spec.presets)})")
    # The model sizes may be unset (None): the preset then gives them.
    sizes = {f"model.{key}": m[key] for key in MODEL_SIZES if m[key] is not None}
    positive = {**sizes, "data.max_seq_length": d.max_seq_length, "data.batch_size": d.batch_size,
                "data.vocab_size": d.vocab_size, "trainer.max_steps": t.max_steps,
                "trainer.grad_accum_steps": t.grad_accum_steps,
                "trainer.checkpoint_every": t.checkpoint_every,
                "trainer.keep_checkpoints": t.keep_checkpoints, "trainer.log_every": t.log_every,
                "trainer.eval_batches": t.eval_batches, "trainer.adam_eps": t.adam_eps,
                **({"trainer.print_every": t.print_every} if t.print_every is not None else {})}
    not_negative = {"trainer.lr": t.lr, "trainer.eval_every": t.eval_every,
                    "data.num_workers": d.num_workers or 0, "trainer.warmup_steps": t.warmup_steps,
                    "trainer.max_grad_norm": t.max_grad_norm, "trainer.weight_decay": t.weight_decay}
    below_one = {**{f"model.{k}": m[k] for k in ("hidden_dropout_prob", "attention_probs_dropout_prob")
                    if m[k] is not None},
                 "trainer.adam_beta1": t.adam_beta1, "trainer.adam_beta2": t.adam_beta2,
                 "data.eval_fraction": d.eval_fraction}
    for key, value in {**positive, **not_negative}.items():
        if not math.isfinite(value):  # NaN or inf: torch would fail (or diverge) steps later
            raise ConfigError(f"{key} must be a finite number, got {value}")
    # Each test is written so that NaN fails it too.
    for key, value in positive.items():
        if not value > 0:
            raise ConfigError(f"{key} must be positive, got {value}")
    for key, value in not_negative.items():
        if not value >= 0:
            raise ConfigError(f"{key} must not be negative, got {value}")
    for key, value in below_one.items():
        if not 0.0 <= value < 1.0:
            raise ConfigError(f"{key} must be in [0, 1), got {value}")
    hidden, heads = (_size(m, spec, key) for key in ("hidden_size", "num_attention_heads"))
    if hidden[0] % heads[0]:
        raise ConfigError(f"model.hidden_size ({hidden[1]}) must be a multiple of "
                          f"model.num_attention_heads ({heads[1]})")
    check_device(t.device)
    if d.max_seq_length < 8:
        raise ConfigError(f"data.max_seq_length must be at least 8, got {d.max_seq_length}")
    if d.max_seq_length > m.max_position_embeddings:
        raise ConfigError(f"data.max_seq_length ({d.max_seq_length}) exceeds "
                          f"model.max_position_embeddings ({m.max_position_embeddings})")
    if t.nonfinite not in ("stop", "skip"):
        raise ConfigError(f"trainer.nonfinite must be 'stop' or 'skip', got {t.nonfinite!r}")
    if t.max_skipped_steps < 0:
        raise ConfigError(f"trainer.max_skipped_steps must not be negative, got {t.max_skipped_steps}")
    if t.mlflow_tracking_uri is not None and is_file_store(t.mlflow_tracking_uri):
        raise ConfigError(f"trainer.mlflow_tracking_uri={t.mlflow_tracking_uri}: MLflow's file "
                          f"store keeps each metric in a file named after it, so it cannot hold "
                          f"both loss and loss/mlm; give a database (sqlite:///path/mlflow.db, "
                          f"the default's kind) or a tracking server's URL")
    if t.wandb_mode is not None and t.wandb_mode not in WANDB_MODES:
        raise ConfigError(f"trainer.wandb_mode must be one of {', '.join(WANDB_MODES)} (or unset), "
                          f"got {t.wandb_mode!r}")
    check_schedule(t)
    from pretextual.core.phases import plan
    plan(cfg)  # each phase's keys
    check_sources(d)
    _check_fits_in_memory(cfg, spec)
    if not cfg.objectives:
        raise ConfigError(NO_OBJECTIVE)


TRAINING_BYTES_PER_PARAMETER = 16
"""fp32 weights, gradients and AdamW's two moments: what training holds per parameter
before any activation."""


def _memory(device: str) -> tuple[int, str]:
    """(bytes of memory, its name) where a run on ``device`` keeps its parameters."""
    import torch

    if device != "cpu" and torch.cuda.is_available():
        index = int(device.partition(":")[2] or 0)
        if index < torch.cuda.device_count():
            return torch.cuda.get_device_properties(index).total_memory, f"cuda:{index}'s"
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "this machine's"


def model_architecture(cfg: DictConfig):
    """The registered architecture model.architecture names (the run's plugins.modules
    included); ConfigError listing the known ones otherwise."""
    modules = tuple((cfg.get("plugins") or {}).get("modules") or ())
    try:
        return architecture(cfg.model.architecture, modules=modules)
    except PluginError as exc:
        raise ConfigError(str(exc)) from None


def _check_fits_in_memory(cfg: DictConfig, spec) -> None:
    """ConfigError naming the model sizes when the encoder and MLM head could not even be
    trained in the device's memory: an estimate from the sizes, a lower bound (no
    activations), so it never refuses a model that fits."""
    m, d = cfg.model, cfg.data
    config = sized_config(spec, m.preset, {k: m[k] for k in MODEL_SIZES}, {},
                          vocab_size=d.vocab_size, max_position_embeddings=m.max_position_embeddings)
    h = config.hidden_size
    parameters = config.num_parameters() + h * h + 3 * h + d.vocab_size  # + the MLM head
    need = parameters * TRAINING_BYTES_PER_PARAMETER
    have, where = _memory(cfg.trainer.device)
    if need > have:
        set_keys = ", ".join(f"model.{k}={m[k]}" for k in MODEL_SIZES if m[k] is not None)
        raise ConfigError(f"model sizes ({set_keys or f'model.preset={m.preset}'}): about "
                          f"{parameters / 1e9:.1f} billion parameters need at least "
                          f"{need / 2**30:,.0f} GiB to train (weights, gradients and AdamW's "
                          f"moments, {TRAINING_BYTES_PER_PARAMETER} bytes each), more than "
                          f"{where} {have / 2**30:,.0f} GiB of memory")


def _size(model: DictConfig, spec, key: str) -> tuple[int, str]:
    """model.<key> as the encoder gets it (set, else the preset's), and as a message shows it."""
    if model[key] is not None:
        return model[key], str(model[key])
    value = spec.presets[model.preset][key]
    return value, f"{value}, from model.preset={model.preset}"


def is_file_store(uri: str) -> bool:
    """Whether an MLflow tracking URI names a directory (a path, or file:...); the bare
    word ``databricks`` is MLflow's name for a Databricks workspace."""
    return urlparse(uri).scheme in ("", "file") and uri != "databricks"


def check_device(name: str) -> None:
    """Raise ConfigError naming trainer.device unless it is 'auto', 'cpu', 'cuda' or
    'cuda:N' (whether this machine has CUDA is checked when a run starts)."""
    kind, colon, index = name.partition(":")
    if kind not in ("auto", "cpu", "cuda") or (colon and (kind != "cuda" or not index.isdigit())):
        raise ConfigError(f"trainer.device: unknown device {name!r} (known: auto, cpu, cuda, cuda:N)")


def source_names(sources) -> list[str]:
    """Each source's name: its own, else its corpus's (or prepared directory's) file name."""
    names = []
    for s in sources:
        path = Path(s.corpus or s.prepared or "source")
        names.append(s.name or (path.name.split(".")[0] if path.name else str(path)))
    return names


def check_sources(data: DictConfig) -> None:
    """ConfigError lines for data.sources and data.mix_temperature (called with the rest
    of the config checks, before any file is read)."""
    if data.mix_temperature is not None and not data.sources:
        raise ConfigError("data.mix_temperature: mixes data.sources, and none is given")
    if not data.sources:
        return
    if data.prepared:
        raise ConfigError("data.prepared and data.sources: give each source its own prepared "
                          "directory (data.sources[i].prepared) instead")
    for i, source in enumerate(data.sources):
        key = f"data.sources[{i}]"
        if bool(source.corpus) == bool(source.prepared):
            raise ConfigError(f"{key}: give exactly one of corpus and prepared")
        if source.weight is not None:
            if data.mix_temperature is not None:
                raise ConfigError(f"{key}.weight: data.mix_temperature weighs the sources by "
                                  f"their size; give no weight, or no temperature")
            if not (math.isfinite(source.weight) and source.weight >= 0):
                raise ConfigError(f"{key}.weight must be a finite number, not negative, "
                                  f"got {source.weight}")
    if all(s.weight == 0 for s in data.sources):
        raise ConfigError("data.sources: every weight is zero")
    if data.mix_temperature is not None and not (math.isfinite(data.mix_temperature)
                                                 and data.mix_temperature > 0):
        raise ConfigError(f"data.mix_temperature must be positive, got {data.mix_temperature}")
    names = source_names(data.sources)
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ConfigError(f"data.sources: two sources are named {twice[0]!r}; set "
                          f"data.sources[i].name")


DECAY_SHAPES = ("linear", "cosine", "1-sqrt")
"""trainer.decay_shape (pretextual.core.optim.DECAY_SHAPES draws them)."""


def check_schedule(t) -> None:
    """The learning-rate schedule's own keys (its name and the optimizer's are checked
    against the registries, which plugins extend, when the run is set up) and the budgets."""
    if t.max_tokens is not None and t.max_time is not None:
        raise ConfigError("trainer.max_tokens and trainer.max_time: give one budget, not both")
    if t.phases and (t.max_tokens is not None or t.max_time is not None):
        raise ConfigError("trainer.phases: each phase has its steps; give no trainer.max_tokens "
                          "or trainer.max_time with them")
    if t.max_tokens is not None and not t.max_tokens > 0:
        raise ConfigError(f"trainer.max_tokens must be positive, got {t.max_tokens}")
    if t.max_time is not None:
        from pretextual.core.budget import parse_duration
        parse_duration(t.max_time)
    if t.decay_shape not in DECAY_SHAPES:
        raise ConfigError(f"trainer.decay_shape must be one of {', '.join(DECAY_SHAPES)}, "
                          f"got {t.decay_shape!r}")
    for key in ("min_lr_ratio", "decay_fraction"):
        if not 0.0 <= t[key] <= 1.0:
            raise ConfigError(f"trainer.{key} must be in [0, 1], got {t[key]}")
    if t.decay_steps is not None and not 0 <= t.decay_steps <= t.max_steps:
        raise ConfigError(f"trainer.decay_steps must be in [0, trainer.max_steps={t.max_steps}], "
                          f"got {t.decay_steps}")
