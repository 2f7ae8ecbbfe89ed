"""The types that cross the plugin surface: small dataclasses and protocols.

A plugin registers an :class:`ObjectiveSpec` by name. When a run selects that
name, the core calls ``spec.build(options, context)`` and receives an
:class:`Objective`: the heads it needs, optionally a builder that turns
documents into examples and a transform that corrupts each batch, and the
function that turns the encoder's output into a loss term.

Data flows one way::

    corpus -> documents -> examples (example_builder) -> batches (batch_transform)
           -> encoder -> heads -> loss (ObjectiveOutput) -> weighted sum

Composition rules the core enforces (a conflicting mix is refused when the config
is checked, before the corpus is read, from what each spec declares it
``provides``; never silently trimmed):

* at most one selected objective may provide an ``example_builder`` (two
  sentence-pair builders conflict); with none, the core packs full sentences;
* at most one may provide a ``batch_transform`` (two maskers conflict);
* heads are shared by name: objectives asking for the same head name get the
  same module, provided they name the same factory.

This module is the ground floor: it imports nothing of pretextual, so the core and
every plugin depend on it and not on each other. The encoder appears here only as
the :class:`Encoder` protocol: what a plugin may rely on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Collection, Mapping, Protocol

import numpy as np
import torch
from torch import nn

Batch = dict[str, torch.Tensor]
"""A batch: ``input_ids``, ``attention_mask``, ``token_type_ids``,
``special_tokens_mask``, ``word_starts`` (all ``[batch, seq]``), plus any keys
the example builder or batch transform add (labels such as ``mlm_labels``)."""

Example = dict[str, Any]
"""One example: 1-D int arrays of equal length (``input_ids``,
``token_type_ids``, ``word_starts``) and scalar labels (e.g.
``next_sentence_label``). The core pads arrays and stacks scalars."""


class EncoderConfigLike(Protocol):
    """The encoder's sizes (``encoder.config``, ``context.encoder_config``), field names
    as in the architecture's Hugging Face config (``BertConfig``, ``ModernBertConfig``);
    every architecture has at least these. The core's are dataclasses, so
    ``dataclasses.replace`` gives a resized copy (a narrower generator, say)."""

    architecture: str
    """The name the architecture is registered under (``model.architecture``)."""
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    max_position_embeddings: int
    initializer_range: float
    pad_token_id: int

    def to_dict(self) -> dict[str, Any]:
        """The fields by name (what config.json holds)."""
        ...

    def num_parameters(self) -> int:
        """The encoder's parameters, counted from the sizes before anything is built."""
        ...


class EncoderOutputLike(Protocol):
    """What one forward pass of the encoder returns."""

    last_hidden_state: torch.Tensor
    """[batch, seq, hidden]: the last layer's vector of every position."""
    pooler_output: torch.Tensor
    """[batch, hidden]: the [CLS] summary a sentence-level head reads; what it is depends
    on the architecture (:attr:`ArchitectureSpec.pooled`)."""


class Encoder(Protocol):
    """The shared encoder as a plugin sees it, whatever its architecture: an ``nn.Module``
    (``parameters()``, ``state_dict()``, ``.to()`` as usual) with its sizes, its forward
    pass, its word-embedding table and its own MLM transform. The core's ``BertModel``
    and ``ModernBertModel`` are two."""

    config: EncoderConfigLike

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                 token_type_ids: torch.Tensor | None = None,
                 document_ids: torch.Tensor | None = None) -> EncoderOutputLike:
        """Encode a batch of ``[batch, seq]`` integer tensors. ``document_ids`` (packed
        examples under ``data.document_attention``) keeps each token's attention within
        its own document and restarts positions at each."""
        ...

    def get_input_embeddings(self) -> nn.Embedding:
        """The word-embedding table ``[vocab_size, hidden_size]``: a head ties its output
        projection to it by assigning its ``weight`` (the checkpoint stores it once)."""
        ...

    def new_prediction_head(self) -> nn.Module:
        """A freshly initialised hidden -> hidden transform of the architecture's own MLM
        head (BERT: dense, GELU, LayerNorm; ModernBERT: the same without biases), which
        the MLM head puts before the projection tied to :meth:`get_input_embeddings`."""
        ...


