"""data.tokenizer: a tokenizer.json, a directory holding one, a WordPiece vocab.txt or a
directory holding only vocab.txt; anything else is one line naming the path."""

from __future__ import annotations

import json
import re
import shutil

import pytest

from pretextual.core.config import load_config
from pretextual.core.tokenizer import load_tokenizer, train_wordpiece
from pretextual.core.trainer import Trainer
from pretextual.errors import DataError
from run_helpers import tiny_overrides

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "boat", "##s", "river", ".", "The"]


def write_vocab(path, tokens=VOCAB):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(t + "\n" for t in tokens), encoding="utf-8")
    return path


def test_a_directory_holding_a_tokenizer_json(corpus_file, tmp_path):
    trained = train_wordpiece(corpus_file.read_text().splitlines(), 300)
    (tmp_path / "model").mkdir()
    trained.save(str(tmp_path / "model" / "tokenizer.json"))
    write_vocab(tmp_path / "model" / "vocab.txt")  # a transformers directory has both
    loaded = load_tokenizer(tmp_path / "model")
    assert loaded.to_str() == load_tokenizer(tmp_path / "model" / "tokenizer.json").to_str()
    assert loaded.get_vocab() == trained.get_vocab() and "[UNK]" not in VOCAB[5:]
    assert loaded.encode("Water boat.").ids == trained.encode("Water boat.").ids


def test_a_vocab_txt_is_bert_wordpiece(tmp_path):
    tokenizer = load_tokenizer(write_vocab(tmp_path / "my-vocab.txt"))
    assert tokenizer.get_vocab() == {t: i for i, t in enumerate(VOCAB)}
    assert tokenizer.encode("The BOATS [MASK] river.", add_special_tokens=False).ids == [5, 6, 7, 4, 8, 9]
    assert tokenizer.encode("Boat!", add_special_tokens=False).ids == [6, 1]  # "!" is not in it
    cased = load_tokenizer(tmp_path / "my-vocab.txt", lowercase=False)
    assert cased.encode("The boats", add_special_tokens=False).ids == [10, 6, 7]


@pytest.mark.parametrize("do_lower_case, ids", [(None, [5, 6]), (True, [5, 6]), (False, [10, 1])])
def test_a_directory_holding_only_a_vocab_txt(tmp_path, do_lower_case, ids):
    write_vocab(tmp_path / "bert" / "vocab.txt")
    if do_lower_case is not None:  # as transformers saves a BERT tokenizer
        config = {"do_lower_case": do_lower_case, "tokenizer_class": "BertTokenizer"}
        (tmp_path / "bert" / "tokenizer_config.json").write_text(json.dumps(config))
    tokenizer = load_tokenizer(tmp_path / "bert")
    assert tokenizer.encode("The Boat", add_special_tokens=False).ids == ids
    assert tokenizer.token_to_id("[MASK]") == 4


def test_a_path_that_holds_no_tokenizer_is_one_line(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "tokenizer.txt.bak").write_text("")
    message = f"data.tokenizer: {tmp_path / 'empty'}: a directory with neither tokenizer.json nor vocab.txt in it"
    with pytest.raises(DataError, match=f"^{re.escape(message)}$"):
        load_tokenizer(tmp_path / "empty")
    with pytest.raises(DataError, match=f"^data.tokenizer: no such file or directory: "
                                        f"{re.escape(str(tmp_path / 'nope'))}$"):
        load_tokenizer(tmp_path / "nope")
    no_mask = write_vocab(tmp_path / "short" / "vocab.txt", VOCAB[:4] + VOCAB[5:])
    with pytest.raises(DataError, match=f"^data.tokenizer: {re.escape(str(no_mask))}: has no mask "
                                        r"token \(looked for \[MASK\], <mask>\)$"):
        load_tokenizer(tmp_path / "short")
    (tmp_path / "bad" / "vocab.txt").parent.mkdir()
    (tmp_path / "bad" / "vocab.txt").write_bytes(b"\xff\xfe[PAD]\n")
    with pytest.raises(DataError, match=r"^data.tokenizer: .*vocab\.txt: not a WordPiece vocabulary "
                                        r"\(.*UTF-8\)$"):
        load_tokenizer(tmp_path / "bad")


def test_a_run_with_a_vocab_txt_tokenizes_with_its_ids(corpus_file, cache_dir, tmp_path):
    lines = corpus_file.read_text().splitlines()
    reference = train_wordpiece(lines, 300)
    by_id = sorted(reference.get_vocab().items(), key=lambda kv: kv[1])
    vocab = write_vocab(tmp_path / "model" / "vocab.txt", [t for t, _ in by_id])
    shutil.copy(vocab, tmp_path / "vocab-copy.txt")  # a bare file, no tokenizer_config.json
    run = tmp_path / "run"
    Trainer(load_config("roberta", tiny_overrides(corpus_file, cache_dir, run, 2)
                        + [f"data.tokenizer={tmp_path / 'model'}"]), log=lambda *a: None).train()
    used = load_tokenizer(run / "tokenizer.json")
    assert used.get_vocab() == reference.get_vocab() == {t: i for i, (t, _) in enumerate(by_id)}
    for sentence in lines[:40]:
        assert used.encode(sentence, add_special_tokens=False).ids == \
            reference.encode(sentence, add_special_tokens=False).ids
    assert used.to_str() == load_tokenizer(tmp_path / "vocab-copy.txt").to_str()
