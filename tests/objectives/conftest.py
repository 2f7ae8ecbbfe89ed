"""Fixtures of the objective tests: a generated corpus and tokenizers trained on it
(WordPiece, byte-level BPE, Unigram), each in a second or so."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from objective_corpora import generated_documents, texts
from pretextual.core.corpus import Document
from pretextual.core.documents import TokenizedDocuments
from pretextual.core.tokenizer import SPECIAL_TOKENS, train_wordpiece
from pretextual.plugins.manager import Plugins


@pytest.fixture(scope="session")
def plugins() -> Plugins:
    return Plugins()


@pytest.fixture(scope="session")
def documents() -> list[Document]:
    return generated_documents(0, 1500)


@pytest.fixture(scope="session")
def wordpiece(documents) -> Tokenizer:
    return train_wordpiece(texts(documents), vocab_size=1000)


@pytest.fixture(scope="session")
def wordpiece_documents(documents, wordpiece) -> TokenizedDocuments:
    return TokenizedDocuments.from_documents(documents, wordpiece)


@pytest.fixture(scope="session")
def bpe(documents) -> Tokenizer:
    """Byte-level BPE (GPT-2/RoBERTa style): a word's first piece starts with 'Ġ'."""
    tokenizer = Tokenizer(models.BPE(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    trainer = trainers.BpeTrainer(vocab_size=1000, special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tokenizer.train_from_iterator(texts(documents), trainer=trainer)
    return tokenizer


@pytest.fixture(scope="session")
def unigram(documents) -> Tokenizer:
    """SentencePiece-style Unigram: a word's first piece starts with '▁'."""
    tokenizer = Tokenizer(models.Unigram())
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    trainer = trainers.UnigramTrainer(vocab_size=1000, special_tokens=list(SPECIAL_TOKENS),
                                      unk_token="[UNK]", show_progress=False)
    tokenizer.train_from_iterator(texts(documents), trainer=trainer)
    return tokenizer