@dataclass(frozen=True)
class ArchitectureSpec:
    """What a plugin registers to make an encoder architecture selectable by name
    (``model.architecture=<name>``).

    ``config`` is a dataclass of the architecture's sizes (fields named as in its Hugging
    Face config, :class:`EncoderConfigLike`); ``model(config)`` builds the initialised
    encoder (an :class:`Encoder`). ``presets`` maps each ``model.preset`` name to the
    config fields it sets; a ``model.hidden_size`` set alone gets an intermediate size of
    ``intermediate_ratio`` times it. ``dropouts`` maps ``model.hidden_dropout_prob`` and
    ``model.attention_probs_dropout_prob`` to the config fields that take them.
    ``document_attention`` is ``data.document_attention``'s default under it; ``pooled``
    says in words what its ``pooler_output`` is (NSP and SOP read it)."""

    name: str
    config: type
    model: Callable[[Any], nn.Module]
    presets: Mapping[str, Mapping[str, Any]]
    intermediate_ratio: float
    dropouts: Mapping[str, tuple[str, ...]]
    document_attention: bool = False
    pooled: str = ""
    description: str = ""


SCHEDULE_KEYS = frozenset({"weight", "schedule", "start_weight", "schedule_steps", "schedules"})
"""The keys the core reads from every ``objectives.<name>`` next to the objective's
own (its weight and weight schedule); an objective's options cannot use them."""


@dataclass(frozen=True)
class Vocab:
    """What an objective needs to know about the tokenizer."""

    size: int
    pad_id: int
    unk_id: int
    cls_id: int
    sep_id: int
    mask_id: int
    special_ids: tuple[int, ...]

    def ordinary_ids(self) -> torch.Tensor:
        """Ids of every non-special token (random replacements are drawn from these)."""
        keep = torch.ones(self.size, dtype=torch.bool)
        keep[list(self.special_ids)] = False
        return keep.nonzero().squeeze(1)


@dataclass(frozen=True)
class BuildContext:
    """What an objective may read when the core builds it for a run."""

    encoder_config: EncoderConfigLike
    vocab: Vocab
    max_seq_length: int
    has_word_boundaries: bool  # False when the tokenizer has no pre-tokenizer (no word ids)
    objectives: tuple[str, ...] = ()  # names of every objective selected in the mix


class Documents(Protocol):
    """Tokenized documents, each a list of sentences (see pretextual.core.data)."""

    def __len__(self) -> int: ...

    def num_sentences(self, doc: int) -> int:
        """How many sentences document ``doc`` holds."""
        ...

    def sentence(self, doc: int, index: int) -> tuple[np.ndarray, np.ndarray]:
        """(token ids, word-start flags) of one sentence."""
        ...


ExampleBuilder = Callable[[Documents, np.random.Generator], list[Example]]
"""Turns documents into examples; called once per epoch with that epoch's generator."""

BatchTransform = Callable[[Batch, torch.Generator], Batch]
"""Corrupts a padded batch (e.g. masking) and adds its labels; must draw all
randomness from the generator it is given, so batches are reproducible, and return
the batch with input_ids, attention_mask and token_type_ids still integer tensors of
the shape it was given."""

PARTS = ("example_builder", "batch_transform")
"""The parts of an :class:`Objective` at most one objective of a mix may provide."""

HeadFactory = Callable[[Encoder], nn.Module]
"""Builds a head given the encoder (so a head may tie weights to it)."""


@dataclass
class StepInputs:
    """What an objective's loss function receives for one batch."""

    batch: Batch
    encoder_output: EncoderOutputLike
    heads: Mapping[str, nn.Module]
    encoder: Encoder  # for objectives that run another forward pass (e.g. ELECTRA)


