"""Generated corpora and helpers shared by the objective tests.

Text is generated: made-up words with Zipf frequencies, so frequent words are
single pieces and rare ones split into several. Synthetic tokenized documents
(ids consecutive through the corpus) let the sentence-pair tests see where
every token came from.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from tokenizers import Tokenizer

from pretextual.core.corpus import Document
from pretextual.core.data import collate, full_sentences, single_segment
from pretextual.core.documents import TokenizedDocuments
from pretextual.architectures.bert import BertConfig
from pretextual.core.tokenizer import has_word_boundaries, vocab_of
from pretextual.plugins.api import BuildContext, Vocab
from run_helpers import TOPICS, VERBS

SYLLABLES = "ka lo mi ter ban sul pra ve dor qui nex ot ra fen glo ush".split()


def generated_documents(seed: int, n_docs: int, sentences=(2, 10), words=(4, 16)) -> list[Document]:
    """Documents of made-up words; every sentence ends with a full stop."""
    rng = np.random.default_rng(seed)
    lexicon = np.array(sorted({"".join(rng.choice(SYLLABLES, rng.integers(1, 5)))
                               for _ in range(3000)}))
    zipf = 1.0 / np.arange(1, len(lexicon) + 1) ** 0.8
    n_sentences = rng.integers(sentences[0], sentences[1] + 1, n_docs)
    n_words = rng.integers(words[0], words[1] + 1, n_sentences.sum())
    drawn = iter(rng.choice(lexicon, n_words.sum(), p=zipf / zipf.sum()).tolist())
    sents = iter(" ".join(next(drawn) for _ in range(n)) + "." for n in n_words)
    return [Document([next(sents) for _ in range(n)], f"generated:{d}")
            for d, n in enumerate(n_sentences)]


def texts(docs: list[Document]) -> list[str]:
    return [s for d in docs for s in d.sentences]


def context_for(tokenizer: Tokenizer, max_seq_length: int = 128) -> BuildContext:
    """What the core hands an objective for a run with this tokenizer."""
    vocab = vocab_of(tokenizer)
    config = BertConfig(vocab_size=vocab.size, hidden_size=32, num_hidden_layers=1,
                           num_attention_heads=2, intermediate_size=64)
    return BuildContext(encoder_config=config, vocab=vocab, max_seq_length=max_seq_length,
                        has_word_boundaries=has_word_boundaries(tokenizer))


@dataclass
class Masked:
    """Batches before and after a batch transform, flattened to [rows, seq]."""

    original: torch.Tensor  # input_ids before
    corrupted: torch.Tensor  # input_ids after
    labels: torch.Tensor  # mlm_labels
    candidates: torch.Tensor  # ordinary pieces (not special, not padding)
    word_starts: torch.Tensor

    @property
    def selected(self) -> torch.Tensor:
        return self.labels != -100


def mask_corpus(transform, docs: TokenizedDocuments, vocab: Vocab, max_seq_length: int = 128,
                batch_size: int = 64, seed: int = 0) -> Masked:
    """Run a batch transform over every example of the default builder."""
    examples = full_sentences(max_seq_length, vocab)(docs, np.random.default_rng(seed))
    parts = []
    for k in range(0, len(examples), batch_size):
        batch = collate(examples[k:k + batch_size], vocab, pad_to_multiple_of=max_seq_length)
        out = transform(dict(batch), torch.Generator().manual_seed(seed * 100_000 + k))
        parts.append((batch["input_ids"], out["input_ids"], out["mlm_labels"],
                      batch["attention_mask"].bool() & ~batch["special_tokens_mask"],
                      batch["word_starts"]))
    return Masked(*(torch.cat(column) for column in zip(*parts)))


def collate_rows(sentences: list[str], tokenizer: Tokenizer, vocab: Vocab):
    """A batch of [CLS] sentence [SEP] rows, one per sentence."""
    docs = TokenizedDocuments.from_documents([Document([s], "row") for s in sentences], tokenizer)
    return collate([single_segment(*docs.sentence(d, 0), vocab) for d in range(len(docs))], vocab)


def changes_only_at(selected: torch.Tensor, boundary: torch.Tensor) -> bool:
    """Whether the selection switches on or off only where ``boundary`` is True."""
    switches = selected[:, 1:] != selected[:, :-1]
    return bool((switches <= boundary[:, 1:]).all())


@dataclass
class Synthetic:
    """Documents whose tokens say where they come from: ids are consecutive
    through the corpus, so a contiguous run of text is a run of consecutive ids."""

    docs: TokenizedDocuments
    vocab: Vocab
    doc_of: np.ndarray  # token id -> document
    sentence_start: np.ndarray  # token id -> first token of a sentence
    sentence_end: np.ndarray  # token id -> last token of a sentence

    def context(self, max_seq_length: int) -> BuildContext:
        return BuildContext(encoder_config=BertConfig(vocab_size=self.vocab.size),
                            vocab=self.vocab, max_seq_length=max_seq_length,
                            has_word_boundaries=True)


def synthetic_corpus(n_docs: int, seed: int, sentences=(2, 30), length=(4, 24)) -> Synthetic:
    rng = np.random.default_rng(seed)
    first = 5  # ids 0-4 are the special tokens
    n_sentences = rng.integers(sentences[0], sentences[1] + 1, n_docs)
    lengths = rng.integers(length[0], length[1] + 1, n_sentences.sum())
    ids = np.arange(first, first + lengths.sum(), dtype=np.int32)
    word_starts = (rng.random(len(ids)) < 0.7).astype(np.uint8)
    sentence_offsets = np.concatenate([[0], np.cumsum(lengths)])
    word_starts[sentence_offsets[:-1]] = 1  # a sentence begins a word
    document_offsets = np.concatenate([[0], np.cumsum(n_sentences)])
    size = first + len(ids)
    doc_of = np.full(size, -1)
    doc_of[first:] = np.repeat(np.arange(n_docs), np.diff(sentence_offsets[document_offsets]))
    sentence_start = np.zeros(size, bool)
    sentence_start[first + sentence_offsets[:-1]] = True
    sentence_end = np.zeros(size, bool)
    sentence_end[first + sentence_offsets[1:] - 1] = True
    vocab = Vocab(size=size, pad_id=0, unk_id=1, cls_id=2, sep_id=3, mask_id=4,
                  special_ids=(0, 1, 2, 3, 4))
    docs = TokenizedDocuments(ids, word_starts, sentence_offsets, document_offsets)
    return Synthetic(docs, vocab, doc_of, sentence_start, sentence_end)


def segments(example) -> tuple[np.ndarray, np.ndarray]:
    """Segments A and B of a [CLS] A [SEP] B [SEP] example."""
    ids, types = example["input_ids"], example["token_type_ids"]
    return ids[types == 0][1:-1], ids[types == 1][:-1]


NAMES = "anna boris clara dmitri elena felix greta hugo iris jonas karl lena".split()
TIMES = "dawn morning noon afternoon dusk evening night midnight".split()


def write_story_corpus(path, documents: int = 240):
    """Text in which every shipped objective learns within a few hundred tiny steps.

    Each document is one person's day: a sentence per time of day, "At dawn anna sees the
    tree.", naming the person in every sentence (so a random next segment usually names
    someone else) and opening with the time (so the order of two segments shows). The text
    is fixed by the person and the time, so masked words are soon predicted and the pair
    heads, which only learn once masked-word prediction has settled, start early."""
    topics = [words.split() for words in TOPICS.values()]
    lines = []
    for d in range(documents):
        words, name = topics[d % len(topics)], NAMES[d % len(NAMES)]
        lines += [f"At {when} {name} {VERBS[t]} the {words[t]}." for t, when in enumerate(TIMES)]
        lines.append("")
    path.write_text("\n".join(lines), encoding="utf-8")
    return path
