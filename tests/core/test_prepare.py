"""pretextual prepare: checksummed shards that hold what the in-memory path holds, a
resumable prepare, training from the shards, and batches built a block of documents
at a time."""

import hashlib
import json
import pickle
import shutil

import numpy as np
import pytest

from pretextual.cli import main
from pretextual.core import corpus as corpus_module
from pretextual.core import prepare as prepare_module
from pretextual.core.corpus import document_boundary, iter_documents, read_corpus
from pretextual.core.data import Batches, full_sentences
from pretextual.core.documents import TokenizedDocuments
from pretextual.core.prepared import open_prepared
from pretextual.core.tokenizer import train_wordpiece, vocab_of
from pretextual.core.trainer import Trainer
from pretextual.errors import DataError
from run_helpers import write_corpus


def prepare(corpus, out, *extra) -> int:
    return main(["prepare", str(corpus), "--out", str(out), "--shard-mb", "0.2", *extra])


def sha256(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def big_corpus(tmp_path_factory):
    """About 1 MB: 3000 documents of 8 sentences, so 0.2 MB shards make five."""
    return write_corpus(tmp_path_factory.mktemp("big") / "big.txt", documents=3000)


@pytest.fixture(scope="module")
def tokenizer_file(big_corpus, tmp_path_factory):
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    path.write_text(train_wordpiece(big_corpus.read_text().splitlines(), 300).to_str())
    return path


@pytest.fixture(scope="module")
def prepared(big_corpus, tokenizer_file, tmp_path_factory):
    out = tmp_path_factory.mktemp("prepared") / "big"
    assert prepare(big_corpus, out, "--tokenizer", str(tokenizer_file), "--workers", "2") == 0
    return out


def same_documents(a: TokenizedDocuments, b: TokenizedDocuments) -> bool:
    if len(a) != len(b):
        return False
    for doc in range(len(a)):
        if a.num_sentences(doc) != b.num_sentences(doc):
            return False
        for index in range(a.num_sentences(doc)):
            (ia, sa), (ib, sb) = a.sentence(doc, index), b.sentence(doc, index)
            if not (np.array_equal(ia, ib) and np.array_equal(sa, sb) and ia.dtype == ib.dtype):
                return False
    return True


def test_shards_hold_what_memory_holds_with_checksums(prepared, big_corpus, tokenizer_file):
    manifest = json.loads((prepared / "manifest.json").read_text())
    assert len(manifest["shards"]) == 5
    for key in ("documents", "sentences", "tokens", "text_bytes"):
        assert manifest[key] == sum(s[key] for s in manifest["shards"]) > 0
    for shard in manifest["shards"]:
        for entry in shard["files"].values():
            assert sha256(prepared / entry["file"]) == entry["sha256"]
        assert np.load(prepared / shard["files"]["ids"]["file"], mmap_mode="r").dtype == np.uint16
    assert (prepared / "tokenizer.json").read_text() == tokenizer_file.read_text()

    tokenizer, docs = open_prepared(prepared, log=lambda *_: None)
    memory = TokenizedDocuments.from_documents(read_corpus(str(big_corpus)), tokenizer)
    assert len(docs.shards) == 5 and same_documents(docs, memory)
    assert docs.num_tokens() == memory.num_tokens() == manifest["tokens"]
    assert np.array_equal(docs.document_lengths(), memory.document_lengths())
    assert docs.sentences_longer_than(8) == memory.sentences_longer_than(8) > 0
    view = docs.subset(np.arange(0, len(docs), 7))
    assert view.sentences_longer_than(8) == memory.subset(np.arange(0, len(docs), 7)
                                                          ).sentences_longer_than(8)
    # Memory-mapped arrays travel (to DataLoader workers) as file names, not their 1.2 MB.
    assert len(pickle.dumps(docs)) < 50_000 and same_documents(pickle.loads(pickle.dumps(docs)), docs)


@pytest.mark.parametrize("name, text", [
    ("a.txt", "One. Two!\r\nThree?\r\n \t\r\nFour é. Five.\n\n\n" * 40 + "Last line, no newline"),
    ("b.jsonl", "".join(json.dumps({"text": f"Doc {i}. Line two.\nMore."}) + "\n" for i in range(200))),
])
def test_byte_ranges_read_like_the_whole_file(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8", newline="")
    whole = [d.sentences for d in iter_documents(path)]
    for step in (1, 17, 250):
        cuts, at = [0], 0
        while at < path.stat().st_size:
            at = document_boundary(path, at + step)
            cuts.append(at)
        ranges = [d.sentences for a, b in zip(cuts, cuts[1:]) for d in iter_documents(path, "text", a, b)]
        assert ranges == whole


def test_a_long_line_is_read_in_pieces_without_splitting_words(tmp_path, monkeypatch):
    monkeypatch.setattr(corpus_module, "LINE_PIECE_BYTES", 100)
    monkeypatch.setattr(corpus_module, "MAX_DOCUMENT_BYTES", 1000)
    words = [f"wörd{i}" for i in range(2000)]
    path = tmp_path / "line.txt"
    path.write_text(" ".join(words) + "\n", encoding="utf-8")
    docs = list(iter_documents(path))
    assert len(docs) > 10 and all(sum(map(len, d.sentences)) < 1100 for d in docs)
    assert " ".join(s for d in docs for s in d.sentences).split() == words


def test_an_interrupted_prepare_resumes(big_corpus, tokenizer_file, prepared, tmp_path, monkeypatch,
                                        capsys):
    out = tmp_path / "out"
    real, calls = prepare_module._prepare_shard, []

    def interrupted(out_dir, job):
        calls.append(job["name"])
        if len(calls) == 3:
            raise KeyboardInterrupt  # Ctrl-C while the third shard is tokenized
        return real(out_dir, job)

    monkeypatch.setattr(prepare_module, "_prepare_shard", interrupted)
    assert prepare(big_corpus, out, "--tokenizer", str(tokenizer_file), "--workers", "1") == 130
    assert not (out / "manifest.json").exists()
    with pytest.raises(DataError, match="has no manifest.json: .* did not finish there"):
        open_prepared(out)
    monkeypatch.undo()

    (out / ".left-by-a-crash.tmp").write_bytes(b"partial")
    ids = out / "shard-00000.ids.npy"
    data = ids.read_bytes()
    ids.write_bytes(data[:-1] + bytes([data[-1] ^ 0xFF]))  # damage a finished shard
    capsys.readouterr()
    assert prepare(big_corpus, out, "--tokenizer", str(tokenizer_file), "--workers", "1") == 0
    assert "1 of 5 shards already prepared" in capsys.readouterr().out  # shard 1; shard 0 redone
    assert not list(out.glob(".*.tmp"))
    resumed = json.loads((out / "manifest.json").read_text())["shards"]
    fresh = json.loads((prepared / "manifest.json").read_text())["shards"]
    assert [s["files"] for s in resumed] == [s["files"] for s in fresh]  # same bytes as one go


def test_prepare_trains_a_tokenizer_on_a_sample_and_keeps_it(big_corpus, tmp_path, capsys):
    out = tmp_path / "out"
    assert prepare(big_corpus, out, "--vocab-size", "300", "--sample-mb", "0.1", "--workers", "1") == 0
    printed = capsys.readouterr().out
    assert "on the first 0.1 MB of" in printed
    # Its ties are broken in an order that changes between runs: said, with the way out.
    assert (f"so a prepare into another directory can give another tokenizer.json; for the same "
            f"one, pass --tokenizer {out / 'tokenizer.json'}\n") in printed
    before = sha256(out / "tokenizer.json")
    assert prepare(big_corpus, out, "--vocab-size", "300", "--sample-mb", "0.1", "--workers", "1") == 0
    assert "5 of 5 shards already prepared" in capsys.readouterr().out
    assert sha256(out / "tokenizer.json") == before
    tokenizer, docs = open_prepared(out, log=lambda *_: None)
    assert tokenizer.get_vocab_size() <= 300 and len(docs) == 3000


def test_training_from_prepared_shards(prepared, tiny_config, tmp_path):
    cfg = tiny_config("bert", f"data.prepared={prepared}", "trainer.eval_every=2", steps=3)
    messages = []
    final = Trainer(cfg, log=messages.append).train()
    assert any("data.prepared: 3,000 documents" in m for m in messages)
    lines = [json.loads(l) for l in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [l["step"] for l in lines if "loss/nsp" in l] == [1, 2, 3]
    assert all(np.isfinite(l["loss"]) for l in lines if "loss" in l)
    assert "eval/loss/nsp" in final
    assert (tmp_path / "run" / "tokenizer.json").read_text() == (prepared / "tokenizer.json").read_text()


def test_batches_build_one_block_of_documents_at_a_time(prepared):
    tokenizer, docs = open_prepared(prepared, log=lambda *_: None)
    vocab = vocab_of(tokenizer)
    sizes = []

    def builder(block, rng):
        sizes.append(block.num_tokens())
        return full_sentences(32, vocab)(block, rng)

    make = lambda: Batches(docs, builder, None, vocab, 8, seed=1, block_tokens=20_000)
    a = make()
    assert a.num_blocks == 9
    length = a.epoch_length(0)
    assert len(sizes) == 9 and sum(sizes) == docs.num_tokens() and max(sizes) < 25_000
    seen = np.concatenate([a[k]["input_ids"][a[k]["attention_mask"].bool()] for k in range(length)])
    ordinary = seen[~np.isin(seen, vocab.special_ids)]
    assert len(ordinary) > 0.97 * docs.num_tokens()  # only remainders under a batch are dropped
    # Batch k is a pure function of (seed, k): a fresh instance, read in any order, agrees.
    b = make()
    for k in (length + 3, 5, 0, length - 1):
        assert all(np.array_equal(a[k][key], b[k][key]) for key in a[k])
    assert b.locate(length + 3) == (1, 3)
    assert not np.array_equal(a[length]["input_ids"][:, :4], a[0]["input_ids"][:, :4])
    sizes.clear()
    assert make().available(5) == 5 and len(sizes) == 1  # a few batches: one block tells
    assert make().available(10 ** 6) == length and len(sizes) == 1 + 9


def test_a_small_corpus_is_one_block(prepared):
    tokenizer, docs = open_prepared(prepared, log=lambda *_: None)
    small = docs.subset(np.arange(100))
    calls = []
    batches = Batches(small, lambda d, rng: calls.append(len(d)) or
                      full_sentences(32, vocab_of(tokenizer))(d, rng), None,
                      vocab_of(tokenizer), 4, seed=0)
    batches[0]
    assert batches.num_blocks == 1 and calls == [100]


@pytest.mark.parametrize("damage, message", [
    (lambda d: (d / "shard-00002.ids.npy").write_bytes(b"\x93NUMPY"), r"shard-00002\.ids\.npy: 6 bytes "
                                                                      r"where manifest\.json says \d+: damaged"),
    (lambda d: (d / "shard-00001.sentence_offsets.npy").unlink(), r"sentence_offsets\.npy: missing"),
    (lambda d: (d / "shard-00003.word_starts.npy").write_bytes(
        b"garbage!" + (d / "shard-00003.word_starts.npy").read_bytes()[8:]), r"not a \.npy array"),
    (lambda d: (d / "tokenizer.json").write_text((d / "tokenizer.json").read_text().replace(
        '"[MASK]"', '"[MASQ]"')), r"tokenizer\.json: changed since prepare"),
    (lambda d: (d / "manifest.json").write_text("{"), r"manifest\.json: not readable JSON"),
])
def test_a_damaged_prepared_directory_is_one_clear_line_and_prepare_repairs_it(
        prepared, big_corpus, tokenizer_file, tmp_path, damage, message):
    copy = tmp_path / "copy"
    shutil.copytree(prepared, copy)
    damage(copy)
    with pytest.raises(DataError, match=message) as info:
        open_prepared(copy, log=lambda *_: None)
    assert "\n" not in str(info.value)
    assert prepare(big_corpus, copy, "--tokenizer", str(tokenizer_file), "--workers", "1") == 0
    assert len(open_prepared(copy, log=lambda *_: None)[1]) == 3000


def rewrite_ids(directory, shard: str, change) -> None:
    """Give a shard's ids file other values of the same size and header."""
    path = directory / f"{shard}.ids.npy"
    ids = np.load(path)
    change(ids)
    np.save(path, ids)


def test_every_shard_is_verified_once_and_a_same_size_corruption_is_caught(prepared, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(prepared, copy)
    (copy / "verified.json").unlink(missing_ok=True)
    logged = []
    open_prepared(copy, log=logged.append)
    assert logged[0].startswith("data.prepared: verified the sha256 of 20 shard files (")
    logged.clear()
    open_prepared(copy, log=logged.append)  # remembered: nothing hashed again
    assert not any("sha256" in line for line in logged)

    rewrite_ids(copy, "shard-00002", lambda ids: ids.__setitem__(7, ids[7] ^ 1))
    with pytest.raises(DataError, match=r"shard-00002\.ids\.npy: its sha256 differs from "
                                        r"manifest\.json's: damaged; run pretextual prepare again"):
        open_prepared(copy, log=logged.append)


def test_a_token_id_outside_the_vocabulary_names_its_shard(prepared, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(prepared, copy)
    rewrite_ids(copy, "shard-00001", lambda ids: ids.__setitem__(3, 4000))  # vocabulary: 241
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["shards"][1]["files"]["ids"]["sha256"] = sha256(copy / "shard-00001.ids.npy")
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(DataError, match=r"shard-00001\.ids\.npy: token id 4000 is outside the "
                                        r"vocabulary of .*tokenizer\.json \(241 ids\)"):
        open_prepared(copy, log=lambda *_: None)


def test_a_given_tokenizer_is_what_tokenizes_whatever_the_cache_holds(corpus_file, tmp_path):
    """How a resumed run and the non-main processes of a torchrun get the run's tokenizer:
    the cache serves only when it holds that tokenizer, and an unwritable cache does not
    make a process train one of its own."""
    from pretextual.core.config import load_config
    from pretextual.core.prepare import tokenized_corpus
    from run_helpers import swapped_tokenizer, tiny_overrides
    from tokenizers import Tokenizer

    data = load_config("roberta", tiny_overrides(corpus_file, tmp_path / "cache", tmp_path / "run")).data
    trained, docs = tokenized_corpus(data, log=lambda *_: None)  # fills the cache
    foreign = Tokenizer.from_str(swapped_tokenizer(trained.to_str()))
    got, foreign_docs = tokenized_corpus(data, log=lambda *_: None, tokenizer=foreign)
    assert got.to_str() == foreign.to_str()
    expected = TokenizedDocuments.from_documents(read_corpus(str(corpus_file)), foreign)
    assert np.array_equal(foreign_docs.ids, expected.ids)
    assert not np.array_equal(foreign_docs.ids, docs.ids)

    (tmp_path / "a-file").write_text("")
    unwritable = load_config("roberta", tiny_overrides(corpus_file, tmp_path / "a-file" / "cache",
                                                       tmp_path / "run")).data
    messages = []
    got, again = tokenized_corpus(unwritable, log=messages.append, tokenizer=trained)
    assert got.to_str() == trained.to_str() and np.array_equal(again.ids, docs.ids)
    assert not any("training a WordPiece tokenizer" in m for m in messages)
