"""Tokenizers: train a WordPiece tokenizer on the corpus, or load a tokenizer.json or a
WordPiece vocab.txt."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from pretextual.core.files import sha256
from pretextual.errors import DataError
from pretextual.plugins.api import Vocab

TOKENIZER_FILE = "tokenizer.json"
"""A run's, a prepared corpus's and an export's tokenizer: tokenizers' JSON format."""
VOCAB_FILE = "vocab.txt"
"""A BERT WordPiece vocabulary, one token a line (what transformers' BertTokenizer reads)."""
SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
# Spellings of each special token across BERT, RoBERTa and SentencePiece vocabularies.
_ROLES = {
    "pad": ("[PAD]", "<pad>"),
    "unk": ("[UNK]", "<unk>"),
    "cls": ("[CLS]", "<s>", "<cls>"),
    "sep": ("[SEP]", "</s>", "<sep>"),
    "mask": ("[MASK]", "<mask>"),
}


def train_wordpiece(texts: Iterable[str], vocab_size: int, lowercase: bool = True) -> Tokenizer:
    """Train a BERT-style WordPiece tokenizer (BERT normalizer and pre-tokenizer)."""
    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=lowercase)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece()
    trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
                                        show_progress=False)
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer


def read_tokenizer(path: str | Path) -> Tokenizer:
    """A tokenizer.json as it is; DataError naming the file when it cannot be read."""
    try:
        return Tokenizer.from_file(str(path))
    except Exception as exc:  # tokenizers raises a bare Exception for a missing or bad file
        raise DataError(f"{path}: not a tokenizers JSON file ({exc})") from None


def wordpiece_from_vocab(vocab_file: str | Path, lowercase: bool) -> Tokenizer:
    """BERT's WordPiece tokenizer of a vocab.txt (one token a line; BERT normalizer and
    pre-tokenizer), its special tokens marked special so text never splits them."""
    vocab = models.WordPiece.read_file(str(vocab_file))
    unk = next((s for s in _ROLES["unk"] if s in vocab), _ROLES["unk"][0])
    tokenizer = Tokenizer(models.WordPiece(vocab, unk_token=unk))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=lowercase)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece()
    tokenizer.add_special_tokens([s for role in _ROLES.values() for s in role if s in vocab])
    return tokenizer


def _vocab_lowercase(vocab_file: Path, default: bool) -> bool:
    """do_lower_case of the tokenizer_config.json beside a vocab.txt, else ``default``."""
    config = vocab_file.parent / "tokenizer_config.json"
    try:
        value = json.loads(config.read_text()).get("do_lower_case") if config.is_file() else None
    except ValueError as exc:
        raise DataError(f"data.tokenizer: {config}: not valid JSON ({exc})") from None
    return value if isinstance(value, bool) else default


def load_tokenizer(path: str | Path, lowercase: bool = True) -> Tokenizer:
    """data.tokenizer: a tokenizer.json, a directory holding one (a transformers model
    directory, a pretextual export), or a WordPiece vocab.txt (a ``.txt`` file, or a
    directory holding vocab.txt and no tokenizer.json; lower-cased as the
    tokenizer_config.json beside it says in do_lower_case, else as ``lowercase``). It must
    have every special token a run needs (:func:`vocab_of`); errors are one line naming
    the path. Padding and truncation saved in the file are turned off: the corpus is
    tokenized a whole sentence at a time, and the data pipeline packs, cuts and pads
    examples itself (a saved truncation would cut every sentence, a saved padding put
    [PAD] inside the text)."""
    path = Path(path)
    if path.is_dir():
        found = [path / name for name in (TOKENIZER_FILE, VOCAB_FILE) if (path / name).is_file()]
        if not found:
            raise DataError(f"data.tokenizer: {path}: a directory with neither {TOKENIZER_FILE} "
                            f"nor {VOCAB_FILE} in it")
        path = found[0]  # tokenizer.json when both are there: it is the exact tokenizer
    elif not path.is_file():
        raise DataError(f"data.tokenizer: no such file or directory: {path}")
    if path.suffix == ".txt":
        lowercase = _vocab_lowercase(path, lowercase)
        try:
            tokenizer = wordpiece_from_vocab(path, lowercase)
        except Exception as exc:  # tokenizers raises a bare Exception for an unreadable file
            raise DataError(f"data.tokenizer: {path}: not a WordPiece vocabulary ({exc})") from None
    else:
        tokenizer = read_tokenizer(path)
    vocab_of(tokenizer, f"data.tokenizer: {path}")
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return tokenizer


def tokenizer_sha256(tokenizer: Tokenizer) -> str:
    """The sha256 of the tokenizer's JSON: what identifies a run's tokenizer (a tokenizer
    trained again on the same text may differ, see docs/getting-started.md)."""
    return sha256(tokenizer.to_str().encode())


def vocab_of(tokenizer: Tokenizer, source: str = "tokenizer") -> Vocab:
    """The special-token ids of a tokenizer; an error names any role it lacks."""
    ids = {}
    for role, spellings in _ROLES.items():
        found = [tokenizer.token_to_id(s) for s in spellings if tokenizer.token_to_id(s) is not None]
        if not found:
            raise DataError(f"{source}: has no {role} token (looked for {', '.join(spellings)})")
        ids[role] = found[0]
    specials = {tokenizer.token_to_id(t.content) for t in tokenizer.get_added_tokens_decoder().values()
                if t.special}
    specials |= set(ids.values())
    return Vocab(size=tokenizer.get_vocab_size(), pad_id=ids["pad"], unk_id=ids["unk"],
                 cls_id=ids["cls"], sep_id=ids["sep"], mask_id=ids["mask"],
                 special_ids=tuple(sorted(specials)))


def has_word_boundaries(tokenizer: Tokenizer) -> bool:
    """Whether the tokenizer splits text into words before sub-words (so word ids mean words)."""
    return tokenizer.pre_tokenizer is not None
