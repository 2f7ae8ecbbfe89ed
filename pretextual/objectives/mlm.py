"""Masked language modelling (BERT, Devlin et al. 2019, section 3.1).

Hides ``mask_prob`` of the ordinary tokens of each sequence; of those,
``mask_ratio`` become [MASK], ``random_ratio`` a random ordinary token and the
rest stay unchanged. The head predicts the original token at the selected
positions only (sparse prediction, as Google's run_pretraining.py does).

The head and the loss are shared with whole-word and span masking; the masking
itself (choosing positions, the 80/10/10 replacement) is in masking.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from pretextual.errors import ConfigError
from pretextual.objectives.masking import IGNORE_INDEX, mask_tokens, replace_selected, select_tokens
from pretextual.plugins.api import (Batch, BuildContext, Encoder, Objective, ObjectiveOutput,
                                    ObjectiveSpec, StepInputs)
from pretextual.plugins.hookspecs import hookimpl

# What plugins reuse (docs/plugins.md); select_tokens and replace_selected live in masking.py.
__all__ = ["IGNORE_INDEX", "MLMHead", "MLMOptions", "build", "check_masking_options",
           "cross_entropy_and_accuracy", "masked_lm_loss", "replace_selected", "select_tokens"]


@dataclass
class MLMOptions:
    mask_prob: float = 0.15
    """Share of the ordinary (non-special, non-padding) tokens of each sequence to predict."""
    mask_ratio: float = 0.8
    """Share of the selected tokens replaced by [MASK]."""
    random_ratio: float = 0.1
    """Share of the selected tokens replaced by a random ordinary token (the rest stay)."""

    def check(self, name: str) -> None:
        """Called by the core when the config is checked: see check_masking_options."""
        check_masking_options(name, self)


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


class MLMHead(nn.Module):
    """The encoder architecture's own MLM head (Hugging Face's BertLMPredictionHead, or
    ModernBERT's head and decoder): its transform, then the vocabulary projection tied to
    the word embeddings, plus a per-token bias."""

    def __init__(self, encoder: Encoder):
        super().__init__()
        self.transform = encoder.new_prediction_head()
        self.bias = nn.Parameter(torch.zeros(encoder.config.vocab_size))
        # Tied to the encoder's word embeddings: kept outside this module's own
        # parameters and state dict, so it is saved and counted once.
        self.__dict__["word_embeddings"] = encoder.get_input_embeddings()

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return F.linear(self.transform(hidden), self.word_embeddings.weight, self.bias)

    def loss_and_accuracy(self, hidden: torch.Tensor, target: torch.Tensor
                          ) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean cross-entropy of ``forward(hidden)`` against ``target`` and the share
        of positions whose highest logit is the target."""
        return cross_entropy_and_accuracy(self(hidden), target)


def cross_entropy_and_accuracy(logits: torch.Tensor, target: torch.Tensor
                               ) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean cross-entropy (in fp32) and accuracy of [n, vocab] logits against [n] targets."""
    return F.cross_entropy(logits.float(), target), (logits.argmax(-1) == target).float().mean()


def masked_lm_loss(inputs: StepInputs) -> ObjectiveOutput:
    """Cross-entropy of the MLM head, run only at the labelled positions."""
    labels = inputs.batch["mlm_labels"].reshape(-1)
    # Row-major positions of the labels (the order boolean indexing gives), gathered with
    # index_select: cheaper than boolean indexing forward and backward.
    where = (labels != IGNORE_INDEX).nonzero().squeeze(1)
    last = inputs.encoder_output.last_hidden_state
    hidden = last.reshape(-1, last.shape[-1]).index_select(0, where)  # [n_selected, hidden]
    target = labels.index_select(0, where)
    head = inputs.heads["mlm"]
    if isinstance(head, MLMHead):  # whose loss an acceleration may compute another way
        loss, accuracy = head.loss_and_accuracy(hidden, target)
    else:  # a head some plugin supplies under the same name
        loss, accuracy = cross_entropy_and_accuracy(head(hidden), target)
    return ObjectiveOutput(loss=loss, metrics={"accuracy": accuracy})


def build(options: MLMOptions, context: BuildContext) -> Objective:
    """``mlm`` for a run: the MLM head, its loss, and masking over ``context.vocab``."""

    def mask(batch: Batch, generator: torch.Generator) -> Batch:
        return mask_tokens(batch, context.vocab, options.mask_prob, options.mask_ratio,
                           options.random_ratio, generator)

    return Objective(loss=masked_lm_loss, heads={"mlm": MLMHead}, batch_transform=mask)


@hookimpl
def pretextual_register_objectives(register):
    register(ObjectiveSpec(name="mlm", build=build, options=MLMOptions,
                           provides=("batch_transform",),
                           description="Masked language modelling, 80/10/10 (BERT)"))
