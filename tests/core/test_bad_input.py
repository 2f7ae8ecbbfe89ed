"""Bad input, tried on purpose through the ``pretextual`` command: each case is one clear
line (exit status 2) and loses nothing already saved. docs/reliability.md tabulates
these cases, and those that tests elsewhere try, with the messages seen here."""

import errno
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pretextual.cli import main
from pretextual.core import checkpoint as checkpoint_module
from pretextual.core.checkpoint import list_checkpoints, open_checkpoint
from pretextual.core.corpus import MAX_DOCUMENT_BYTES
from pretextual.core.tokenizer import train_wordpiece
from run_helpers import tiny_overrides


def run(capsys, *argv) -> tuple[int, str]:
    """(exit status, the one error line) of the pretextual command."""
    capsys.readouterr()
    status = main([str(a) for a in argv])
    err = capsys.readouterr().err.strip().splitlines()
    errors = [line for line in err if line.startswith("pretextual: error: ")]
    assert len(errors) <= 1 and all("Traceback" not in line for line in err)
    return status, errors[0] if errors else ""


def snapshot(directory) -> dict[str, bytes]:
    return {p.relative_to(directory).as_posix(): p.read_bytes()
            for p in sorted(directory.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def trained(corpus_file, cache_dir, tmp_path_factory):
    """A run of two steps with a checkpoint after each."""
    out = tmp_path_factory.mktemp("trained") / "run"
    assert main(["train", "roberta", *tiny_overrides(corpus_file, cache_dir, out, steps=2),
                 "trainer.checkpoint_every=1"]) == 0
    return out


@pytest.fixture
def saved(trained, tmp_path):
    """A copy of the trained run: (its directory, its files before the bad input)."""
    out = tmp_path / "run"
    shutil.copytree(trained, out)
    return out, snapshot(out)


def train(corpus_file, cache_dir, out, *extra, steps=2, recipe="roberta"):
    # Overwriting: even a run told to replace the saved one must leave it whole on bad input.
    return ["train", recipe, *tiny_overrides(corpus_file, cache_dir, out, steps),
            "trainer.overwrite_output_dir=true", *extra]


@pytest.mark.parametrize("name, content, message", [
    ("empty.txt", b"", r"data\.corpus: \S*empty\.txt holds no text"),
    ("image.txt", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", r"image\.txt: not UTF-8 text \(byte 0x89 at offset 0\)"),
    ("nul.txt", b"Text with a NUL\x00 in it.\n", r"nul\.txt: a binary file, not text \(NUL byte at offset 15; "
                                                 r"UTF-16 text must be converted to UTF-8\)"),
    ("utf16.txt", "Hello.".encode("utf-16"), r"utf16\.txt: not UTF-8 text \(byte 0xff at offset 0\)"),
    ("one.txt", b"Only one sentence here.\n", r"data\.corpus: too little text for data\.batch_size=8 \(the "
                                               r"training split: 1 document\): an epoch holds 1 "
                                               r"examples, fewer than one batch of 8"),
])
def test_bad_corpus_files_lose_nothing(saved, cache_dir, tmp_path, capsys, name, content, message):
    out, before = saved
    corpus = tmp_path / name
    corpus.write_bytes(content)
    status, error = run(capsys, *train(corpus, cache_dir, out))
    assert status == 2 and re.search(message, error), error
    assert snapshot(out) == before


def test_an_empty_file_in_a_corpus_directory_is_skipped(corpus_file, tmp_path, capsys):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    shutil.copy(corpus_file, corpus / "a.txt")
    (corpus / "empty.txt").write_bytes(b"")
    out = tmp_path / "prepared"
    assert run(capsys, "prepare", corpus, "--out", out, "--vocab-size", "300") == (0, "")
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["documents"] == 60
    assert [piece[0] for piece in manifest["shards"][0]["sources"]] == [str(corpus / "a.txt")]


def test_a_symlink_loop_in_a_corpus_directory_reads_each_file_once(corpus_file, tmp_path, capsys):
    corpus = tmp_path / "corpus"
    (corpus / "sub").mkdir(parents=True)
    shutil.copy(corpus_file, corpus / "a.txt")
    (corpus / "sub" / "up").symlink_to("..")  # a loop: corpus/sub/up/sub/up/...
    (corpus / "b.txt").symlink_to("a.txt")  # the same file under a second name
    out = tmp_path / "prepared"
    capsys.readouterr()
    assert main(["prepare", str(corpus), "--out", str(out), "--vocab-size", "300"]) == 0
    assert (f"pretextual: warning: data.corpus: {corpus}: skipped 1 link to a directory already "
            f"read (sub/up); each file is read once\n") in capsys.readouterr().err
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["documents"] == 60  # the corpus file's own 60, once
    glob_out = tmp_path / "by-glob"
    assert run(capsys, "prepare", f"{corpus}/**/*.txt", "--out", glob_out, "--vocab-size", "300")[0] == 0
    assert json.loads((glob_out / "manifest.json").read_text())["documents"] == 60


def test_a_fifo_as_the_corpus_is_refused(cache_dir, tmp_path, capsys):
    fifo = tmp_path / "corpus.txt"
    os.mkfifo(fifo)  # reading it would wait forever for a writer
    status, error = run(capsys, *train(fifo, cache_dir, tmp_path / "run"))
    message = f"pretextual: error: data.corpus: {fifo} is not a regular file or a directory"
    assert (status, error) == (2, message)
    assert run(capsys, "prepare", fifo, "--out", tmp_path / "prepared") == (2, message)


def test_a_document_of_one_sentence_cannot_make_sentence_pairs(saved, cache_dir, tmp_path, capsys):
    out, before = saved
    corpus = tmp_path / "one.txt"
    corpus.write_text("Only one sentence here.\n\nAnd another document of one.\n")
    status, error = run(capsys, *train(corpus, cache_dir, out, recipe="bert"))
    assert status == 2 and "objectives.nsp needs documents of at least two sentences" in error
    assert snapshot(out) == before


@pytest.mark.parametrize("option, value, message", [
    ("--sample-mb", "0", "argument --sample-mb: must be positive, got 0"),
    ("--shard-mb", "-1", "argument --shard-mb: must be positive, got -1"),
    ("--shard-mb", "inf", "argument --shard-mb: must be positive, got inf"),
    ("--workers", "0", "argument --workers: must be positive, got 0"),
    ("--sample-mb", "lots", "argument --sample-mb: expected a number, got 'lots'"),
])
def test_prepare_refuses_sizes_that_are_not_positive(corpus_file, tmp_path, capsys, option, value, message):
    with pytest.raises(SystemExit) as info:
        main(["prepare", str(corpus_file), "--out", str(tmp_path / "out"), option, value])
    assert info.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_prepare_reports_a_bad_file_from_its_worker(corpus_file, tmp_path, capsys):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    shutil.copy(corpus_file, corpus / "a.txt")
    (corpus / "b.txt").write_bytes(b"Fine so far.\n\nThen caf\xe9.\n")
    tokenizer = tmp_path / "tokenizer.json"  # given, so the bad file is first read in a worker
    tokenizer.write_text(train_wordpiece(corpus_file.read_text().splitlines(), 300).to_str())
    status, error = run(capsys, "prepare", corpus, "--out", tmp_path / "prepared", "--workers", "2",
                        "--shard-mb", "0.01", "--tokenizer", tokenizer)
    assert status == 2
    assert error == f"pretextual: error: {corpus / 'b.txt'}: not UTF-8 text (byte 0xe9 at offset 22)"
    assert not (tmp_path / "prepared" / "manifest.json").exists()


READ_AND_MEASURE = """
import json, resource, sys
from pretextual.core.corpus import iter_documents
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
sizes = [sum(map(len, d.sentences)) for d in iter_documents(sys.argv[1])]
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"sizes": sizes, "growth_kb": after - before}))
"""


def test_a_100_mb_line_is_read_in_bounded_memory(tmp_path):
    path = tmp_path / "line.txt"
    sentence = ("the quick brown fox jumps over the lazy dog while it rains " * 20).capitalize()
    block = (sentence.rstrip() + ". ") * 1000
    with open(path, "w") as f:
        for _ in range((100 << 20) // len(block) + 1):
            f.write(block)
    # Peak RSS of a fresh process, before and after reading every document of the file.
    result = json.loads(subprocess.run([sys.executable, "-c", READ_AND_MEASURE, str(path)],
                                       capture_output=True, text=True, check=True).stdout)
    sizes = result["sizes"]
    assert sum(sizes) > 99 << 20 and len(sizes) >= 20
    assert max(sizes) <= MAX_DOCUMENT_BYTES + (1 << 20)
    assert result["growth_kb"] < 64 << 10, f"RSS grew by {result['growth_kb'] >> 10} MB"


def test_an_unreadable_directory(corpus_file, cache_dir, tmp_path, capsys, monkeypatch):
    corpus = tmp_path / "corpus"
    locked = corpus / "locked"
    locked.mkdir(parents=True)
    shutil.copy(corpus_file, corpus / "a.txt")
    locked.chmod(0)
    if os.geteuid() == 0:  # root reads anything: refuse as the kernel would for a user
        real = os.scandir

        def scandir(path="."):
            if os.fspath(path) == os.fspath(locked):
                raise PermissionError(errno.EACCES, "Permission denied", os.fspath(path))
            return real(path)

        monkeypatch.setattr(os, "scandir", scandir)
    try:
        status, error = run(capsys, *train(corpus, cache_dir, tmp_path / "run"))
        assert (status, error) == (2, f"pretextual: error: data.corpus: cannot list {locked}: "
                                      f"permission denied")
        status, error = run(capsys, "prepare", corpus, "--out", tmp_path / "prepared")
        assert status == 2 and "cannot list" in error
    finally:
        locked.chmod(0o755)


def fail_on_call(n: int, real):
    """A stand-in for a write function that fails with ENOSPC on its n-th call."""
    calls = []

    def write(*args, **kwargs):
        calls.append(1)
        if len(calls) == n:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(*args, **kwargs)

    return write


def test_a_full_disk_keeps_the_previous_checkpoint(saved, corpus_file, cache_dir, monkeypatch,
                                                   capsys):
    out, before = saved
    # The model file of the next checkpoint (step 3) fails to write.
    monkeypatch.setattr(checkpoint_module, "save_file", fail_on_call(1, checkpoint_module.save_file))
    try:
        main(train(corpus_file, cache_dir, out, "trainer.checkpoint_every=1", steps=3) + ["--resume"])
    except OSError:
        pass  # see test_a_full_disk_is_one_clear_line
    checkpoints = out / "checkpoints"
    assert [p.name for p in checkpoints.iterdir()] == ["step-0000001", "step-0000002"]
    assert {k: v for k, v in snapshot(out).items() if k.startswith("checkpoints/")} == \
        {k: v for k, v in before.items() if k.startswith("checkpoints/")}
    assert open_checkpoint(list_checkpoints(checkpoints)[-1]).step == 2


def test_a_full_disk_is_one_clear_line(saved, corpus_file, cache_dir, monkeypatch, capsys):
    out, _ = saved
    monkeypatch.setattr(checkpoint_module, "save_file", fail_on_call(1, checkpoint_module.save_file))
    status, error = run(capsys, *train(corpus_file, cache_dir, out, "trainer.checkpoint_every=1",
                                       steps=3), "--resume")
    assert status == 2
    assert error == (f"pretextual: error: {out / 'checkpoints' / 'step-0000003'}: cannot write the "
                     f"checkpoint (No space left on device); the earlier checkpoints in "
                     f"{out / 'checkpoints'} are kept")


@pytest.fixture
def small_filesystem(tmp_path):
    """small_filesystem(megabytes): a real filesystem that size (a tmpfs mount), where
    this machine lets the test mount one."""
    mounts = []

    def make(megabytes: float) -> Path:
        where = tmp_path / f"small-{len(mounts)}"
        where.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={int(megabytes * 1024)}k",
                               "tmpfs", str(where)], capture_output=True, text=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip() or 'not permitted'}")
        mounts.append(where)
        return where

    yield make
    for where in mounts:
        subprocess.run(["umount", "-l", str(where)], check=False)


def test_a_real_full_disk_while_checkpointing_keeps_the_earlier_checkpoint(
        corpus_file, cache_dir, small_filesystem, capsys):
    # A checkpoint of this model is about 6.5 MB: the first fits in 10 MB, the second does not.
    out = small_filesystem(10) / "run"
    status, error = run(capsys, "train", "roberta", *tiny_overrides(corpus_file, cache_dir, out, 2),
                        "trainer.checkpoint_every=1")
    assert status == 2
    assert error == (f"pretextual: error: {out / 'checkpoints' / 'step-0000002'}: cannot write the "
                     f"checkpoint (No space left on device); the earlier checkpoints in "
                     f"{out / 'checkpoints'} are kept")
    assert [p.name for p in (out / "checkpoints").iterdir()] == ["step-0000001"]
    assert open_checkpoint(out / "checkpoints" / "step-0000001").step == 1


def test_a_real_full_disk_during_export_and_prepare_is_one_line(trained, corpus_file, small_filesystem,
                                                                capsys):
    small = small_filesystem(1)
    status, error = run(capsys, "export", trained, "--out", small / "export", "--format", "safetensors")
    assert status == 2 and error == (f"pretextual: error: {small / 'export'}: cannot write the export "
                                     f"(No space left on device); nothing there was replaced")
    assert list(small.iterdir()) == []

    tiny = small_filesystem(16 / 1024)  # 16 KB: the tokenizer and the first array do not both fit
    status, error = run(capsys, "prepare", corpus_file, "--out", tiny / "prepared", "--vocab-size",
                        "300", "--workers", "1")
    assert status == 2 and re.fullmatch(
        rf"pretextual: error: {re.escape(str(tiny / 'prepared'))}/\S+: cannot write \(No space left "
        rf"on device\); the shards written so far are kept, run prepare again to resume", error), error


def test_a_full_disk_during_prepare_keeps_finished_shards(corpus_file, tmp_path, monkeypatch, capsys):
    out = tmp_path / "prepared"
    args = ("prepare", corpus_file, "--out", out, "--shard-mb", "0.005", "--vocab-size", "300",
            "--workers", "1")
    monkeypatch.setattr(np, "save", fail_on_call(6, np.save))  # the second shard's second array
    status, error = run(capsys, *args)
    assert status == 2 and error == (f"pretextual: error: {out / 'shard-00001.word_starts.npy'}: "
                                     f"cannot write (No space left on device); the shards written "
                                     f"so far are kept, run prepare again to resume")
    assert not (out / "manifest.json").exists() and not list(out.glob(".*.tmp"))
    monkeypatch.undo()
    capsys.readouterr()
    assert main([str(a) for a in args]) == 0
    shards = len(json.loads((out / "manifest.json").read_text())["shards"])
    assert shards > 2 and f"1 of {shards} shards already prepared" in capsys.readouterr().out


def test_an_unknown_objective(saved, corpus_file, cache_dir, capsys):
    out, before = saved
    status, error = run(capsys, *train(corpus_file, cache_dir, out), "objectives.bogus.weight=1")
    assert status == 2 and error.startswith(
        "pretextual: error: objectives.bogus: no plugin registers an objective named 'bogus'")
    assert snapshot(out) == before


def test_a_corrupt_cache_header_is_rebuilt(corpus_file, tmp_path, capsys):
    cache = tmp_path / "cache"
    args = train(corpus_file, cache, tmp_path / "run", steps=1)
    assert main(args) == 0
    tokens = next(cache.rglob("tokens.safetensors"))
    data = tokens.read_bytes()
    tokens.write_bytes((1 << 40).to_bytes(8, "little") + data[8:])  # a header length past the end
    capsys.readouterr()
    assert main(args) == 0
    assert f"pretextual: warning: rebuilding damaged cache {tokens.parent}" in capsys.readouterr().err


def resumes_from_step_1_skipping(capsys, argv: list[str], out: Path, reason: str) -> None:
    """``--resume`` of the run in ``out`` skips its newest checkpoint (step 2) for
    ``reason`` and resumes at step 1."""
    capsys.readouterr()
    assert main(argv + ["--resume"]) == 0
    captured = capsys.readouterr()
    assert f"pretextual: warning: skipping checkpoint: {reason}" in captured.err
    assert f"resumed from {out / 'checkpoints' / 'step-0000001'} at step 1" in captured.out


def test_a_corrupt_checkpoint_header_falls_back_to_the_one_before(saved, corpus_file, cache_dir,
                                                                  capsys):
    out, _ = saved
    model = out / "checkpoints" / "step-0000002" / "model.safetensors"
    data = model.read_bytes()
    model.write_bytes(data[:8] + b"{" * 16 + data[24:])
    resumes_from_step_1_skipping(capsys, train(corpus_file, cache_dir, out, steps=2), out,
                                 f"{model}: corrupt (sha256 does not match trainer.json)")


def test_checkpoint_metadata_edited_or_inconsistent_falls_back_to_the_one_before(
        saved, corpus_file, cache_dir, capsys):
    out, _ = saved
    newest = out / "checkpoints" / "step-0000002"
    state = newest / "trainer.json"
    meta = json.loads(state.read_text())
    state.write_text(json.dumps({**meta, "step": 5}, indent=1))  # an edit by hand
    resumes_from_step_1_skipping(capsys, train(corpus_file, cache_dir, out, steps=2), out,
                                 f"{state}: corrupt (its content does not match its meta_sha256: "
                                 f"edited or damaged)")

    # With the checksum made to match, the step still has to be the directory's.
    meta = {**json.loads(state.read_text()), "step": 5}
    meta[checkpoint_module.META_CHECKSUM] = checkpoint_module.meta_checksum(meta)
    state.write_text(json.dumps(meta, indent=1))
    with pytest.raises(checkpoint_module.CheckpointError, match=re.escape(
            f"{state}: corrupt (step 5 in a checkpoint named step-0000002)")):
        open_checkpoint(newest)


def test_a_partial_last_line_in_metrics_is_dropped_on_resume(saved, corpus_file, cache_dir, capsys):
    out, _ = saved
    with open(out / "metrics.jsonl", "a") as f:
        f.write('{"step": 3, "loss": 5.2')  # as a full disk or a power cut leaves it
    capsys.readouterr()
    assert main(train(corpus_file, cache_dir, out, steps=3) + ["--resume"]) == 0
    assert (f"warning: {out / 'metrics.jsonl'}: dropping its partial last line, which is "
            f"not a JSON record (a write cut short)") in capsys.readouterr().out
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "loss" in r] == [1, 2, 3]


def test_a_checkpoint_of_another_model_size(saved, corpus_file, cache_dir, capsys):
    out, before = saved
    status, error = run(capsys, *train(corpus_file, cache_dir, out), "model.preset=mini", "--resume")
    assert status == 2 and error.startswith(
        f"pretextual: error: {out / 'checkpoints' / 'step-0000002'}: was written for a different "
        f"model (")
    assert error.endswith("); check model.* and data.*")
    assert snapshot(out) == before


def test_under_torchrun_a_config_error_is_printed_once_and_others_name_their_rank(
        monkeypatch, capsys, tmp_path):
    args = ("train", "roberta", "trainer.log_every=0")  # refused before any process group exists
    error = "pretextual: error: trainer.log_every must be positive, got 0"
    monkeypatch.setenv("RANK", "1")
    assert run(capsys, *args) == (2, error)  # a stray RANK outside torchrun hides nothing
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert run(capsys, *args) == (2, "")
    assert run(capsys, "config", "objectives.bogus.weight=1") == (2, "")  # plugin errors alike
    monkeypatch.setenv("RANK", "0")
    assert run(capsys, *args) == (2, error)
    # Not a config error: it may be this process's alone, so it is not left unsaid.
    monkeypatch.setenv("RANK", "1")
    missing = tmp_path / "no-run"
    assert run(capsys, "export", str(missing), "--out", str(tmp_path / "out")) == (
        2, f"pretextual: error: [rank 1] {missing}: no such run directory or checkpoint")
    # A plugin's code failing on this process's batch is said by this process too.
    from pretextual.errors import PluginRunError

    def fails(args):
        raise PluginRunError("objectives.x: loss() raised ValueError: bad batch (at x.py:3)")

    monkeypatch.setattr("pretextual.cli.cmd_train", fails)
    assert run(capsys, *args) == (
        2, "pretextual: error: [rank 1] objectives.x: loss() raised ValueError: bad batch (at x.py:3)")
