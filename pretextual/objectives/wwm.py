"""Whole-word masking (the whole-word-masking BERT models of Google's release).

Like masked language modelling, but chooses whole words instead of single
pieces: when a word is chosen, every one of its pieces is predicted, and the
80/10/10 decision ([MASK] / random token / unchanged) is made once per word.

Words come from the tokenizer's pre-tokenizer (the batch's ``word_starts``),
never from spelling such as a "##" prefix, so WordPiece, BPE and Unigram
vocabularies all work; a tokenizer without a pre-tokenizer has no words and is
refused when the objective is built.

The budget is a share of the pieces, not of the words: on average
``mask_prob`` of the ordinary pieces of each sequence are predicted, as with
``mlm``. The options, head (shared by name), replacement and loss are those of
``mlm``. Whole words are spans of one word: the selection is masking.py's
``mask_spans`` with every span one word long.
"""

from __future__ import annotations

import torch

from pretextual.objectives.masking import WHOLE_WORDS, mask_spans, require_word_boundaries
from pretextual.objectives.mlm import MLMHead, MLMOptions, masked_lm_loss
from pretextual.plugins.api import Batch, BuildContext, Objective, ObjectiveSpec
from pretextual.plugins.hookspecs import hookimpl


def build(options: MLMOptions, context: BuildContext) -> Objective:
    """``wwm`` for a run: mlm's head and loss, masking whole words; ConfigError when the
    tokenizer gives no words."""
    require_word_boundaries("wwm", context)

    def mask(batch: Batch, generator: torch.Generator) -> Batch:
        return mask_spans(batch, context.vocab, options.mask_prob, WHOLE_WORDS,
                          options.mask_ratio, options.random_ratio, generator)

    return Objective(loss=masked_lm_loss, heads={"mlm": MLMHead}, batch_transform=mask)


@hookimpl
def pretextual_register_objectives(register):
    register(ObjectiveSpec(name="wwm", build=build, options=MLMOptions,
                           provides=("batch_transform",),
                           description="Whole-word masking, 80/10/10 per word"))
