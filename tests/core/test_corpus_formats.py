"""Corpora as people have them: compressed text and JSON lines, Parquet and Arrow files,
datasets' save_to_disk folders, read as the same documents as the plain text, streamed in
flat memory; a damaged or unusable file is one line naming it."""

import bz2
import gzip
import json
import lzma
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc
import pyarrow.parquet
import pytest
import zstandard

from pretextual.cli import main
from pretextual.core.corpus import corpus_files, iter_documents, read_corpus
from run_helpers import tiny_overrides, topic_rows

COMPRESS = {".gz": gzip.compress, ".bz2": bz2.compress, ".xz": lzma.compress,
            ".zst": lambda data: zstandard.ZstdCompressor().compress(data)}
TEXT_BYTES = b"A first sentence here. A second one follows.\n\nAnother document starts.\n"


def _texts(n: int = 40) -> list[str]:
    """Documents of a few sentences, one a line or two long."""
    rows = topic_rows(groups=n, per_group=1)
    return [f"{r['text']} {r['text'].lower().capitalize()}\nA second line of document {i}."
            for i, r in enumerate(rows)]


def _sentences(docs) -> list[list[str]]:
    return [d.sentences for d in docs]


@pytest.fixture
def plain(tmp_path):
    """The same documents as text (blank line between documents) and as JSON lines."""
    texts = _texts()
    text = tmp_path / "plain" / "corpus.txt"
    text.parent.mkdir()
    text.write_text("\n\n".join(texts) + "\n")
    jsonl = tmp_path / "plain" / "corpus.jsonl"
    jsonl.write_text("".join(json.dumps({"text": t, "id": i}) + "\n" for i, t in enumerate(texts)))
    return texts, text, jsonl


@pytest.mark.parametrize("suffix", list(COMPRESS))
def test_compressed_text_and_json_lines_read_as_the_plain_files(plain, tmp_path, suffix):
    _, text, jsonl = plain
    for source in (text, jsonl):
        packed = tmp_path / (source.name + suffix)
        packed.write_bytes(COMPRESS[suffix](source.read_bytes()))
        assert _sentences(iter_documents(packed)) == _sentences(iter_documents(source))
        assert len(_sentences(iter_documents(packed))) == 40


def test_parquet_arrow_and_datasets_folders_read_one_document_per_row(plain, tmp_path):
    import datasets
    texts, _, jsonl = plain
    expected = _sentences(iter_documents(jsonl))
    table = pa.table({"id": list(range(len(texts))), "text": texts})
    pyarrow.parquet.write_table(table, tmp_path / "corpus.parquet", row_group_size=7)
    with pa.OSFile(str(tmp_path / "corpus.arrow"), "wb") as sink, \
            pyarrow.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=9)
    for name in ("corpus.parquet", "corpus.arrow"):
        assert _sentences(iter_documents(tmp_path / name)) == expected
    dataset = datasets.Dataset.from_dict({"text": texts, "label": [0] * len(texts)})
    dataset.save_to_disk(str(tmp_path / "saved"))
    datasets.DatasetDict({"train": dataset, "test": dataset.select(range(3))}).save_to_disk(
        str(tmp_path / "splits"))
    assert _sentences(read_corpus(str(tmp_path / "saved"))) == expected
    assert _sentences(read_corpus(str(tmp_path / "splits"))) == expected  # its train split
    assert [p.parent.name for p in corpus_files(str(tmp_path / "splits"))] == ["train"]


def test_a_directory_of_parquet_and_compressed_files_trains_and_prepares(
        plain, tmp_path, cache_dir, capsys):
    texts, text, _ = plain
    corpus = tmp_path / "mixed"
    corpus.mkdir()
    pyarrow.parquet.write_table(pa.table({"text": texts[:20]}), corpus / "part-0.parquet")
    (corpus / "part-1.txt.gz").write_bytes(gzip.compress("\n\n".join(texts[20:]).encode()))
    (corpus / "notes.tar.gz").write_bytes(gzip.compress(b"not a corpus"))
    assert len(read_corpus(str(corpus))) == 40
    assert "skipped 1 other file (notes.tar.gz)" in capsys.readouterr().err
    out = tmp_path / "run"
    assert main(["train", "roberta", *tiny_overrides(corpus, cache_dir, out, steps=2)]) == 0
    assert main(["prepare", str(corpus), "--out", str(tmp_path / "prepared"), "--workers", "2",
                 "--vocab-size", "300"]) == 0
    manifest = json.loads((tmp_path / "prepared" / "manifest.json").read_text())
    assert manifest["documents"] == 40