@dataclass
class ObjectiveOutput:
    """An objective's result for one batch.

    ``loss`` is the term the trainer multiplies by ``objectives.<name>.weight``;
    ``aux_losses`` are added with weight 1 (e.g. a generator's own loss) and
    logged as ``loss/<name>.<key>``; ``metrics`` are logged as ``<name>/<key>``.
    """

    loss: torch.Tensor
    metrics: dict[str, torch.Tensor | float] = field(default_factory=dict)
    aux_losses: dict[str, torch.Tensor] = field(default_factory=dict)


@dataclass
class Objective:
    """A built objective: what it contributes to a run."""

    loss: Callable[[StepInputs], ObjectiveOutput]
    heads: dict[str, HeadFactory] = field(default_factory=dict)
    example_builder: ExampleBuilder | None = None
    batch_transform: BatchTransform | None = None


@dataclass(frozen=True)
class ObjectiveSpec:
    """What a plugin registers: a name, the dataclass of its options, and a factory.

    ``options`` is a dataclass whose fields (with defaults and docstrings) are
    the config keys ``objectives.<name>.<field>``; the core adds ``weight`` and
    the weight-schedule keys itself. ``build(options, context)`` returns the
    :class:`Objective`; it may raise ``pretextual.ConfigError`` for a bad option.

    The options dataclass may also define ``check(self, name)``, raising
    ``ConfigError`` for values no run could use. The core calls it when it checks
    the config (``pretextual config``, and a run before it reads the corpus), so a
    check that needs no tokenizer belongs there, not in ``build``, which runs only
    once the corpus is tokenized.

    ``provides`` names the exclusive parts (:data:`PARTS`) the built objective
    fills, or is a function of the options returning them (an objective whose
    masking is optional), so a conflicting mix is refused from the config alone.
    ``build`` must return exactly the parts declared.
    """

    name: str
    build: Callable[[Any, BuildContext], Objective]
    options: type | None = None
    description: str = ""
    provides: Collection[str] | Callable[[Any], Collection[str]] = ()


@dataclass
class ExportedModel:
    """A trained model as an exporter receives it (and as pretextual loads an export back).

    ``encoder`` is the encoder (a BertModel, a ModernBertModel...) in eval mode, on the CPU, in float32. ``heads``
    holds each pretraining head's tensors by head name, keyed as in the head's
    own state dict (``heads["mlm"]["transform.dense.weight"]``); weights tied to
    the encoder (the MLM decoder) are not repeated. ``tokenizer`` is a
    ``tokenizers.Tokenizer`` that adds [CLS]/[SEP] as the model was trained.
    ``metadata`` is str -> str: ``pretextual_version``, ``trained_with``,
    ``objectives`` and ``heads`` (comma-separated), ``step``.
    ``max_seq_length`` is the longest input the model was trained on (the run's
    ``data.max_seq_length``); the position table may be longer.
    """

    encoder: Encoder
    heads: dict[str, dict[str, torch.Tensor]]
    tokenizer: Any
    metadata: dict[str, str]
    max_seq_length: int

    @property
    def config(self) -> EncoderConfigLike:
        """The encoder's sizes (``encoder.config``), from which config.json is written."""
        return self.encoder.config


@dataclass(frozen=True)
class ExportOptions:
    """The choices of one export, shared by every format selected."""

    with_heads: bool = False
    """Write the pretraining heads (formats registered with ``heads=True``; the default
    export asks for them, ``--encoder-only`` does not)."""
    quantize: str | None = None
    """A quantization scheme such as ``"int8"`` (only formats that list it in ``quantize``)."""


@dataclass
class ExportSummary:
    """What an exporter reports: the files it wrote (relative to the export
    directory), its numbers (kept in export.json) and lines for the user."""

    files: list[str]
    metrics: dict[str, float | int | str] = field(default_factory=dict)
    lines: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class ExporterSpec:
    """What a plugin registers to write a trained model in some format.

    ``export(model, out_dir, options)`` writes the format's files into
    ``out_dir`` and returns an :class:`ExportSummary`. It must check its own
    output (reload it, compare with ``model.encoder``) and raise
    ``pretextual.PretextualError`` with the numbers when the check fails. The
    core has already written config.json and the tokenizer files there, and
    writes everything into a temporary directory it renames when every format
    has succeeded, so an exporter never needs to clean up after a failure.

    ``heads`` says the format can write the pretraining heads (the default; not under ``--encoder-only``);
    ``quantize`` lists the schemes it accepts in ``options.quantize``. The core
    refuses an option that no selected format supports.
    """

    name: str
    export: Callable[[ExportedModel, Path, ExportOptions], ExportSummary]
    description: str = ""
    heads: bool = False
    quantize: tuple[str, ...] = ()


