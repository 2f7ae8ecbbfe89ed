"""Corpora, tokenization cache, examples and batches, and bad input."""

import json

import numpy as np
import pytest

from pretextual.core.corpus import embedded_corpus, read_corpus, split_sentences
from pretextual.core.data import Batches, collate, full_sentences
from pretextual.core.documents import TokenizedDocuments
from pretextual.core.prepare import tokenized_corpus
from pretextual.core.tokenizer import train_wordpiece, vocab_of
from pretextual.core.trainer import Trainer
from pretextual.plugins.api import Vocab
from pretextual.errors import DataError


def test_text_jsonl_directory_and_glob(tmp_path):
    (tmp_path / "a.txt").write_text("First doc. Two sentences here.\nAnother line.\n\nSecond doc.\n")
    (tmp_path / "b.jsonl").write_text(json.dumps({"text": "A json doc. It has two."}) + "\n\n"
                                      + json.dumps({"text": "Line one.\nLine two."}) + "\n")
    docs = read_corpus(str(tmp_path / "a.txt"))
    assert [d.sentences for d in docs] == [["First doc.", "Two sentences here.", "Another line."],
                                           ["Second doc."]]
    assert len(read_corpus(str(tmp_path / "b.jsonl"))) == 2
    assert len(read_corpus(str(tmp_path))) == 4
    assert len(read_corpus(str(tmp_path / "*.txt"))) == 2


def test_a_directory_reads_its_text_files_and_says_what_it_skipped(tmp_path, capsys):
    (tmp_path / "AA").mkdir()
    (tmp_path / "a.txt").write_text("Read this one. It counts.\n")
    for name in ("AA/wiki_00", "AA/wiki_01", "notes.md"):  # WikiExtractor output, a README
        (tmp_path / name).write_text("Not read from the directory.\n")
    for _ in range(2):  # a command lists its corpus several times; the warning comes once
        assert [d.sentences for d in read_corpus(str(tmp_path))] == [["Read this one.", "It counts."]]
    err = capsys.readouterr().err
    assert err == (f"pretextual: warning: data.corpus: {tmp_path}: read 1 file; "
                   f"skipped 3 other files (AA/wiki_00, AA/wiki_01, notes.md); a glob such as "
                   f"'{tmp_path}/**' reads every file it matches, whatever its suffix\n")
    assert len(read_corpus(f"{tmp_path}/**")) == 4  # the glob it suggests reads them all
    assert capsys.readouterr().err == ""


def test_a_directory_without_text_files_is_an_error_naming_the_suffixes(tmp_path):
    (tmp_path / "wiki_00").write_text("Only extensionless files here.\n")
    with pytest.raises(DataError) as info:
        read_corpus(str(tmp_path))
    assert str(info.value) == (f"data.corpus: {tmp_path} holds no text, .jsonl, Parquet or Arrow file; skipped "
                               f"1 other file (wiki_00); a glob such as '{tmp_path}/**' reads "
                               f"every file it matches, whatever its suffix")


def test_sentence_splitter_keeps_abbreviations():
    assert split_sentences("See e.g. the docs. Dr. Smith agrees! Is it 3 p.m.? Yes.") == \
        ["See e.g. the docs.", "Dr. Smith agrees!", "Is it 3 p.m.?", "Yes."]


def test_embedded_corpus_is_offline_text_with_many_documents():
    docs = embedded_corpus()
    assert len(docs) > 100
    assert sum(len(s) for d in docs for s in d.sentences) > 500_000
    assert all(len(d.sentences) >= 1 for d in docs)


@pytest.mark.parametrize("content, message", [
    (None, "no such file or directory"),
    (b"", "holds no text"),
    (b"\n\n   \n", "holds no text"),
    (b"caf\xe9 au lait\n", r"not UTF-8 text \(byte 0xe9 at offset 3\)"),
])
def test_bad_corpus_files(tmp_path, content, message):
    path = tmp_path / "corpus.txt"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(DataError, match=message) as info:
        read_corpus(str(path))
    assert str(path) in str(info.value)