def _error(capsys, *argv) -> str:
    assert main(list(argv)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    out = Path(argv[argv.index("--out") + 1])
    assert not (out / "manifest.json").exists()  # no prepared corpus claims to be complete
    return err.strip().removeprefix("pretextual: error: ")


def test_bad_files_are_one_line_naming_them(tmp_path, capsys):
    no_text = tmp_path / "no_text.parquet"
    pyarrow.parquet.write_table(pa.table({"content": ["A sentence."], "id": [1]}), no_text)
    assert _error(capsys, "prepare", str(no_text), "--out", str(tmp_path / "p1")) == (
        f"{no_text}: no 'text' column (columns: content, id); set data.text_field")
    numbers = tmp_path / "numbers.parquet"
    pyarrow.parquet.write_table(pa.table({"text": [1, 2]}), numbers)
    assert _error(capsys, "prepare", str(numbers), "--out", str(tmp_path / "p2")) == (
        f"{numbers}: column 'text' is int64, not a string; set data.text_field")
    cut = tmp_path / "cut.txt.gz"
    whole = gzip.compress("".join(f"Sentence number {i}.\n" for i in range(5000)).encode())
    cut.write_bytes(whole[:len(whole) // 2])
    assert _error(capsys, "prepare", str(cut), "--out", str(tmp_path / "p3")).startswith(
        f"{cut}: a gzip-compressed file that is damaged or cut short (EOFError: ")
    broken = tmp_path / "broken.parquet"
    broken.write_bytes(b"PAR1" + bytes(100) + b"PAR1")
    assert _error(capsys, "prepare", str(broken), "--out", str(tmp_path / "p4")).startswith(
        f"{broken}: a Parquet file that is damaged or cut short (OSError: ")
    archive = tmp_path / "corpus.zip"
    archive.write_bytes(b"PK\x03\x04" + bytes(40))
    assert _error(capsys, "prepare", str(archive), "--out", str(tmp_path / "p5")) == (
        f"{archive}: a zip archive, which is not read: extract it first (unzip {archive})")


def test_a_missing_extra_is_named(tmp_path, capsys, monkeypatch):
    corpus = tmp_path / "corpus.parquet"
    pyarrow.parquet.write_table(pa.table({"text": ["A sentence."]}), corpus)
    packed = tmp_path / "corpus.txt.zst"
    packed.write_bytes(COMPRESS[".zst"](TEXT_BYTES))
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # an import of it fails
    monkeypatch.setitem(sys.modules, "zstandard", None)
    assert _error(capsys, "prepare", str(corpus), "--out", str(tmp_path / "p")) == (
        f"{corpus}: a Parquet file: reading it needs pyarrow: pip install 'pretextual[arrow]'")
    assert _error(capsys, "prepare", str(packed), "--out", str(tmp_path / "q")) == (
        f"{packed}: a zstd-compressed file: reading it needs zstandard: "
        f"pip install 'pretextual[zstd]'")


READ_AND_MEASURE = """
import json, resource, sys
from pretextual.core.corpus import iter_documents
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
count = size = 0
for doc in iter_documents(sys.argv[1]):
    count += 1
    size += sum(map(len, doc.sentences))
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"documents": count, "chars": size, "growth_kb": after - before}))
"""


def test_a_parquet_corpus_four_times_the_memory_allowed_is_read_in_flat_memory(tmp_path):
    # 256 MB of text in 64 KB documents, row groups of 4 MB; reading may grow by 64 MB.
    path, words = tmp_path / "big.parquet", ["river", "boat", "stone", "market", "tower", "leaf"]
    document = " ".join(f"{words[i % 6]}{i % 1000}." for i in range(9000))[:65536]
    schema = pa.schema([("text", pa.string())])
    with pyarrow.parquet.ParquetWriter(str(path), schema) as writer:
        for group in range(64):
            writer.write_table(pa.table({"text": [f"Group {group}. {document}"] * 64}, schema))
    result = json.loads(subprocess.run([sys.executable, "-c", READ_AND_MEASURE, str(path)],
                                       capture_output=True, text=True, check=True).stdout)
    assert result["documents"] == 64 * 64 and result["chars"] > 250 << 20
    assert result["growth_kb"] < 64 << 10, f"RSS grew by {result['growth_kb'] >> 10} MB"
