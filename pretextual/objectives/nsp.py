"""Next-sentence prediction (BERT, Devlin et al. 2019, section 3.1).

Each example is ``[CLS] A [SEP] B [SEP]`` (token_type_ids 0 for [CLS] A [SEP],
1 for B [SEP]). A is the first sentences of a chunk of a document; B is either
the rest of that chunk, the text that really follows A, or text from another
document. A linear head on the pooled [CLS] output says which.

Label convention, ``next_sentence_label`` (as Hugging Face's BertForPreTraining):

* 0: B follows A in the document;
* 1: B is random text from another document.

Examples are built as Google's create_pretraining_data.py builds them (chunks
and targets: see segments.py): A takes a random number of the chunk's
sentences (at least one, leaving at least one); B is random with probability
``random_next_prob``. A random B starts at a random sentence of another
document and runs to the chunk's target length, and the chunk's unused
sentences go back to begin the next chunk. Two departures from Google's code:

* It makes every one-sentence chunk a random pair, which pushed the share of
  label 1 to 53-62% on the corpora we measured (and a long lone sentence gives
  the answer away). Here the label is the coin alone: a sentence that alone
  reaches the target takes the next sentence along (the pair is truncated),
  and a document's last sentence left alone makes no pair.
* Google tries 10 random documents and may settle for A's own; here B is drawn
  among the other documents, so a random B never comes from A's document.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import numpy as np

from pretextual.core.data import pair_example
from pretextual.errors import DataError
from pretextual.objectives.segments import (Segment, check_probability, chunk_end,
                                            document_sentences, join, pair_classification_loss,
                                            pair_classifier, require_two_sentences, target_length,
                                            truncate_pair)
from pretextual.plugins.api import (BuildContext, Documents, Example, ExampleBuilder, Objective,
                                    ObjectiveOutput, ObjectiveSpec, StepInputs, Vocab)
from pretextual.plugins.hookspecs import hookimpl

IS_NEXT = 0
RANDOM_NEXT = 1


@dataclass
class NSPOptions:
    random_next_prob: float = 0.5
    """Probability that B is text from another document (label 1) rather than the text after A (label 0)."""
    short_seq_prob: float = 0.1
    """Probability that a document's pairs aim at a random length in [2, max_seq_length - 3]."""

    def check(self, name: str) -> None:
        """Called by the core when the config is checked: each probability in [0, 1]."""
        check_probability(name, "random_next_prob", self.random_next_prob)
        check_probability(name, "short_seq_prob", self.short_seq_prob)


def next_sentence_pairs(options: NSPOptions, max_seq_length: int, vocab: Vocab) -> ExampleBuilder:
    """The example builder: every document cut into labelled sentence pairs.

    Raises DataError when the documents cannot make both kinds of pair: fewer
    than two documents, or no document with two sentences.
    """
    max_num_tokens = max_seq_length - 3

    def build(docs: Documents, rng: np.random.Generator) -> list[Example]:
        sentences = document_sentences(docs)
        require_two_sentences("nsp", sentences)
        others = [doc for doc, sents in enumerate(sentences) if sents]
        if len(others) < 2:
            raise DataError(f"objectives.nsp needs at least two documents (a random next "
                            f"segment comes from another document), got {len(others)}")
        examples: list[Example] = []
        for doc, sents in enumerate(sentences):
            # Google draws the target once per document.
            target = target_length(max_num_tokens, options.short_seq_prob, rng)
            i = 0
            while i < len(sents) - 1:  # a document's last sentence left alone makes no pair
                end = max(chunk_end(sents, i, target), i + 2)
                a_end = int(rng.integers(i + 1, end))
                a = join(sents[i:a_end])
                if rng.random() < options.random_next_prob:
                    b = random_segment(sentences, others, doc, target - len(a[0]), rng)
                    label = RANDOM_NEXT
                    i = a_end  # the chunk's unused sentences begin the next chunk
                else:
                    b = join(sents[a_end:end])
                    label = IS_NEXT
                    i = end
                a, b = truncate_pair(a, b, max_num_tokens, rng)
                examples.append(pair_example(a, b, vocab, next_sentence_label=label))
        return examples

    return build


def random_segment(sentences: list[list[Segment]], others: list[int], doc: int, target: int,
                   rng: np.random.Generator) -> Segment:
    """Text from a random document other than ``doc``: from a random sentence
    on, until ``target`` tokens (at least one sentence). ``others`` lists, in
    order, the documents that have sentences."""
    pick = int(rng.integers(len(others) - 1))
    if pick >= bisect.bisect_left(others, doc):  # skip over A's own document
        pick += 1
    sents = sentences[others[pick]]
    start = int(rng.integers(len(sents)))
    return join(sents[start:chunk_end(sents, start, target)])


def next_sentence_loss(inputs: StepInputs) -> ObjectiveOutput:
    """2-way cross-entropy of the "nsp" head on the pooled output; metric: accuracy."""
    return pair_classification_loss(inputs, "nsp", "next_sentence_label")


def build(options: NSPOptions, context: BuildContext) -> Objective:
    """``nsp`` for a run: the sentence-pair example builder, the "nsp" head and its loss."""
    return Objective(loss=next_sentence_loss, heads={"nsp": pair_classifier},
                     example_builder=next_sentence_pairs(options, context.max_seq_length,
                                                         context.vocab))


@hookimpl
def pretextual_register_objectives(register):
    register(ObjectiveSpec(name="nsp", build=build, options=NSPOptions,
                           provides=("example_builder",),
                           description="Next-sentence prediction on [CLS] A [SEP] B [SEP] (BERT)"))
