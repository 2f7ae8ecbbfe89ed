"""Loading an export back into pretextual: config.json, safetensors and tokenizer.json, no pickle."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import torch
from safetensors import safe_open

from pretextual.core.checkpoint import STATE_FILE, read_tensors
from pretextual.core.tokenizer import TOKENIZER_FILE, read_tokenizer
from pretextual.errors import CheckpointError
from pretextual.exporters.hf import TOKENIZER_CONFIG_FILE, encoder_config_from_json, layout
from pretextual.exporters.source import build_encoder
from pretextual.plugins.api import ExportedModel

CONFIG_FILE = "config.json"
MODEL_FILE = "model.safetensors"
HEADS_FILE = "pretextual_heads.safetensors"
"""Heads with no Hugging Face counterpart (SOP, third-party), keyed ``<head>.<tensor>``."""


def load_pretrained(path: str | Path) -> tuple[ExportedModel, dict | None]:
    """(model, the training config of its run or None) of a run directory (its newest
    checkpoint), a checkpoint, a ``pretextual export`` directory or a directory saved by
    transformers (``save_pretrained`` of BertModel / BertForMaskedLM / BertForPreTraining,
    ModernBertModel / ModernBertForMaskedLM, and its tokenizer). One CheckpointError line names what is missing or of another kind."""
    from pretextual.exporters.source import find_checkpoint, load_checkpoint_model
    where = Path(path)
    if not where.is_dir():
        raise CheckpointError(f"{path}: no such model directory (a run, a checkpoint, an "
                              f"export or a transformers save_pretrained directory)")
    if (where / "checkpoints").is_dir() or (where / STATE_FILE).is_file():
        ckpt = find_checkpoint(where)
        config = ckpt.meta.get("config")
        return load_checkpoint_model(ckpt), config if isinstance(config, dict) else None
    if (where / CONFIG_FILE).is_file():
        return from_pretrained(where), None
    raise CheckpointError(f"{path}: not a run, checkpoint or model directory (no "
                          f"checkpoints/, {STATE_FILE} or {CONFIG_FILE})")


def from_pretrained(path: str | Path) -> ExportedModel:
    """Load a directory written by ``pretextual export`` (or one saved by transformers'
    BertModel, BertForPreTraining, BertForMaskedLM, ModernBertModel or
    ModernBertForMaskedLM, with config.json, model.safetensors and tokenizer.json; a
    fine-tuned model's task head is refused): the encoder, every
    head's tensors under pretextual's names, the tokenizer and the metadata.
    BertForMaskedLM saves no pooler: it is then newly initialized, as transformers does,
    with a warning. CheckpointError names the file that is missing or wrong."""
    path = Path(path)
    config_file = path / CONFIG_FILE
    if not config_file.is_file():
        raise CheckpointError(f"{config_file}: missing (not an export directory)")
    try:
        config = encoder_config_from_json(json.loads(config_file.read_text()))
    except (ValueError, TypeError, KeyError) as exc:  # JSONDecodeError is a ValueError
        raise CheckpointError(f"{config_file}: not a BERT or ModernBERT config ({exc})") from None
    model_file = path / MODEL_FILE
    if not model_file.is_file():
        raise CheckpointError(f"{model_file}: missing")
    tensors = read_tensors(model_file)
    encoder_state, heads = _split(tensors, model_file, config)
    heads_file = path / HEADS_FILE
    if heads_file.is_file():
        for key, value in read_tensors(heads_file).items():
            name, _, rest = key.partition(".")
            heads.setdefault(name, {})[rest] = value
    fresh_pooler = config.architecture == "bert" and not any(k.startswith("pooler.")
                                                             for k in encoder_state)
    if fresh_pooler:
        warnings.warn(f"{model_file}: has no pooler (saved from BertForMaskedLM?); the pooler is "
                      f"newly initialized, as transformers does", stacklevel=2)
    encoder = build_encoder(config, encoder_state, model_file, fresh_pooler)
    tokenizer_file = path / TOKENIZER_FILE
    tokenizer = read_tokenizer(tokenizer_file)
    with safe_open(str(model_file), "pt") as f:
        metadata = {k: v for k, v in sorted((f.metadata() or {}).items()) if k != "format"}
    metadata["heads"] = ",".join(sorted(heads))  # each file lists only its own
    return ExportedModel(encoder=encoder, heads=heads, tokenizer=tokenizer, metadata=metadata,
                         max_seq_length=_model_max_length(path / TOKENIZER_CONFIG_FILE, config))


def _model_max_length(file: Path, config) -> int:
    """tokenizer_config.json's model_max_length (the trained length in pretextual's
    exports); the position table's size where the file does not say."""
    if not file.is_file():
        return config.max_position_embeddings
    try:
        length = json.loads(file.read_text()).get("model_max_length")
    except ValueError as exc:
        raise CheckpointError(f"{file}: not valid JSON ({exc})") from None
    # transformers writes a huge sentinel (int(1e30)) when no length is known
    if type(length) is not int or not 0 < length <= config.max_position_embeddings:
        return config.max_position_embeddings
    return length


def _split(tensors: dict[str, torch.Tensor], file: Path, config
           ) -> tuple[dict[str, torch.Tensor], dict[str, dict[str, torch.Tensor]]]:
    """Encoder state and heads of a file keyed as the base model (BertModel), or as the
    pretraining class (BertForPreTraining, ModernBertForMaskedLM)."""
    found = layout(config)
    if not any(k.startswith(found.prefix) for k in tensors):
        return tensors, {}
    ours = {hf: (name, key) for name, keys in found.heads.items() for key, (hf, _) in keys.items()}
    encoder, heads = {}, {}
    for key, value in tensors.items():
        if key.startswith(found.prefix):
            encoder[key[len(found.prefix):]] = value
        elif key in found.tied:  # transformers may store them; they are the word embeddings
            continue
        elif key in ours:
            name, own = ours[key]
            heads.setdefault(name, {})[own] = value
        else:
            raise CheckpointError(f"{file}: unexpected tensor {key!r} (pretextual loads an encoder "
                                  f"and its pretraining heads, not a fine-tuned task head)")
    return encoder, heads
