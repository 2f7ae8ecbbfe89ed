"""The config schema (typed dataclasses) and its loading: recipe or YAML file, then key=value overrides.

Each field's docstring is its documentation; docs/config.md is generated from
these classes (``pretextual config --reference``), so it cannot drift.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Callable, Optional

from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from pretextual.core.config_checks import validate
from pretextual.errors import ConfigError, plugin_call
from pretextual.plugins.api import SCHEDULE_KEYS  # WeightSchedule's fields (tests/test_architecture.py)


@dataclass
class ModelConfig:
    architecture: str = "bert"
    """The encoder, by registered name: bert (post-LN BERT) or modernbert (pre-LN, rotary, GeGLU, local/global attention), or one a plugin registers."""
    preset: str = "tiny"
    """Named size: for bert tiny (2x128), mini (4x256), small (4x512), medium (8x512), base (12x768), large (24x1024); for modernbert tiny (3x128), mini (6x256), small (6x512), medium (12x512), base (22x768, the paper's), large (28x1024)."""
    num_hidden_layers: Optional[int] = None
    """Overrides the preset's number of layers."""
    hidden_size: Optional[int] = None
    """Overrides the preset's hidden size (intermediate_size follows as 4x, 1.5x for modernbert, unless set)."""
    num_attention_heads: Optional[int] = None
    """Overrides the preset's number of attention heads."""
    intermediate_size: Optional[int] = None
    """Overrides the feed-forward size."""
    hidden_dropout_prob: Optional[float] = None
    """Dropout after embeddings and each sub-layer; unset: the architecture's (0.1 for bert, 0 for modernbert)."""
    attention_probs_dropout_prob: Optional[float] = None
    """Dropout on attention probabilities (modernbert: on the attention output too); unset: the architecture's (0.1 for bert, 0 for modernbert)."""
    max_position_embeddings: int = 512
    """Size of the position table (at least data.max_seq_length)."""
    init_from: Optional[str] = None
    """Start from trained weights: a pretextual run (its newest checkpoint), a checkpoint, an export, or a directory transformers saved (BertModel, BertForMaskedLM, BertForPreTraining, ModernBertModel, ModernBertForMaskedLM). The architecture and sizes are its own (a model.* key set to another value is an error), its tokenizer becomes the run's unless data.tokenizer is set, each head of the run it has is loaded; the optimizer and step start fresh (not --resume)."""


@dataclass
class SourceConfig:
    """One corpus of a mix (data.sources[i])."""

    corpus: Optional[str] = None
    """The source's corpus, in any form data.corpus takes."""
    prepared: Optional[str] = None
    """A directory `pretextual prepare` wrote for this source, instead of corpus (every source then shares one tokenizer: prepare each with --tokenizer)."""
    weight: Optional[float] = None
    """The source's share of the training batches, relative to the other sources' weights; unset: 1, or its size^(1/T) under data.mix_temperature."""
    name: Optional[str] = None
    """The name metrics.jsonl logs its share under (source/<name>/share); unset: the corpus's file or folder name."""
    text_field: Optional[str] = None
    """Overrides data.text_field for this source."""


@dataclass
class DataConfig:
    corpus: str = "embedded"
    """A text file (one sentence or paragraph per line, blank line between documents) or a .jsonl file (one document per line, in data.text_field), either may be gzip/bzip2/xz/zstd-compressed (.txt.gz, .jsonl.zst; streamed); a Parquet or Arrow file (one document per row of the data.text_field column; the arrow extra); a folder datasets' save_to_disk wrote (its train split); a directory, of which the .txt, .text, .jsonl (compressed or not), .parquet and .arrow files are read (others are skipped with a warning naming them); a glob (quoted), of which every matched file is read; or 'embedded' (text shipped with Python). Formats are told by a file's first bytes, whatever its name."""
    prepared: Optional[str] = None
    """A directory written by `pretextual prepare`: train from its memory-mapped shards (and tokenizer) instead of reading data.corpus, for corpora larger than memory."""
    text_field: str = "text"
    """Field holding the text in .jsonl corpora, column holding it in Parquet and Arrow ones."""
    tokenizer: Optional[str] = None
    """A tokenizer.json to use, a directory holding one (a transformers model directory, a pretextual export), or a BERT WordPiece vocab.txt (or a directory holding vocab.txt and no tokenizer.json; lower-cased as a tokenizer_config.json beside it says in do_lower_case, else as data.lowercase); unset trains a WordPiece tokenizer on the corpus."""
    vocab_size: int = 8192
    """Vocabulary size of the trained WordPiece tokenizer."""
    lowercase: bool = True
    """Lower-case text in the trained tokenizer (as bert-base-uncased)."""
    max_seq_length: int = 64
    """Tokens per example, [CLS] and [SEP] included."""
    document_attention: Optional[bool] = None
    """In examples packed from several documents, each token attends only within its own document and positions restart at each; unset: on for modernbert, off for bert (an objective that builds its own examples, as nsp and sop do, is not packed)."""
    batch_size: int = 64
    """Examples per micro-batch."""
    eval_fraction: float = 0.05
    """Share of documents held out for evaluation: at least 2, and 2 kept for training, so none below 4 documents."""
    cache_dir: str = "~/.cache/pretextual"
    """Where tokenizers and tokenized corpora are cached between runs."""
    num_workers: Optional[int] = None
    """DataLoader worker processes preparing batches ahead of the step (kept alive between epochs and evaluations); unset: none on the CPU, where workers would take the step's cores, 4 on other devices."""
    sources: list[SourceConfig] = field(default_factory=list)
    """Several corpora mixed by weight, instead of data.corpus: a list of {corpus (or prepared), weight, name, text_field}. Each training batch comes from one source, the sources interleaved evenly so that every source's share of the batches is its weight's share to within 1/1000 at any step; each source keeps its own held-out split, and evaluation reads them all."""
    mix_temperature: Optional[float] = None
    """Weigh the sources by their size (tokens) to the power 1/T, as multilingual encoders do (T=1: by size; larger T: closer to uniform); the sources then give no weight."""


@dataclass
class PhaseConfig:
    """One phase of a run (trainer.phases[i]); what it leaves unset is the run's."""

    steps: Optional[int] = None
    """Optimizer steps of the phase."""
    max_seq_length: Optional[int] = None
    """Its data.max_seq_length."""
    batch_size: Optional[int] = None
    """Its data.batch_size."""
    lr: Optional[float] = None
    """Its peak learning rate (trainer.lr), which the run's schedule scales."""
    name: Optional[str] = None
    """What metrics.jsonl and the console call it; unset: '<length> tokens'."""


@dataclass
class TrainerConfig:
    max_steps: int = 1000
    """Optimizer steps to train for."""
    max_tokens: Optional[int] = None
    """Train until the steps' tokens (non-padding, over all processes, as metrics.jsonl counts them) reach this, instead of max_steps; the schedule is sized to the steps that takes, estimated from the first 64 micro-batches."""
    phases: list[PhaseConfig] = field(default_factory=list)
    """Phases run one after another in the run directory, each changing steps, max_seq_length, batch_size and lr (e.g. [{steps: 900, max_seq_length: 128}, {steps: 100, max_seq_length: 512}], the bert-128-512 recipe); max_steps is then their sum, the schedule spans them all, and every metrics line says its phase."""
    max_time: Optional[str] = None
    """Train until this much wall-clock time has passed (3600, 45m, 2h; metrics.jsonl's clock, continued across resumes), instead of max_steps, which is then only the schedule's first guess: its length is re-estimated from the measured rate at every logged step."""
    lr: float = 3e-3
    """Peak learning rate."""
    optimizer: str = "adamw"
    """adamw (trainer.adam_* apply), adafactor (torch's; factored second moments), or one a plugin registers."""
    weight_decay: float = 0.01
    """AdamW weight decay (not applied to biases and LayerNorm weights)."""
    adam_beta1: float = 0.9
    """AdamW beta1."""
    adam_beta2: float = 0.98
    """AdamW beta2."""
    adam_eps: float = 1e-6
    """AdamW epsilon."""
    warmup_steps: int = 100
    """Linear warm-up steps, before the schedule's own shape."""
    lr_schedule: str = "linear"
    """After warm-up: linear (decay to min_lr_ratio at max_steps), cosine, constant, inverse_sqrt, wsd (warmup-stable-decay: the peak, then a decay over the last decay_steps), or one a plugin registers."""
    min_lr_ratio: float = 0.0
    """Where linear, cosine and wsd decay to, as a fraction of trainer.lr."""
    decay_steps: Optional[int] = None
    """wsd: steps of the final decay; unset: decay_fraction of max_steps. Resuming a stable-phase checkpoint with a new max_steps (and decay_steps) decays toward the new end."""
    decay_fraction: float = 0.1
    """wsd: the decay's share of max_steps when decay_steps is unset."""
    decay_shape: str = "linear"
    """wsd: the decay's shape, linear, cosine or 1-sqrt (ModernBERT's)."""
    grad_accum_steps: int = 1
    """Micro-batches per optimizer step."""
    max_grad_norm: float = 1.0
    """Gradient clipping norm (0 disables)."""
    bf16: bool = False
    """Run the forward pass under bf16 autocast."""
    compile: bool = False
    """Compile the encoder with torch.compile (the standard path on a GPU): the same losses as eager; compiling takes the first step."""
    eval_every: int = 250
    """Evaluate on the held-out split every N steps (and at the end); 0 only at the end."""
    eval_batches: int = 10
    """Held-out batches per evaluation."""
    eval_tasks: list[str] = field(default_factory=list)
    """Downstream tasks probed at each evaluation and on the initial encoder (task files with text/label columns, or registered names such as python-packages): the frozen-feature probe of `pretextual evaluate`, logged as eval/<task>/<metric>."""
    summary_task: Optional[str] = "word-order"
    """The downstream task `pretextual train` probes on the final and on the untrained encoder for its closing summary, when eval_tasks is empty (null: none)."""
    log_every: int = 1
    """Append a metrics line every N steps."""
    checkpoint_every: int = 250
    """Write a checkpoint every N steps (and at the end)."""
    keep_checkpoints: int = 2
    """How many of the latest checkpoints to keep."""
    seed: int = 0
    """Seed of initialisation, data order, masking and dropout."""
    output_dir: Optional[str] = None
    """Run directory: metrics.jsonl, checkpoints, tokenizer, config. Unset: a new runs/<recipe>-<YYYYmmdd-HHMMSS> (with --resume: the run runs/latest points at). runs/latest links to the newest run started in runs/."""
    overwrite_output_dir: bool = False
    """Start afresh in an output_dir that holds an earlier run's checkpoints or export, deleting them with its metrics and plot (without it that is an error; --resume continues such a run)."""
    export: Optional[str] = "safetensors,onnx"
    """Formats the final checkpoint is exported to in <output_dir>/export, comma-separated ('' turns it off)."""
    loggers: list[str] = field(default_factory=lambda: ["tensorboard"])
    """Where every metrics line also goes, next to metrics.jsonl (docs/logging.md): tensorboard (<output_dir>/tensorboard/, when the tensorboard package is installed), mlflow, wandb, or a logger a plugin registers; [] for none."""
    mlflow_tracking_uri: Optional[str] = None
    """Where the mlflow logger records runs: a tracking server's URL or a database URI (sqlite:///path/mlflow.db); unset: the SQLite database mlflow.db beside the run directory (runs/mlflow.db for the runs under runs/, artifacts in runs/mlartifacts/). MLflow's file store (a directory) is refused: it cannot hold both loss and loss/mlm."""
    mlflow_experiment: str = "pretextual"
    """The MLflow experiment the mlflow logger's runs go into (made when it does not exist)."""
    wandb_project: str = "pretextual"
    """The Weights & Biases project the wandb logger's runs go into (the team: the WANDB_ENTITY environment variable, else the login's default)."""
    wandb_mode: Optional[str] = None
    """'online', 'offline' (no network: the run stays in <output_dir>/wandb/ until `wandb sync` uploads it) or 'disabled'; unset: W&B's own choice (WANDB_MODE, else online, which needs `wandb login`)."""
    plot: bool = True
    """Write <output_dir>/metrics.png (loss and eval curves) at the end of training when matplotlib is installed."""
    fsdp: bool = False
    """Under torchrun, shard parameters, gradients and optimizer state over processes (FSDP2) instead of replicating them (DDP)."""
    nonfinite: str = "stop"
    """On a NaN/inf loss: 'stop' (keep the last good checkpoint and exit with the step and objective) or 'skip' the batch."""
    max_skipped_steps: int = 10
    """Under trainer.nonfinite=skip, the most steps in a row that may be skipped; one more stops the run with an error."""
    device: str = "auto"
    """'cpu', 'cuda', 'cuda:N', or 'auto' (cuda when available)."""
    progress: bool = True
    """Show a progress bar when stderr is a terminal; otherwise (false, or output to a file or a cluster job's log) print a plain line every trainer.print_every steps."""
    print_every: Optional[int] = None
    """Steps between the plain progress lines; unset: 20 lines over the run."""


@dataclass
class PluginsConfig:
    modules: list[str] = field(default_factory=list)
    """Import paths of plugin modules to load next to the installed ones (loaded even when PRETEXTUAL_LOAD_PLUGINS leaves them out)."""
    strict: bool = False
    """Stop with an error when a plugin fails, instead of skipping it with a warning."""


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    plugins: PluginsConfig = field(default_factory=PluginsConfig)
    objectives: dict[str, Any] = field(default_factory=dict)
    """The objective mix, keyed by name: objectives.<name>.weight plus that objective's own keys."""


@dataclass
class OptionSchedule:
    """A numeric option of an objective that changes over the run
    (objectives.<name>.schedules.<option>), in the vocabulary of the weight schedules."""

    schedule: str = "linear"
    """'linear': from start to the option's value over steps; 'step': start until steps, then the option's value."""
    start: float = 0.0
    """The option's value at step 0."""
    steps: int = 0
    """Length of the linear ramp, or the step at which a step schedule switches."""

    def at(self, end: float, step: int) -> float:
        """The option's value at optimizer step ``step``, ``end`` its configured value."""
        return WeightSchedule(weight=end, schedule=self.schedule, start_weight=self.start,
                              schedule_steps=self.steps).at(step)


@dataclass
class WeightSchedule:
    """Keys every objective has, next to its own (objectives.<name>.<key>)."""

    weight: float = 1.0
    """Weight of this objective's loss term in the total (at the end of any schedule)."""
    schedule: str = "constant"
    """'constant'; 'linear': from start_weight to weight over schedule_steps; 'step': start_weight until schedule_steps, then weight."""
    start_weight: float = 0.0
    """Weight at step 0 for the linear and step schedules."""
    schedule_steps: int = 0
    """Length of the linear ramp, or the step at which a step schedule switches."""
    schedules: dict[str, OptionSchedule] = field(default_factory=dict)
    """Numeric options of the objective that follow a schedule, by name: objectives.mlm.schedules.mask_prob={schedule: linear, start: 0.3, steps: 1000} masks 30% at step 0 down to objectives.mlm.mask_prob at step 1000. The objective's batch transform sees each batch's value (evaluation: the configured one)."""

    def at(self, step: int) -> float:
        """The weight at optimizer step ``step``."""
        return SCHEDULES[self.schedule](self, step)


def _constant(s: WeightSchedule, step: int) -> float:
    return s.weight


def _linear(s: WeightSchedule, step: int) -> float:
    if step < s.schedule_steps:
        return s.start_weight + (s.weight - s.start_weight) * step / s.schedule_steps
    return s.weight


def _step(s: WeightSchedule, step: int) -> float:
    return s.start_weight if step < s.schedule_steps else s.weight


SCHEDULES: dict[str, Callable[[WeightSchedule, int], float]] = {
    "constant": _constant, "linear": _linear, "step": _step}
"""The weight schedules by name (objectives.<name>.schedule): schedule, step -> weight."""
RECIPES_PACKAGE = "pretextual.configs"
DEFAULT_RECIPE = "modernbert"


def recipe_names() -> list[str]:
    """Names of the shipped recipes (pretextual/configs/*.yaml)."""
    return sorted(p.name[:-5] for p in resources.files(RECIPES_PACKAGE).iterdir()
                  if p.name.endswith(".yaml"))


def _read_yaml(source: str) -> DictConfig:
    if source in recipe_names():
        text = resources.files(RECIPES_PACKAGE).joinpath(f"{source}.yaml").read_text()
        where = f"recipe {source!r}"
    else:
        path = Path(source)
        if not path.is_file():
            raise ConfigError(f"{source}: no such config file (recipes: {', '.join(recipe_names())})")
        try:
            text, where = path.read_text(encoding="utf-8"), str(path)
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{source}: cannot read the config file ({_one_line(exc)})") from None
    try:
        loaded = OmegaConf.create(text)
    except Exception as exc:
        raise ConfigError(f"{where}: not valid YAML ({_one_line(exc)})") from None
    if not isinstance(loaded, DictConfig):
        raise ConfigError(f"{where}: expected a mapping at the top level")
    return loaded


def _list_for_mapping(schema, loaded, prefix: str = "") -> str:
    """The first key where ``loaded`` holds a list and ``schema`` a mapping ("" if none):
    what OmegaConf's "Cannot merge incompatible container types" does not name."""
    for key, value in loaded.items_ex(resolve=False) if isinstance(loaded, DictConfig) else ():
        target = schema.get(key) if isinstance(schema, DictConfig) else None
        if isinstance(target, DictConfig):
            if not isinstance(value, DictConfig):
                return f"{prefix}{key}"
            found = _list_for_mapping(target, value, f"{prefix}{key}.")
            if found:
                return found
    return ""


def _one_line(exc: Exception) -> str:
    return " ".join(str(exc).split("\n    full_key")[0].split())


def _apply_overrides(cfg: DictConfig, overrides: list[str]) -> DictConfig:
    """Apply key=value overrides; ``~key`` deletes a key (e.g. ~objectives.nsp)."""
    for item in overrides:
        if item.startswith("~"):
            key = item[1:]
            parent, _, leaf = key.rpartition(".")
            node = OmegaConf.select(cfg, parent) if parent else cfg
            if not isinstance(node, DictConfig) or leaf not in node:
                raise ConfigError(f"{key}: cannot delete, no such key")
            with open_dict(node):  # struct mode lifted for the deletion, then restored
                node.pop(leaf)
            continue
        if "=" not in item:
            raise ConfigError(f"{item}: expected key=value (or ~key to delete)")
        key, value = item.split("=", 1)
        if isinstance(OmegaConf.select(cfg, key, default=None), ListConfig) \
                and value.strip() and not value.strip().startswith("["):
            raise ConfigError(f"{key}: takes a list, written in brackets: {key}=[{value}] "
                              f"(several: {key}=[a,b])")
        try:
            parts = key.split(".")
            indexed = next((i for i, part in enumerate(parts) if part.isdigit()), None)
            if indexed is not None:  # into an element of a list (trainer.phases.0.steps=3)
                listed = OmegaConf.select(cfg, ".".join(parts[:indexed]), default=None)
                if not isinstance(listed, ListConfig) or int(parts[indexed]) >= len(listed):
                    raise ConfigError(f"{key}: {'.'.join(parts[:indexed])} has no element "
                                      f"{parts[indexed]}")
                parsed = OmegaConf.from_dotlist([f"value={value}"]).value
                OmegaConf.update(cfg, key, parsed, merge=True)
                continue
            dotlist = OmegaConf.from_dotlist([f"{key}={value}"])
            cfg = OmegaConf.merge(cfg, dotlist)
        except (OmegaConfBaseException, TypeError) as exc:  # TypeError: a list for a mapping
            raise ConfigError(f"{key}: {_one_line(exc)}") from None
    return cfg


def load_config(source: Optional[str] = None, overrides: tuple[str, ...] | list[str] = ()) -> DictConfig:
    """The resolved, type-checked config: schema defaults, then the recipe or YAML
    file (``bert`` when none), then the overrides. Errors are one ConfigError line."""
    schema = OmegaConf.structured(Config)
    loaded = _read_yaml(source or DEFAULT_RECIPE)
    try:
        cfg = OmegaConf.merge(schema, loaded)
    except (OmegaConfBaseException, TypeError) as exc:  # TypeError: a list for a mapping
        key = getattr(exc, "full_key", None) or _list_for_mapping(schema, loaded)
        raise ConfigError(f"{source or DEFAULT_RECIPE}: {f'{key}: ' if key else ''}"
                          f"{_one_line(exc)}") from None
    cfg = _apply_overrides(cfg, list(overrides))
    validate(cfg)
    return cfg


def objective_options(name: str, raw: Any, options_cls: Optional[type]) -> tuple[WeightSchedule, Any]:
    """Split ``objectives.<name>`` into its weight schedule and the objective's own
    options dataclass, type-checked (unknown keys get OmegaConf's suggestion) and
    checked by the options' ``check(name)`` method when the dataclass has one."""
    if raw is None:
        raw = {}
    if not isinstance(raw, (dict, DictConfig)):
        raise ConfigError(f"objectives.{name}: expected a mapping such as {{weight: 1.0}}, got {raw!r}")
    raw = OmegaConf.to_container(OmegaConf.create(raw)) if isinstance(raw, dict) else \
        OmegaConf.to_container(raw)
    own = {k: v for k, v in raw.items() if k not in SCHEDULE_KEYS}
    schedule = _typed(name, WeightSchedule, {k: v for k, v in raw.items() if k in SCHEDULE_KEYS})
    for key in ("weight", "start_weight"):
        value = getattr(schedule, key)
        if not math.isfinite(value):
            raise ConfigError(f"objectives.{name}.{key} must be a finite number, got {value}")
        if value < 0:
            raise ConfigError(f"objectives.{name}.{key} must not be negative, got {value}")
    if schedule.schedule not in SCHEDULES:
        raise ConfigError(f"objectives.{name}.schedule: unknown schedule {schedule.schedule!r} "
                          f"(known: {', '.join(SCHEDULES)})")
    if schedule.schedule != "constant" and schedule.schedule_steps <= 0:
        raise ConfigError(f"objectives.{name}.schedule_steps must be positive for a "
                          f"{schedule.schedule} schedule")
    if options_cls is None:
        if own:
            raise ConfigError(f"objectives.{name}.{next(iter(own))}: objective {name!r} has no "
                              f"such key (it takes only weight and schedule keys)")
        return schedule, None
    options = _typed(name, options_cls, own)
    if callable(getattr(options, "check", None)):
        plugin_call(f"objectives.{name}", "the options' check()", options.check, name)
    _check_option_schedules(name, schedule.schedules, options)
    return schedule, options


def _check_option_schedules(name: str, schedules: dict, options) -> None:
    """Each scheduled option is a numeric option of the objective, its schedule known and
    its start a value the options' check() accepts."""
    fields = {f.name: f for f in dataclasses.fields(options)} if options is not None else {}
    for option, s in schedules.items():
        key = f"objectives.{name}.schedules.{option}"
        value = getattr(options, option, None) if option in fields else None
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            numeric = sorted(f for f in fields if isinstance(getattr(options, f), (int, float))
                             and not isinstance(getattr(options, f), bool))
            raise ConfigError(f"{key}: {name} has no numeric option {option!r} (its numeric "
                              f"options: {', '.join(numeric) or 'none'})")
        if s.schedule not in ("linear", "step"):
            raise ConfigError(f"{key}.schedule: must be linear or step, got {s.schedule!r}")
        if s.steps <= 0:
            raise ConfigError(f"{key}.steps must be positive, got {s.steps}")
        if callable(getattr(options, "check", None)):
            start = dataclasses.replace(options, **{option: type(value)(s.start)})
            plugin_call(f"{key}.start", "the options' check()", start.check, name)


def _typed(name: str, cls: type, values: dict) -> Any:
    try:
        merged = OmegaConf.merge(OmegaConf.structured(cls), values)
    except OmegaConfBaseException as exc:
        message = _one_line(exc)
        key = getattr(exc, "key", None)
        prefix = f"objectives.{name}.{key}" if key else f"objectives.{name}"
        raise ConfigError(f"{prefix}: {message}") from None
    return OmegaConf.to_object(merged)


def config_changes(old: dict, new: DictConfig) -> list[str]:
    """``key: old -> new`` for every leaf that differs between a saved config (a plain
    dict, as a checkpoint holds it) and ``new``, in key order; keys only one side has
    show as ``(none)``."""
    def leaves(node, prefix=""):
        if isinstance(node, dict):
            for key, value in node.items():
                yield from leaves(value, f"{prefix}{key}.")
        else:
            yield prefix[:-1], node

    before, after = dict(leaves(old)), dict(leaves(OmegaConf.to_container(new)))
    missing = "(none)"
    return [f"{key}: {before.get(key, missing)} -> {after.get(key, missing)}"
            for key in sorted(before.keys() | after.keys()) if before.get(key, missing) != after.get(key, missing)]


def to_yaml(cfg: DictConfig) -> str:
    """The config as YAML: what `pretextual config` prints and a run saves as config.yaml."""
    return OmegaConf.to_yaml(cfg)
