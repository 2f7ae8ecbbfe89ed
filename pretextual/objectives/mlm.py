"""Masked language modelling (BERT, Devlin et al. 2019, section 3.1).

Hides ``mask_prob`` of the ordinary tokens of each sequence; of those,
``mask_ratio`` become [MASK], ``random_ratio`` a random ordinary token and the
rest stay unchanged. The head predicts the original token at the selected
positions only (sparse prediction, as Google's run_pretraining.py does).

The head, the loss and the 80/10/10 replacement are shared with whole-word and
span masking, which differ only in how they choose the positions.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from pretextual.core.encoder import BertModel
from pretextual.errors import ConfigError
from pretextual.plugins.api import (Batch, BuildContext, Objective, ObjectiveOutput, ObjectiveSpec,
                                    StepInputs, Vocab)
from pretextual.plugins.hookspecs import hookimpl

IGNORE_INDEX = -100


@dataclass
class MLMOptions:
    mask_prob: float = 0.15
    """Share of the ordinary (non-special, non-padding) tokens of each sequence to predict."""
    mask_ratio: float = 0.8
    """Share of the selected tokens replaced by [MASK]."""
    random_ratio: float = 0.1
    """Share of the selected tokens replaced by a random ordinary token (the rest stay)."""


def check_masking_options(name: str, options) -> None:
    """Raise ConfigError naming the key for an impossible masking configuration."""
    if not 0.0 < options.mask_prob < 1.0:
        raise ConfigError(f"objectives.{name}.mask_prob must be in (0, 1), got {options.mask_prob}")
    for key in ("mask_ratio", "random_ratio"):
        if not 0.0 <= getattr(options, key) <= 1.0:
            raise ConfigError(f"objectives.{name}.{key} must be in [0, 1], got {getattr(options, key)}")
    if options.mask_ratio + options.random_ratio > 1.0 + 1e-9:
        raise ConfigError(f"objectives.{name}.mask_ratio + objectives.{name}.random_ratio must be "
                          f"<= 1, got {options.mask_ratio} + {options.random_ratio}")


class MLMHeadTransform(nn.Module):
    def __init__(self, hidden_size: int, eps: float):
        super().__init__()
        self.dense = nn.Linear(hidden_size, hidden_size)
        self.LayerNorm = nn.LayerNorm(hidden_size, eps=eps)

    def forward(self, x):
        return self.LayerNorm(F.gelu(self.dense(x)))


class MLMHead(nn.Module):
    """Hugging Face's BertLMPredictionHead: transform, then the vocabulary
    projection tied to the word embeddings, plus a per-token bias."""

    def __init__(self, encoder: BertModel):
        super().__init__()
        config = encoder.config
        self.transform = MLMHeadTransform(config.hidden_size, config.layer_norm_eps)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))
        # Tied to the encoder's word embeddings: kept outside this module's own
        # parameters and state dict, so it is saved and counted once.
        self.__dict__["word_embeddings"] = encoder.embeddings.word_embeddings
        nn.init.normal_(self.transform.dense.weight, std=config.initializer_range)
        nn.init.zeros_(self.transform.dense.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return F.linear(self.transform(hidden), self.word_embeddings.weight, self.bias)


def select_tokens(batch: Batch, mask_prob: float, generator: torch.Generator) -> torch.Tensor:
    """Choose round(mask_prob * n) of the n ordinary tokens of each row (at least one).

    A fixed count per row, as Google's create_pretraining_data.py draws, so no
    row goes without a prediction. Returns a boolean [batch, seq] mask.
    """
    candidates = batch["attention_mask"].bool() & ~batch["special_tokens_mask"].bool()
    scores = torch.rand(candidates.shape, generator=generator)
    scores.masked_fill_(~candidates, 2.0)  # non-candidates sort last
    n = candidates.sum(1, keepdim=True)
    k = torch.clamp(torch.round(n * mask_prob), min=1).minimum(n)
    rank = scores.argsort(dim=1).argsort(dim=1)
    return (rank < k) & candidates


def replace_selected(batch: Batch, selected: torch.Tensor, vocab: Vocab, mask_ratio: float,
                     random_ratio: float, generator: torch.Generator,
                     group: torch.Tensor | None = None) -> Batch:
    """Apply the 80/10/10 rule at the ``selected`` positions and add ``mlm_labels``.

    ``group`` ([batch, seq] ints) makes the decision once per group (a word or
    a span) instead of once per token. Random tokens are drawn from the
    ordinary vocabulary only, never special tokens.
    """
    input_ids = batch["input_ids"]
    draw = torch.rand(input_ids.shape, generator=generator)
    if group is not None:
        draw = draw.gather(1, group)
    to_mask = selected & (draw < mask_ratio)
    to_random = selected & (draw >= mask_ratio) & (draw < mask_ratio + random_ratio)
    ordinary = vocab.ordinary_ids()
    random_ids = ordinary[torch.randint(len(ordinary), input_ids.shape, generator=generator)]
    corrupted = torch.where(to_mask, torch.full_like(input_ids, vocab.mask_id), input_ids)
    corrupted = torch.where(to_random, random_ids, corrupted)
    labels = torch.where(selected, input_ids, torch.full_like(input_ids, IGNORE_INDEX))
    return {**batch, "input_ids": corrupted, "mlm_labels": labels}


def masked_lm_loss(inputs: StepInputs) -> ObjectiveOutput:
    """Cross-entropy of the MLM head, run only at the labelled positions."""
    labels = inputs.batch["mlm_labels"]
    where = labels != IGNORE_INDEX
    hidden = inputs.encoder_output.last_hidden_state[where]  # [n_selected, hidden]
    target = labels[where]
    logits = inputs.heads["mlm"](hidden)
    loss = F.cross_entropy(logits.float(), target)
    accuracy = (logits.argmax(-1) == target).float().mean()
    return ObjectiveOutput(loss=loss, metrics={"accuracy": accuracy})


def build(options: MLMOptions, context: BuildContext) -> Objective:
    check_masking_options("mlm", options)

    def mask(batch: Batch, generator: torch.Generator) -> Batch:
        selected = select_tokens(batch, options.mask_prob, generator)
        return replace_selected(batch, selected, context.vocab, options.mask_ratio,
                                options.random_ratio, generator)

    return Objective(loss=masked_lm_loss, heads={"mlm": MLMHead}, batch_transform=mask)


@hookimpl
def pretextual_register_objectives(register):
    register(ObjectiveSpec(name="mlm", build=build, options=MLMOptions,
                           description="Masked language modelling, 80/10/10 (BERT)"))
