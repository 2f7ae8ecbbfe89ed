"""Sentence-order prediction (ALBERT, Lan et al. 2020, section 3.1).

Each example is ``[CLS] A [SEP] B [SEP]`` made of two consecutive segments of
one document, swapped with probability ``swap_prob``. A linear head on the
pooled [CLS] output says whether they were swapped. Unlike next-sentence
prediction, both segments always come from the same document, so the topic
gives nothing away: only the order does.

Label convention, ``sentence_order_label`` (as Hugging Face's AlbertForPreTraining):

* 0: the segments are in their original order;
* 1: they were swapped (B came before A in the document).

Chunks, targets and truncation are those of next-sentence prediction (see
segments.py): a chunk is split at a random sentence boundary into the two
segments; the pair is trimmed first and swapped after, so a swapped pair is
exactly the unswapped one in reverse order. A chunk needs two sentences: when
one sentence alone reaches the target, the chunk takes the next sentence too;
a document's last sentence left alone makes no pair (ALBERT's code would pair
it with another document, which sentence-order prediction must not do).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pretextual.core.data import pair_example
from pretextual.objectives.segments import (check_probability, chunk_end, document_sentences, join,
                                            pair_classification_loss, pair_classifier,
                                            require_two_sentences, target_length, truncate_pair)
from pretextual.plugins.api import (BuildContext, Documents, Example, ExampleBuilder, Objective,
                                    ObjectiveOutput, ObjectiveSpec, StepInputs, Vocab)
from pretextual.plugins.hookspecs import hookimpl

IN_ORDER = 0
SWAPPED = 1


@dataclass
class SOPOptions:
    swap_prob: float = 0.5
    """Probability that the two segments are swapped (label 1)."""
    short_seq_prob: float = 0.1
    """Probability that a document's pairs aim at a random length in [2, max_seq_length - 3]."""

    def check(self, name: str) -> None:
        """Called by the core when the config is checked: each probability in [0, 1]."""
        check_probability(name, "swap_prob", self.swap_prob)
        check_probability(name, "short_seq_prob", self.short_seq_prob)


def sentence_order_pairs(options: SOPOptions, max_seq_length: int, vocab: Vocab) -> ExampleBuilder:
    """The example builder: every document cut into pairs of consecutive segments.

    Raises DataError when no document has two sentences.
    """
    max_num_tokens = max_seq_length - 3

    def build(docs: Documents, rng: np.random.Generator) -> list[Example]:
        sentences = document_sentences(docs)
        require_two_sentences("sop", sentences)
        examples: list[Example] = []
        for sents in sentences:
            target = target_length(max_num_tokens, options.short_seq_prob, rng)
            i = 0
            while i < len(sents) - 1:  # a document's last sentence left alone makes no pair
                end = max(chunk_end(sents, i, target), i + 2)
                a_end = int(rng.integers(i + 1, end))
                a, b = truncate_pair(join(sents[i:a_end]), join(sents[a_end:end]),
                                     max_num_tokens, rng)
                label = SWAPPED if rng.random() < options.swap_prob else IN_ORDER
                if label == SWAPPED:
                    a, b = b, a
                examples.append(pair_example(a, b, vocab, sentence_order_label=label))
                i = end
        return examples

    return build


def sentence_order_loss(inputs: StepInputs) -> ObjectiveOutput:
    """2-way cross-entropy of the "sop" head on the pooled output; metric: accuracy."""
    return pair_classification_loss(inputs, "sop", "sentence_order_label")


def build(options: SOPOptions, context: BuildContext) -> Objective:
    """``sop`` for a run: the consecutive-segment example builder, the "sop" head and its loss."""
    return Objective(loss=sentence_order_loss, heads={"sop": pair_classifier},
                     example_builder=sentence_order_pairs(options, context.max_seq_length,
                                                          context.vocab))


@hookimpl
def pretextual_register_objectives(register):
    register(ObjectiveSpec(name="sop", build=build, options=SOPOptions,
                           provides=("example_builder",),
                           description="Sentence-order prediction of two consecutive segments (ALBERT)"))
