"""The encoders an evaluation compares: loaded from a run, an export or a transformers
directory, or built untrained with the initialisation their run started from."""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from tokenizers import Tokenizer

from pretextual.architectures import build_encoder
from pretextual.core.tokenizer import tokenizer_sha256, vocab_of
from pretextual.errors import EvaluationError
from pretextual.exporters.hf import with_post_processor
from pretextual.exporters.load import load_pretrained

UNKNOWN_SEED = 0
"""The initialisation seed assumed for an export or a transformers directory, which do
not record the seed of their run."""


@dataclass
class Encoder:
    """One model to evaluate: an encoder of any architecture (eval mode, CPU, float32), the tokenizer that
    frames its inputs as in training ([CLS] A [SEP] B [SEP]), the longest input it was
    trained on, and the seed its run initialised it with."""

    name: str
    model: nn.Module
    tokenizer: Tokenizer
    max_length: int
    init_seed: int

    def key(self) -> tuple:
        """What makes two encoders' untrained twins the same model."""
        config = self.model.config
        return (config.architecture, tuple(sorted(config.to_dict().items())), self.init_seed,
                tokenizer_sha256(self.tokenizer), self.max_length)


def load_encoder(path: str) -> Encoder:
    """The encoder of a run directory (its newest checkpoint), a checkpoint, a
    ``pretextual export`` directory or a directory saved by transformers
    (``save_pretrained`` of BertModel / BertForMaskedLM / BertForPreTraining and its
    tokenizer). One CheckpointError line names what is missing or of another kind."""
    loaded, config = load_pretrained(path)
    try:
        seed = int(config["trainer"]["seed"]) if config is not None else UNKNOWN_SEED
    except (KeyError, TypeError, ValueError):
        seed = UNKNOWN_SEED
    tokenizer = with_post_processor(loaded.tokenizer)
    tokenizer.no_padding()  # a transformers tokenizer.json may carry its own
    tokenizer.no_truncation()
    return Encoder(name=path, model=loaded.encoder, tokenizer=tokenizer,
                   max_length=loaded.max_seq_length, init_seed=seed)


def untrained_twin(encoder: Encoder) -> Encoder:
    """The same architecture, tokenizer and length, with the weights its run started
    from: the encoder initialised right after ``torch.manual_seed(init_seed)``, as the
    trainer builds it (the global RNG is left as it was)."""
    return Encoder(name=f"untrained (seed {encoder.init_seed})",
                   model=initial_encoder(encoder.model.config, encoder.init_seed),
                   tokenizer=encoder.tokenizer, max_length=encoder.max_length,
                   init_seed=encoder.init_seed)


def initial_encoder(config, seed: int, plugins=None) -> nn.Module:
    """The encoder a run with ``trainer.seed=seed`` starts from (eval mode, frozen), of the
    architecture ``plugins`` (default: the built-in and installed ones) registered."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = build_encoder(copy.deepcopy(config), plugins)
    return model.eval().requires_grad_(False)


@dataclass
class Tokenized:
    """A task's texts as one encoder reads them: token ids and segment ids per example."""

    ids: list[np.ndarray]
    type_ids: list[np.ndarray]
    pad_id: int

    def batch(self, rows: np.ndarray, device: torch.device) -> dict[str, torch.Tensor]:
        """Padded input_ids, attention_mask and token_type_ids of ``rows``."""
        length = max(len(self.ids[r]) for r in rows)
        ids = np.full((len(rows), length), self.pad_id, dtype=np.int64)
        types = np.zeros((len(rows), length), dtype=np.int64)
        mask = np.zeros((len(rows), length), dtype=np.int64)
        for i, r in enumerate(rows):
            n = len(self.ids[r])
            ids[i, :n], types[i, :n], mask[i, :n] = self.ids[r], self.type_ids[r], 1
        return {"input_ids": torch.from_numpy(ids).to(device),
                "attention_mask": torch.from_numpy(mask).to(device),
                "token_type_ids": torch.from_numpy(types).to(device)}


def tokenize(tokenizer: Tokenizer, text: list[str], text_pair: list[str] | None,
             max_length: int, vocab_size: int, source: str) -> Tokenized:
    """Each example framed by ``tokenizer`` (as in training) and cut to ``max_length``
    tokens (the longer text of a pair first); ids must fit the encoder of ``source``."""
    tokenizer = Tokenizer.from_str(tokenizer.to_str())
    tokenizer.enable_truncation(max_length=max_length, strategy="longest_first")
    inputs = list(zip(text, text_pair)) if text_pair is not None else text
    encodings = tokenizer.encode_batch(inputs)
    ids = [np.asarray(e.ids, dtype=np.int64) for e in encodings]
    if any(len(i) and int(i.max()) >= vocab_size for i in ids):
        raise EvaluationError(f"{source}: its tokenizer gives ids beyond the encoder's "
                              f"vocabulary of {vocab_size}")
    return Tokenized(ids=ids, type_ids=[np.asarray(e.type_ids, dtype=np.int64) for e in encodings],
                     pad_id=vocab_of(tokenizer).pad_id)


def length_batches(tokenized: Tokenized, rows: np.ndarray, batch_size: int) -> list[np.ndarray]:
    """``rows`` in batches of similar length (little padding), in a fixed order."""
    order = rows[np.argsort([len(tokenized.ids[r]) for r in rows], kind="stable")]
    return [order[i:i + batch_size] for i in range(0, len(order), batch_size)]


@torch.no_grad()
def features(model: nn.Module, tokenized: Tokenized, device: torch.device,
             batch_size: int = 64) -> np.ndarray:
    """[n, 2 * hidden] frozen features of every example: the [CLS] hidden state and the
    mean of the hidden states over its tokens (float64, on the host)."""
    was_training = model.training
    model.eval()
    n = len(tokenized.ids)
    out = np.zeros((n, 2 * model.config.hidden_size), dtype=np.float64)
    try:
        for rows in length_batches(tokenized, np.arange(n), batch_size):
            batch = tokenized.batch(rows, device)
            hidden = model(**batch).last_hidden_state.float()
            mask = batch["attention_mask"].unsqueeze(-1).float()
            mean = (hidden * mask).sum(1) / mask.sum(1)
            out[rows] = torch.cat([hidden[:, 0], mean], dim=1).double().cpu().numpy()
    finally:
        model.train(was_training)
    return out
