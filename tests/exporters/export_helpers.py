"""Helpers of the exporter tests: tiny runs, checkpoint surgery, and pretextual's own model
loaded straight from the checkpoint (without the exporter's code) as the reference."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file
from tokenizers import Tokenizer

from pretextual.core.checkpoint import META_CHECKSUM, meta_checksum
from pretextual.core.config import load_config
from pretextual.architectures import build_encoder, config_from_dict
from pretextual.core.mix import PretrainingModel
from pretextual.core.trainer import Trainer
from pretextual.exporters.hf import with_post_processor
from pretextual.objectives.mlm import MLMHead
from run_helpers import tiny_overrides

STEPS = 3


def train_run(root: Path, corpus: Path, cache: Path, recipe: str) -> Path:
    """A tiny run of ``recipe`` trained STEPS steps; returns its run directory."""
    out = root / "run"
    cfg = load_config(recipe, tiny_overrides(corpus, cache, out, STEPS))
    Trainer(cfg, log=lambda *a: None).train()
    return out


def checkpoint_of(run_dir: Path) -> Path:
    return sorted((run_dir / "checkpoints").iterdir())[-1]


def copy_run(run_dir: Path, to: Path) -> Path:
    """A copy of the run's newest checkpoint and tokenizer; returns the checkpoint directory."""
    ckpt = checkpoint_of(run_dir)
    target = to / "run" / "checkpoints" / ckpt.name
    shutil.copytree(ckpt, target)
    shutil.copy(run_dir / "tokenizer.json", to / "run" / "tokenizer.json")
    return target


def reseal(ckpt: Path) -> None:
    """Record the model file's new sha256, so only the exporter's own checks can catch it."""
    state = json.loads((ckpt / "trainer.json").read_text())
    state["sha256"]["model.safetensors"] = hashlib.sha256((ckpt / "model.safetensors").read_bytes()).hexdigest()
    state[META_CHECKSUM] = meta_checksum(state)
    (ckpt / "trainer.json").write_text(json.dumps(state))


def reference_model(run_dir: Path) -> PretrainingModel:
    """pretextual's PretrainingModel with the checkpoint's weights, read without the exporter code."""
    ckpt = checkpoint_of(run_dir)
    meta = json.loads((ckpt / "trainer.json").read_text())

    def pair_classifier(encoder):  # what NSP and SOP heads are: a 2-way linear layer
        return torch.nn.Linear(encoder.config.hidden_size, 2)

    factories = {"mlm": MLMHead, "nsp": pair_classifier, "sop": pair_classifier}
    config = config_from_dict(meta.get("architecture", "bert"), meta["encoder_config"])
    model = PretrainingModel(build_encoder(config),
                             {name: factories[name] for name in meta["heads"]})
    model.load_state_dict(load_file(str(ckpt / "model.safetensors")), strict=True)
    return model.eval()


def run_tokenizer(run_dir: Path) -> Tokenizer:
    return Tokenizer.from_file(str(run_dir / "tokenizer.json"))


def padded_batch(tokenizer: Tokenizer, texts: list, pad_id: int) -> dict[str, torch.Tensor]:
    """Texts (or (a, b) pairs) encoded with [CLS]/[SEP] as the exports do, padded to the longest."""
    tok = with_post_processor(tokenizer)
    tok.enable_padding(pad_id=pad_id, pad_token=tok.id_to_token(pad_id))
    encodings = tok.encode_batch(texts)
    return {"input_ids": torch.tensor([e.ids for e in encodings]),
            "attention_mask": torch.tensor([e.attention_mask for e in encodings]),
            "token_type_ids": torch.tensor([e.type_ids for e in encodings])}


TEXTS_A = ["The boat sees the river bank.", "Water moves.", ("The king keeps the tower.", "A guard follows.")]
TEXTS_B = ["Fish.", "The teacher needs a book and the pupil finds the desk by the bell.",
           ("Ship", "Sail anchor dock crane cargo wave tide rope gull."), "Trade coin.",
           "Bird wolf moss trail branch root deer shade tree leaf."]
"""Two batches of other shapes than the exporter's own checks, both with padding."""
