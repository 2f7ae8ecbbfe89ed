"""Checkpoints without pickle: tensors in safetensors, everything else in JSON.

A checkpoint is a directory ``checkpoints/step-NNNNNNN/`` holding
``model.safetensors`` (the PretrainingModel state: ``bert.*`` and
``heads.<name>.*``), ``optimizer.safetensors`` (AdamW moments and RNG states)
and ``trainer.json`` (step, encoder config, objectives, scheduler, param
groups, a sha256 of each tensor file, and one of trainer.json's own content). It
is written under a temporary name and renamed, so a crash mid-write never leaves a
corrupt latest checkpoint; a corrupt one (a tensor file or the metadata not matching
its checksum, a step that is not the directory's) is detected and skipped.
"""

from __future__ import annotations

import json
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer

from pretextual.core.files import (TEMPORARY_PREFIX, atomic_directory, sha256,
                                   write_error_reason)
from pretextual.core.tokenizer import tokenizer_sha256
from pretextual.errors import CheckpointError

FORMAT_VERSION = 3
META_CHECKSUM = "meta_sha256"
"""trainer.json's key for the sha256 of the rest of its content (format 3 on)."""
MODEL_FILE, OPTIMIZER_FILE, STATE_FILE = "model.safetensors", "optimizer.safetensors", "trainer.json"


def _flatten_optimizer(state_dict: dict) -> tuple[dict[str, torch.Tensor], list]:
    # Keyed by parameter name (torch.distributed.checkpoint's full state dict), so a
    # checkpoint is the same for one process, DDP or FSDP, whatever the world size.
    tensors = {}
    for param, per_param in state_dict["state"].items():
        for key, value in per_param.items():
            tensors[f"state.{param}.{key}"] = torch.as_tensor(value)
    return tensors, state_dict["param_groups"]


def _unflatten_optimizer(tensors: dict[str, torch.Tensor], param_groups: list) -> dict:
    state: dict[str, dict] = {}
    for name, value in tensors.items():
        if name.startswith("state."):
            param, key = name[len("state."):].rsplit(".", 1)
            state.setdefault(param, {})[key] = value
    return {"state": state, "param_groups": param_groups}


def check_tokenizer(checkpoint: Path, meta: dict, tokenizer: Tokenizer, file: Path) -> None:
    """CheckpointError naming ``file`` unless ``tokenizer`` (read from it) is the one the
    checkpoint's trainer.json recorded; a checkpoint written without the record passes."""
    recorded = meta.get("tokenizer_sha256")
    if recorded is not None and recorded != tokenizer_sha256(tokenizer):
        raise CheckpointError(f"{file}: is not the tokenizer {checkpoint} was trained with (its "
                              f"sha256 differs from {STATE_FILE}'s); it belongs to another run")


@dataclass
class Checkpoint:
    """A verified checkpoint on disk."""

    path: Path
    meta: dict

    @property
    def step(self) -> int:
        return int(self.meta["step"])

    def model_state(self) -> dict[str, torch.Tensor]:
        """The model's tensors by state-dict key, a tied one under each of its keys."""
        return with_tied(read_tensors(self.path / MODEL_FILE), self.meta)

    def optimizer_tensors(self) -> dict[str, torch.Tensor]:
        return read_tensors(self.path / OPTIMIZER_FILE)

    def optimizer_state(self) -> dict:
        return _unflatten_optimizer(self.optimizer_tensors(), self.meta["param_groups"])


def read_tensors(file: Path) -> dict[str, torch.Tensor]:
    """A safetensors file's tensors; CheckpointError names the file when it cannot be read."""
    try:
        return load_file(str(file))
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"{file}: not a readable safetensors file ({exc})") from None


def meta_checksum(meta: dict) -> str:
    """The sha256 of trainer.json's content without its own checksum, in a canonical form
    (it detects damage and edits by hand; like every checksum here, not a signature)."""
    rest = {k: v for k, v in meta.items() if k != META_CHECKSUM}
    return sha256(json.dumps(rest, sort_keys=True, separators=(",", ":")).encode())


def tied_keys(model: torch.nn.Module) -> dict[str, str]:
    """State-dict keys of parameters that are another key's parameter (a head tied to
    the word embeddings the usual PyTorch way), each mapped to the first key holding it.
    Read from the module, not from tensors: a state dict gathered to the CPU (a GPU or
    FSDP run) holds a separate copy under each key."""
    first: dict[int, str] = {}
    tied: dict[str, str] = {}
    for key, parameter in model.named_parameters(remove_duplicate=False):
        tied_to = first.setdefault(id(parameter), key)
        if tied_to != key:
            tied[key] = tied_to
    return tied


