"""Corpora in formats that are not read yet (Parquet, Arrow, datasets folders, compressed
text): one line saying what the file is and what to do, not "not UTF-8 text"."""

import bz2
import gzip
import lzma
from pathlib import Path

import pytest

from pretextual.cli import main

TEXT = b"A first sentence here. A second one follows.\n\nAnother document starts.\n"


def _train_error(corpus: Path, capsys) -> str:
    assert main(["train", f"data.corpus={corpus}", "trainer.max_steps=1",
                 f"trainer.output_dir={corpus.parent / 'run'}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and not (corpus.parent / "run").exists()
    return err.strip()


@pytest.mark.parametrize("suffix, compress, what, todo", [
    (".gz", gzip.compress, "a gzip-compressed file", "gunzip -k"),
    (".bz2", bz2.compress, "a bzip2-compressed file", "bunzip2 -k"),
    (".xz", lzma.compress, "an xz-compressed file", "unxz -k"),
])
def test_a_compressed_corpus_is_named_with_the_command_that_decompresses_it(
        tmp_path, capsys, suffix, compress, what, todo):
    corpus = tmp_path / f"corpus.txt{suffix}"
    corpus.write_bytes(compress(TEXT))
    assert _train_error(corpus, capsys) == (
        f"pretextual: error: {corpus}: {what}, not text: decompress it first: {todo} {corpus} "
        f"(pretextual reads UTF-8 text and .jsonl files)")


def test_a_parquet_folder_says_how_to_write_its_text_as_json_lines(tmp_path, capsys):
    # A Parquet file begins and ends with the magic bytes PAR1; the content is never parsed.
    folder = tmp_path / "fineweb"
    folder.mkdir()
    for i in range(2):
        (folder / f"part-{i}.parquet").write_bytes(b"PAR1" + bytes(range(256)) + b"PAR1")
    err = _train_error(folder, capsys)
    assert err.startswith(f"pretextual: error: data.corpus: {folder} holds no .txt/.text/.jsonl "
                          f"file but 2 files like part-0.parquet, a Parquet file: write its text "
                          f"column as JSON lines")
    assert f"pd.read_parquet('{folder / 'part-0.parquet'}')" in err


def test_a_datasets_folder_says_how_to_write_it_as_json_lines_and_its_arrow_file_points_there(
        tmp_path, capsys):
    folder = tmp_path / "wiki"  # what DatasetDict.save_to_disk writes
    (folder / "train").mkdir(parents=True)
    (folder / "dataset_dict.json").write_text('{"splits": ["train"]}')
    (folder / "train" / "state.json").write_text("{}")
    arrow = folder / "train" / "data-00000-of-00001.arrow"
    arrow.write_bytes(b"\xff\xff\xff\xff" + bytes(64))
    assert _train_error(folder, capsys) == (
        f"pretextual: error: data.corpus: {folder} is a Hugging Face datasets folder "
        f"(save_to_disk), which is not read yet; write it as JSON lines and train on those: "
        f"python -c \"from datasets import load_from_disk; load_from_disk('{folder}')['train']"
        f".to_json('corpus.jsonl')\" then data.corpus=corpus.jsonl (data.text_field names its "
        f"text column)")
    assert _train_error(arrow, capsys).startswith(
        f"pretextual: error: {arrow}: an Arrow stream (a Hugging Face datasets file), not text: "
        f"give data.corpus the folder datasets saved")


def test_text_that_merely_starts_like_a_magic_number_is_read(tmp_path, capsys):
    corpus = tmp_path / "notes.txt"
    corpus.write_bytes(b"PK is a common abbreviation. BZh is not a word.\n\n" * 40)
    out = tmp_path / "run"
    assert main(["train", f"data.corpus={corpus}", "trainer.max_steps=1", "data.vocab_size=200",
                 "data.max_seq_length=16", "data.batch_size=2", "trainer.export=",
                 "trainer.plot=false", "trainer.summary_task=null", "trainer.progress=false",
                 "trainer.eval_every=0", f"trainer.output_dir={out}"]) == 0