def test_bad_jsonl_names_the_line(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text('{"text": "ok."}\n{"body": "no text field"}\n')
    with pytest.raises(DataError, match=r"c\.jsonl:2: no 'text' field"):
        read_corpus(str(path))


def test_jsonl_text_must_be_a_string_and_null_is_no_document(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text('{"text": "Kept. Two sentences."}\n{"text": null}\n{"text": ""}\n')
    assert [d.sentences for d in read_corpus(str(path))] == [["Kept.", "Two sentences."]]
    path.write_text('{"text": "ok."}\n{"text": 12345}\n')
    with pytest.raises(DataError, match=r"c\.jsonl:2: field 'text' is int, not a string"):
        read_corpus(str(path))


@pytest.mark.parametrize("name, body", [("c.txt", "First. Second.\n"),
                                        ("c.jsonl", '{"text": "First. Second."}\n')])
def test_a_utf8_byte_order_mark_is_not_text(tmp_path, name, body):
    path = tmp_path / name
    path.write_bytes(b"\xef\xbb\xbf" + body.encode())  # what Windows editors write
    assert [d.sentences for d in read_corpus(str(path))] == [["First.", "Second."]]


def test_full_sentences_packs_up_to_the_length_and_splits_long_sentences():
    text = ["alpha beta gamma delta " * 30, "short one", "another short sentence"]
    tokenizer = train_wordpiece(text, 100)
    vocab = vocab_of(tokenizer)
    from pretextual.core.corpus import Document
    docs = TokenizedDocuments.from_documents([Document(text, "t")], tokenizer)
    examples = full_sentences(32, vocab)(docs, np.random.default_rng(0))
    assert all(len(e["input_ids"]) <= 32 for e in examples)
    assert all(e["input_ids"][0] == vocab.cls_id and e["input_ids"][-1] == vocab.sep_id for e in examples)
    body = np.concatenate([e["input_ids"][1:-1] for e in examples])
    assert len(body) == len(docs.ids)  # nothing dropped, nothing repeated


def test_collate_pads_masks_and_stacks():
    vocab = Vocab(size=10, pad_id=0, unk_id=1, cls_id=2, sep_id=3, mask_id=4, special_ids=(0, 1, 2, 3, 4))
    examples = [{"input_ids": np.array([2, 7, 8, 3]), "token_type_ids": np.array([0, 0, 1, 1]),
                 "word_starts": np.array([1, 1, 0, 1], np.uint8), "label": 1},
                {"input_ids": np.array([2, 9, 3]), "token_type_ids": np.array([0, 0, 0]),
                 "word_starts": np.array([1, 1, 1], np.uint8), "label": 0}]
    batch = collate(examples, vocab, pad_to_multiple_of=3)
    assert batch["input_ids"].tolist() == [[2, 7, 8, 3, 0, 0], [2, 9, 3, 0, 0, 0]]
    assert batch["token_type_ids"].tolist() == [[0, 0, 1, 1, 0, 0], [0, 0, 0, 0, 0, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1, 0, 0], [1, 1, 1, 0, 0, 0]]
    assert batch["special_tokens_mask"].tolist() == [[True, False, False, True, False, False],
                                                    [True, False, True, False, False, False]]
    assert batch["word_starts"].tolist() == [[True, True, False, True, True, True],
                                             [True, True, True, True, True, True]]
    assert batch["label"].tolist() == [1, 0]
    assert {k: str(v.dtype) for k, v in batch.items()} == {
        "input_ids": "torch.int64", "token_type_ids": "torch.int64", "word_starts": "torch.bool",
        "label": "torch.int64", "attention_mask": "torch.int64", "special_tokens_mask": "torch.bool"}
    examples[1]["token_type_ids"] = np.array([0, 0])
    with pytest.raises(ValueError, match="'token_type_ids'"):
        collate(examples, vocab)
    examples[1]["token_type_ids"] = np.array([0, 0, 0])
    for bad in (10, -1):
        examples[1]["input_ids"] = np.array([2, bad, 3])
        with pytest.raises(ValueError, match="outside the vocabulary"):
            collate(examples, vocab)


def test_batches_are_a_function_of_seed_and_index(corpus_file, tmp_path):
    tokenizer = train_wordpiece(open(corpus_file).read().splitlines(), 200)
    vocab = vocab_of(tokenizer)
    docs = TokenizedDocuments.from_documents(read_corpus(str(corpus_file)), tokenizer)
    make = lambda: Batches(docs, full_sentences(32, vocab), None, vocab, 4, seed=3)
    a, b = make(), make()
    for index in (7, 0, 3, 40):  # any order, across epochs
        assert all((a[index][k] == b[index][k]).all() for k in a[index])
    assert not (a[0]["input_ids"].shape == a[1]["input_ids"].shape
                and (a[0]["input_ids"] == a[1]["input_ids"]).all())


def test_a_tokenizer_smaller_than_data_vocab_size_is_said(corpus_file, tmp_path):
    from pretextual.core.config import load_config
    cfg = load_config("roberta", [f"data.corpus={corpus_file}", f"data.cache_dir={tmp_path}",
                                  "data.vocab_size=50000"])
    messages = []
    tokenizer, _ = tokenized_corpus(cfg.data, log=messages.append)
    size = tokenizer.get_vocab_size()
    assert size < 50000
    assert f"note: the tokenizer has {size:,} pieces, not data.vocab_size=50,000: the text holds no " \
           f"more distinct pieces" in messages


def test_second_run_uses_the_cache(corpus_file, tmp_path):
    from pretextual.core.config import load_config
    cfg = load_config("roberta", [f"data.corpus={corpus_file}", f"data.cache_dir={tmp_path}",
                                  "data.vocab_size=250"])
    messages = []
    tokenized_corpus(cfg.data, log=messages.append)
    assert any("training a WordPiece tokenizer" in m for m in messages)
    messages.clear()
    tok, docs = tokenized_corpus(cfg.data, log=messages.append)
    assert messages == [] and len(docs) == 60 and 200 < tok.get_vocab_size() <= 250


def test_a_tokenizer_file_saved_with_padding_or_truncation_tokenizes_whole_sentences(corpus_file, tmp_path):
    # tokenizer.json files saved after enable_padding / enable_truncation (as sentence-transformers
    # exports are) must not cut the corpus's sentences or put [PAD] inside the text.
    from tokenizers import Tokenizer
    from pretextual.core.config import load_config

    def docs_with(tokenizer_file, cache):
        cfg = load_config("roberta", [f"data.corpus={corpus_file}", f"data.cache_dir={tmp_path / cache}",
                                      f"data.tokenizer={tokenizer_file}"])
        _, docs = tokenized_corpus(cfg.data, log=lambda *_: None)
        return [[docs.sentence(d, i)[0].tolist() for i in range(docs.num_sentences(d))]
                for d in range(len(docs))]

    plain = tmp_path / "plain.json"
    train_wordpiece([s for d in read_corpus(str(corpus_file)) for s in d.sentences], 250).save(str(plain))
    saved = Tokenizer.from_file(str(plain))
    saved.enable_padding(pad_id=saved.token_to_id("[PAD]"), pad_token="[PAD]", length=48)
    saved.enable_truncation(max_length=6)
    configured = tmp_path / "configured.json"
    saved.save(str(configured))
    expected = docs_with(plain, "a")
    assert max(len(s) for d in expected for s in d) > 6
    assert docs_with(configured, "b") == expected


@pytest.mark.parametrize("documents, held_out, said", [  # bert: NSP needs 2 documents a side
    (1, 0, "warning: no held-out split, so no evaluation: the corpus has 1 document, and a "
           "split keeps at least 2 on each side (in a text file a blank line ends a document)"),
    (3, 0, "warning: no held-out split, so no evaluation: the corpus has 3 documents"),
    (4, 2, "note: 2 of the corpus's 4 documents are held out for evaluation (50%; "
           "data.eval_fraction=0.05), the fewest a split keeps"),
    (100, 5, None),
])
def test_the_held_out_split_keeps_two_documents_a_side_and_says_when_it_differs(
        tmp_path, tiny_config, documents, held_out, said):
    corpus = tmp_path / "docs.txt"
    corpus.write_text("\n".join(" ".join(f"Document {d} sentence {s} has words." for s in range(40)) + "\n"
                                for d in range(documents)))
    messages = []
    recipe = "roberta" if documents == 1 else "bert"
    trainer = Trainer(tiny_config(recipe, f"data.corpus={corpus}", "data.eval_fraction=0.05"),
                      log=messages.append)
    assert (trainer.eval_batches is not None) == (held_out > 0)
    split = [m for m in messages if "held-out split" in m or "held out for evaluation" in m]
    assert split == ([] if said is None else [next(m for m in split if m.startswith(said))])
    if held_out:
        assert len(trainer.eval_batches.docs) == held_out
        assert len(trainer.train_batches.docs) == documents - held_out


def test_long_documents_are_reported_and_split(tmp_path, cache_dir, tiny_config):
    long = tmp_path / "long.txt"
    long.write_text(("word " * 400 + "\n\n") * 20)
    cfg = tiny_config("roberta", f"data.corpus={long}")
    messages = []
    Trainer(cfg, log=messages.append)
    assert any("longer than the 30 tokens that data.max_seq_length=32 leaves beside [CLS] and [SEP]" in m
               and str(long) in m for m in messages)
    # Split into pieces that fit, and no token lost: every token of the corpus is in an example.
    tokenizer, docs = tokenized_corpus(cfg.data, log=lambda *_: None)
    vocab = vocab_of(tokenizer)
    examples = full_sentences(cfg.data.max_seq_length, vocab)(docs, np.random.default_rng(0))
    assert max(len(e["input_ids"]) for e in examples) <= cfg.data.max_seq_length
    kept = sum(int(np.isin(e["input_ids"], vocab.special_ids, invert=True).sum()) for e in examples)
    assert kept == len(docs.ids) == 20 * 400  # "word" is one token


def test_bad_corpus_loses_nothing_already_written(tiny_config, tmp_path):
    cfg = tiny_config("roberta", steps=2)
    Trainer(cfg, log=lambda *_: None).train()
    run = tmp_path / "run"
    before = sorted(p.relative_to(run) for p in run.rglob("*"))
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"\xff\xfe broken")
    with pytest.raises(DataError, match="bad.txt: not UTF-8"):
        # even told to replace the earlier run, a corpus that fails to read deletes nothing
        Trainer(tiny_config("roberta", f"data.corpus={bad}", "trainer.overwrite_output_dir=true",
                            steps=2), log=lambda *_: None)
    assert sorted(p.relative_to(run) for p in run.rglob("*")) == before