def with_tied(tensors: dict[str, torch.Tensor], meta: dict) -> dict[str, torch.Tensor]:
    """The tensors of a model file with the tied keys it left out (:func:`tied_keys`) put back."""
    tied = meta.get("tied", {})
    missing = sorted(set(tied.values()) - set(tensors))
    if missing:
        raise CheckpointError(f"{STATE_FILE}: ties tensors to {missing[0]!r}, which {MODEL_FILE} "
                              f"does not hold")
    # copies: two keys must never share memory, or saving them again (an export) fails
    return {**tensors, **{key: tensors[kept].clone() for key, kept in tied.items()}}


def save_checkpoint(directory: Path, step: int, model_state: dict[str, torch.Tensor],
                    optimizer_state: dict, meta: dict, rng: dict[str, torch.Tensor], keep: int,
                    tied: dict[str, str] | None = None) -> Path:
    """Write ``directory/step-NNNNNNN`` atomically and keep only the newest ``keep``.

    ``optimizer_state`` is a full optimizer state dict keyed by parameter name; ``tied``
    (:func:`tied_keys`) names the keys stored once, under the key they are tied to."""
    tied = tied or {}
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / f"step-{step:07d}"
    try:
        with atomic_directory(final) as tmp:
            save_file({k: v.detach().contiguous().cpu() for k, v in model_state.items()
                       if k not in tied}, str(tmp / MODEL_FILE))
            tensors, groups = _flatten_optimizer(optimizer_state)
            tensors.update({f"rng.{k}": v for k, v in rng.items()})
            save_file({k: v.contiguous().cpu() for k, v in tensors.items()}, str(tmp / OPTIMIZER_FILE))
            meta = {**meta, "format": FORMAT_VERSION, "step": step, "param_groups": groups,
                    "tied": tied, "sha256": {f: sha256(tmp / f) for f in (MODEL_FILE, OPTIMIZER_FILE)}}
            meta[META_CHECKSUM] = meta_checksum(meta)
            (tmp / STATE_FILE).write_text(json.dumps(meta, indent=1))
    except (OSError, SafetensorError) as exc:  # a full disk or a quota: earlier checkpoints are untouched
        raise CheckpointError(f"{final}: cannot write the checkpoint ({write_error_reason(exc)}); "
                              f"the earlier checkpoints in {directory} are kept") from None
    for old in list_checkpoints(directory)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def list_checkpoints(directory: Path) -> list[Path]:
    """Checkpoint directories, oldest first (temporary ones excluded)."""
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.iterdir() if p.is_dir() and p.name.startswith("step-"))


def remove_partial_checkpoints(directory: Path) -> None:
    """Delete temporary directories left by a process killed while writing a checkpoint."""
    if directory.is_dir():
        for p in directory.glob(f"{TEMPORARY_PREFIX}step-*"):
            shutil.rmtree(p, ignore_errors=True)


def open_checkpoint(path: Path) -> Checkpoint:
    """Open and verify one checkpoint; CheckpointError names the file that is wrong."""
    path = Path(path)
    state_file = path / STATE_FILE
    if not state_file.is_file():
        raise CheckpointError(f"{path}: not a checkpoint (no {STATE_FILE})")
    try:
        meta = json.loads(state_file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{state_file}: corrupt ({exc})") from None
    if not isinstance(meta, dict):
        raise CheckpointError(f"{state_file}: corrupt (not a JSON object)")
    if meta.get("format", 0) >= 3 and meta.get(META_CHECKSUM) != meta_checksum(meta):
        raise CheckpointError(f"{state_file}: corrupt (its content does not match its "
                              f"{META_CHECKSUM}: edited or damaged)")
    digits = path.name.removeprefix("step-")
    if digits != path.name and digits.isdigit() and meta.get("step") != int(digits):
        raise CheckpointError(f"{state_file}: corrupt (step {meta.get('step')!r} in a checkpoint "
                              f"named {path.name})")
    for name, expected in meta.get("sha256", {}).items():
        file = path / name
        if not file.is_file():
            raise CheckpointError(f"{file}: missing")
        if sha256(file) != expected:
            raise CheckpointError(f"{file}: corrupt (sha256 does not match {STATE_FILE})")
    try:
        with open(path / MODEL_FILE, "rb") as f:  # the header parses: the file is safetensors
            header_len = int.from_bytes(f.read(8), "little")
            json.loads(f.read(header_len))
    except (OSError, ValueError, SafetensorError) as exc:
        raise CheckpointError(f"{path / MODEL_FILE}: not a safetensors file ({exc})") from None
    return Checkpoint(path, meta)


def latest_checkpoint(directory: Path) -> Checkpoint | None:
    """The newest checkpoint that verifies, warning about (and skipping) corrupt ones."""
    for path in reversed(list_checkpoints(directory)):
        try:
            return open_checkpoint(path)
        except CheckpointError as exc:
            print(f"pretextual: warning: skipping checkpoint: {exc}", file=sys.stderr)
    return None
