"""What is exported: a verified checkpoint (or a run directory's newest), loaded as an ExportedModel."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn
from tokenizers import Tokenizer

import pretextual
from pretextual.core.checkpoint import (MODEL_FILE, STATE_FILE, Checkpoint, check_tokenizer,
                                        list_checkpoints, open_checkpoint)
from pretextual.architectures import build_encoder as new_encoder
from pretextual.architectures import config_from_dict
from pretextual.core.tokenizer import TOKENIZER_FILE, read_tokenizer, vocab_of
from pretextual.errors import CheckpointError, PluginError
from pretextual.exporters.hf import with_post_processor
from pretextual.plugins.api import ExportedModel


def find_checkpoint(path: str | Path) -> Checkpoint:
    """The checkpoint ``path`` names: a checkpoint directory, or a run directory's
    newest checkpoint. A corrupt one is an error, never skipped for an older one:
    an export must be of the model the user means."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path}: no such run directory or checkpoint")
    if (path / STATE_FILE).is_file():
        return open_checkpoint(path)
    if (path / "checkpoints").is_dir():
        found = list_checkpoints(path / "checkpoints")
        if not found:
            raise CheckpointError(f"{path / 'checkpoints'}: holds no checkpoint")
        return open_checkpoint(found[-1])
    raise CheckpointError(f"{path}: not a run directory or checkpoint (no {STATE_FILE}, "
                          f"no checkpoints/)")


def build_encoder(config, state: dict[str, torch.Tensor], file: Path,
                  fresh_pooler: bool = False) -> nn.Module:
    """An encoder of ``config``'s architecture in eval mode holding ``state``;
    CheckpointError names the file and the first tensor that is missing, unexpected or of
    the wrong shape. ``fresh_pooler`` keeps the pooler's initialisation, for a BERT state
    that has none."""
    encoder = new_encoder(config)
    if fresh_pooler:
        state = {**{k: v for k, v in encoder.state_dict().items() if k.startswith("pooler.")}, **state}
    try:
        encoder.load_state_dict({k: v.float() for k, v in state.items()}, strict=True)
    except RuntimeError as exc:
        details = [line.strip() for line in str(exc).splitlines()[1:] if line.strip()]
        raise CheckpointError(f"{file}: does not fit the encoder of its config "
                              f"({details[0] if details else exc})") from None
    return encoder.eval().requires_grad_(False)


def load_checkpoint_model(ckpt: Checkpoint) -> ExportedModel:
    """The checkpoint's encoder, heads, the run's tokenizer and the export metadata."""
    model_file = ckpt.path / MODEL_FILE
    try:  # a checkpoint from before the architecture was recorded is BERT's
        config = config_from_dict(ckpt.meta.get("architecture", "bert"), ckpt.meta["encoder_config"])
    except (KeyError, TypeError, PluginError) as exc:
        raise CheckpointError(f"{ckpt.path / STATE_FILE}: no valid encoder_config ({exc})") from None
    tensors = ckpt.model_state()
    encoder_state = {k[len("bert."):]: v for k, v in tensors.items() if k.startswith("bert.")}
    heads: dict[str, dict[str, torch.Tensor]] = {}
    for key, value in tensors.items():
        if key.startswith("heads."):
            name, _, rest = key[len("heads."):].partition(".")
            heads.setdefault(name, {})[rest] = value.float().contiguous()
        elif not key.startswith("bert."):
            raise CheckpointError(f"{model_file}: unexpected tensor {key!r} (neither bert.* nor heads.*)")
    missing = sorted(set(ckpt.meta.get("heads", [])) - set(heads))
    if missing:
        raise CheckpointError(f"{model_file}: has no tensors for head(s) {', '.join(missing)} "
                              f"listed in {STATE_FILE}")
    encoder = build_encoder(config, encoder_state, model_file)
    tokenizer = _run_tokenizer(ckpt, config)
    metadata = {"pretextual_version": pretextual.__version__,
                "trained_with": str(ckpt.meta.get("pretextual_version", "")),
                "objectives": ",".join(ckpt.meta.get("objectives", [])),
                "heads": ",".join(sorted(heads)), "step": str(ckpt.step)}
    return ExportedModel(encoder=encoder, heads=heads, tokenizer=tokenizer, metadata=metadata,
                         max_seq_length=_trained_length(ckpt))


def _trained_length(ckpt: Checkpoint) -> int:
    """The run's data.max_seq_length, from the config the checkpoint was written with."""
    try:
        return int(ckpt.meta["config"]["data"]["max_seq_length"])
    except (KeyError, TypeError, ValueError):
        raise CheckpointError(f"{ckpt.path / STATE_FILE}: corrupt (no config.data.max_seq_length, "
                              f"the sequence length the model was trained on)") from None


def _run_tokenizer(ckpt: Checkpoint, config) -> Tokenizer:
    # A checkpoint copied on its own may carry the tokenizer; otherwise it is the run's.
    candidates = [ckpt.path / TOKENIZER_FILE, ckpt.path.parent.parent / TOKENIZER_FILE]
    file = next((f for f in candidates if f.is_file()), None)
    if file is None:
        raise CheckpointError(f"{candidates[-1]}: missing (the run's tokenizer is exported "
                              f"with the model)")
    tokenizer = read_tokenizer(file)
    vocab_of(tokenizer, str(file))  # DataError naming the file when a special token is missing
    if tokenizer.get_vocab_size() != config.vocab_size:
        raise CheckpointError(f"{file}: has {tokenizer.get_vocab_size()} tokens but the checkpoint's "
                              f"encoder has {config.vocab_size}; it belongs to another run")
    check_tokenizer(ckpt.path, ckpt.meta, tokenizer, file)
    return with_post_processor(tokenizer)
