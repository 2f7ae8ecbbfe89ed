"""model.init_from: a run that starts from trained weights (a pretextual run, an export, or
a directory transformers saved), with a fresh optimizer and step, as domain adaptation
does. The sizes come from the checkpoint, its tokenizer becomes the run's unless
data.tokenizer is set, and each of the run's heads that the checkpoint has is loaded.
Reading the directory is the exporters' (pretextual.run.trainer_for loads it); this
module uses what was read."""

from __future__ import annotations

import dataclasses

import torch
from omegaconf import DictConfig
from tokenizers import Tokenizer

from pretextual.architectures import architecture
from pretextual.core.config_checks import MODEL_SIZES
from pretextual.errors import ConfigError
from pretextual.plugins.api import ExportedModel

DEFAULT_POSITIONS = 512
"""model.max_position_embeddings's default: a value other than it is the user's own."""
DEFAULT_ARCHITECTURE = "bert"
"""model.architecture's default: a value other than it is the user's own."""


def start_tokenizer(start: ExportedModel) -> Tokenizer:
    """The checkpoint's tokenizer as a run tokenizes with it (no padding, no truncation)."""
    tokenizer = Tokenizer.from_str(start.tokenizer.to_str())
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return tokenizer


def start_config(cfg: DictConfig, start: ExportedModel, vocab_size: int, plugins=None):
    """The encoder config of the run: the checkpoint's architecture and sizes with the
    config's dropouts (those it sets). A model.architecture or model.* size the config sets
    to another value than the checkpoint's, or a data.tokenizer of another vocabulary size,
    is a ConfigError."""
    theirs = start.encoder.config
    m = cfg.model
    if m.architecture not in (DEFAULT_ARCHITECTURE, theirs.architecture):
        raise ConfigError(f"model.architecture={m.architecture}: model.init_from={m.init_from} "
                          f"is a {theirs.architecture} encoder; leave model.architecture unset")
    if vocab_size != theirs.vocab_size:
        raise ConfigError(f"data.tokenizer={cfg.data.tokenizer}: has {vocab_size} tokens, but "
                          f"the encoder of model.init_from={m.init_from} has {theirs.vocab_size}")
    for key in (*MODEL_SIZES, "max_position_embeddings"):
        ours = m[key]
        if key == "max_position_embeddings" and ours == DEFAULT_POSITIONS:
            continue
        if ours is not None and ours != getattr(theirs, key):
            raise ConfigError(f"model.{key}={ours}: model.init_from={m.init_from} has "
                              f"{key}={getattr(theirs, key)}; its sizes are the run's, so leave "
                              f"model.{key} unset")
    if cfg.data.max_seq_length > theirs.max_position_embeddings:
        raise ConfigError(f"data.max_seq_length ({cfg.data.max_seq_length}) exceeds the "
                          f"max_position_embeddings ({theirs.max_position_embeddings}) of "
                          f"model.init_from={m.init_from}")
    spec = architecture(theirs.architecture, plugins)
    dropouts = {field: m[key] for key, fields in spec.dropouts.items() for field in fields
                if m[key] is not None}
    return dataclasses.replace(theirs, **dropouts)


@torch.no_grad()
def load_weights(model, start: ExportedModel, source: str, log) -> None:
    """Copy the checkpoint's encoder into ``model.bert`` and each head it has, by name and
    with every tensor's shape, into ``model.heads``; one line says which heads load and
    which start fresh."""
    model.bert.load_state_dict(start.encoder.state_dict())
    loaded, fresh = [], []
    for name, head in model.heads.items():
        tensors = start.heads.get(name, {})
        own = head.state_dict()
        if tensors and set(tensors) == set(own) and all(tensors[k].shape == own[k].shape
                                                          for k in own):
            head.load_state_dict(tensors)
            loaded.append(name)
        else:
            fresh.append(name)
    said = f"init_from {source}: encoder"
    said += f" and head{'s' if len(loaded) > 1 else ''} {', '.join(loaded)} loaded" if loaded \
        else " loaded"
    if fresh:
        said += f"; head{'s' if len(fresh) > 1 else ''} {', '.join(fresh)} start fresh (not in it)"
    log(said + "; the optimizer and the step start fresh")