@dataclass
class TaskData:
    """Labelled examples of a downstream task, one list entry per example.

    ``label`` holds class names or integer ids (a classification task) or floats (a
    regression task, scored by Pearson and Spearman correlation). ``text_pair`` makes
    it a sentence-pair task. ``group`` keeps examples together in cross-validation:
    examples of one group (an author, a thread, a source document) never straddle a
    train and a test fold.
    """

    text: list[str]
    label: list[Any]
    text_pair: list[str] | None = None
    group: list[Any] | None = None


@dataclass(frozen=True)
class TaskSpec:
    """What a plugin registers to make a downstream task available by name
    (``pretextual evaluate MODEL --task <name>``, ``trainer.eval_tasks=[<name>]``).

    ``load()`` returns the task's :class:`TaskData`; ``load_eval()``, when given, its
    separate evaluation split (else the evaluation cross-validates ``load()``'s data).
    Either may raise ``pretextual.PretextualError`` with one line saying what is
    missing (a data set that is not installed, say).
    """

    name: str
    load: Callable[[], TaskData]
    description: str = ""
    load_eval: Callable[[], TaskData] | None = None


@dataclass(frozen=True)
class LoggerSpec:
    """What a plugin registers to make a logger selectable by name
    (``trainer.loggers=[<name>]``): a place a run's metrics go next to metrics.jsonl.

    The logging itself is the plugin's training hooks, which act only when
    ``name in trainer.cfg.trainer.loggers``. ``requires`` names the modules the logger
    imports: a run that selects it while one is missing stops before it reads the corpus,
    with one line saying ``install`` (``pip install 'my-package[extra]'``), unless
    ``warn_if_missing``, for a logger on by default: the run then goes on without it, and
    the plugin says so itself at the start of training.
    """

    name: str
    requires: tuple[str, ...] = ()
    install: str = ""
    description: str = ""
    warn_if_missing: bool = False


@dataclass(frozen=True)
class OptimizerSpec:
    """What a plugin registers to make an optimizer selectable by name
    (``trainer.optimizer=<name>``): ``build(param_groups, trainer)`` returns a
    ``torch.optim.Optimizer`` over the parameter groups (each with its weight decay set:
    none on biases and LayerNorm weights), reading ``trainer.lr`` and any other key of the
    trainer config it needs. Its state must be a tensor state dict, as torch's are: a
    checkpoint saves and restores it."""

    name: str
    build: Callable[[list, Any], Any]
    description: str = ""


@dataclass(frozen=True)
class LRScheduleSpec:
    """What a plugin registers to make a learning-rate schedule selectable by name
    (``trainer.lr_schedule=<name>``): ``build(settings)`` returns the factor of
    ``trainer.lr`` at each optimizer step, a pure function of the step (so a resumed run
    continues it exactly). ``settings`` has warmup_steps, max_steps, min_lr_ratio,
    decay_steps, decay_fraction and decay_shape, from the trainer config."""

    name: str
    build: Callable[[Any], Callable[[int], float]]
    description: str = ""


__all__ = ["ArchitectureSpec", "PARTS", "SCHEDULE_KEYS", "Batch", "BatchTransform", "BuildContext", "Documents",
           "Encoder", "EncoderConfigLike", "EncoderOutputLike", "Example", "ExampleBuilder",
           "ExportedModel", "ExporterSpec", "ExportOptions", "ExportSummary", "HeadFactory",
           "LoggerSpec", "LRScheduleSpec", "Objective", "ObjectiveOutput", "ObjectiveSpec",
           "OptimizerSpec", "StepInputs", "TaskData", "TaskSpec", "Vocab"]
