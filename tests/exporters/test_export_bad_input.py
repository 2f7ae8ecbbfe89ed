"""Bad input: missing or corrupt checkpoints, occupied output directories, unknown formats
and options. Each gives one clear line, and an existing export is never half-overwritten."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from export_helpers import checkpoint_of, copy_run, reseal
from pretextual.cli import main
from pretextual.core.checkpoint import META_CHECKSUM, meta_checksum
from pretextual.errors import CheckpointError, PluginError, PretextualError
from pretextual.exporters.export import export_checkpoint


def quiet(*_):
    pass


def test_missing_source(tmp_path):
    with pytest.raises(CheckpointError, match="no such run directory or checkpoint"):
        export_checkpoint(tmp_path / "nope", tmp_path / "out", ["safetensors"], log=quiet)
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="not a run directory or checkpoint"):
        export_checkpoint(tmp_path / "empty", tmp_path / "out", ["safetensors"], log=quiet)
    assert not (tmp_path / "out").exists()


def test_truncated_file_is_caught_by_its_checksum(mlm_run, tmp_path):
    ckpt = copy_run(mlm_run, tmp_path)
    data = (ckpt / "model.safetensors").read_bytes()
    (ckpt / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=r"model\.safetensors: corrupt \(sha256"):
        export_checkpoint(ckpt.parent.parent, tmp_path / "out", ["safetensors"], log=quiet)


def test_wrong_shapes(mlm_run, tmp_path):
    ckpt = copy_run(mlm_run, tmp_path)
    tensors = load_file(str(ckpt / "model.safetensors"))
    tensors["bert.pooler.dense.weight"] = torch.zeros(64, 128)
    save_file(tensors, str(ckpt / "model.safetensors"))
    reseal(ckpt)
    with pytest.raises(CheckpointError, match=r"model\.safetensors: does not fit the encoder .*"
                                              r"pooler\.dense\.weight"):
        export_checkpoint(ckpt, tmp_path / "out", ["safetensors"], log=quiet)


def test_safetensors_header_that_lies(mlm_run, tmp_path):
    ckpt = copy_run(mlm_run, tmp_path)
    data = (ckpt / "model.safetensors").read_bytes()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    entry = header["bert.pooler.dense.weight"]
    entry["shape"] = [entry["shape"][0] * 2, entry["shape"][1]]  # claims twice the bytes it has
    text = json.dumps(header, separators=(",", ":")).encode().ljust(n)
    assert len(text) == n
    (ckpt / "model.safetensors").write_bytes(data[:8] + text + data[8 + n:])
    reseal(ckpt)
    with pytest.raises(CheckpointError, match=r"model\.safetensors: not a readable safetensors file"):
        export_checkpoint(ckpt, tmp_path / "out", ["safetensors"], log=quiet)


def test_missing_tokenizer(mlm_run, tmp_path):
    ckpt = copy_run(mlm_run, tmp_path)
    (tmp_path / "run" / "tokenizer.json").unlink()
    with pytest.raises(CheckpointError, match=r"tokenizer\.json: missing"):
        export_checkpoint(ckpt, tmp_path / "out", ["safetensors"], log=quiet)


def test_unknown_format_and_unsupported_options(mlm_run, tmp_path):
    with pytest.raises(PluginError, match=r"no plugin registers an exporter named 'gguf' "
                                          r"\(known: onnx, safetensors"):
        export_checkpoint(mlm_run, tmp_path / "out", ["safetensors", "gguf"], log=quiet)
    with pytest.raises(PretextualError, match=r"--quantize int8: none of the selected formats "
                                              r"\(safetensors\) supports it \(formats that do: onnx\)"):
        export_checkpoint(mlm_run, tmp_path / "out", ["safetensors"], quantize="int8", log=quiet)
    with pytest.raises(PretextualError, match=r"with_heads=True: none of the selected formats "
                                              r"\(onnx\) writes heads \(formats that do: safetensors\)"):
        export_checkpoint(mlm_run, tmp_path / "out", ["onnx"], with_heads=True, log=quiet)
    assert not (tmp_path / "out").exists()


def test_occupied_output_directory(mlm_run, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(PretextualError, match="exists and is not empty; pass --force"):
        export_checkpoint(mlm_run, out, ["safetensors"], log=quiet)
    assert [p.name for p in out.iterdir()] == ["notes.txt"]
    export_checkpoint(mlm_run, out, ["safetensors"], force=True, log=quiet)
    assert not (out / "notes.txt").exists() and (out / "model.safetensors").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no temporary left
    with pytest.raises(PretextualError, match="holds or is inside the checkpoint being exported"):
        export_checkpoint(mlm_run, mlm_run, ["safetensors"], force=True, log=quiet)
    with pytest.raises(PretextualError, match="holds or is inside the checkpoint being exported"):
        export_checkpoint(mlm_run, checkpoint_of(mlm_run) / "export", ["safetensors"], log=quiet)


def test_an_out_that_cannot_be_created_is_one_line(mlm_run, tmp_path, capsys):
    (tmp_path / "afile").write_text("mine")
    in_the_way = f"{tmp_path / 'afile'} exists and is not a directory"
    cases = [(tmp_path / "afile" / "sub", in_the_way),
             (tmp_path / "afile" / "sub" / "deeper", in_the_way)]
    if Path("/proc/self").is_dir():  # a file system where nothing can be created
        cases.append((Path("/proc/pretextual-export"), "cannot create the export there (No such file"))
    for out, reason in cases:
        assert main(["export", str(mlm_run), "--out", str(out), "--format", "safetensors"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1, err
        assert err.startswith(f"pretextual: error: {out}: {reason}") and "choose another --out" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


def test_a_checkpoint_without_its_run_config(mlm_run, tmp_path):
    ckpt = copy_run(mlm_run, tmp_path)
    state = json.loads((ckpt / "trainer.json").read_text())
    del state["config"]
    state[META_CHECKSUM] = meta_checksum(state)  # written so, not edited afterwards
    (ckpt / "trainer.json").write_text(json.dumps(state))
    with pytest.raises(CheckpointError,
                       match=r"trainer\.json: corrupt \(no config\.data\.max_seq_length"):
        export_checkpoint(ckpt, tmp_path / "out", ["safetensors"], log=quiet)
    assert not (tmp_path / "out").exists()


def test_cli_errors_are_one_line(mlm_run, tmp_path, capsys):
    assert main(["export", str(tmp_path / "nope"), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("pretextual: error: ") and "nope" in err
    assert main(["export", str(mlm_run), "--out", str(tmp_path / "out"), "--format", "gguf"]) == 2
    assert "exporter named 'gguf'" in capsys.readouterr().err


def test_cli_export(mlm_run, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["export", str(mlm_run), "--out", str(out), "--format", "safetensors"]) == 0
    printed = capsys.readouterr().out
    assert f"exported step 3 of {checkpoint_of(mlm_run)}" in printed
    assert "hidden-state max abs diff 0.0e+00" in printed and "head mlm -> cls.predictions.*" in printed
    assert json.loads((out / "config.json").read_text())["architectures"] == ["BertForMaskedLM"]
    assert main(["export", str(mlm_run), "--out", str(out), "--format", "safetensors"]) == 2
    assert main(["export", str(mlm_run), "--out", str(out), "--format", "safetensors", "--force",
                 "--encoder-only"]) == 0
    assert "head mlm" not in capsys.readouterr().out
    assert json.loads((out / "config.json").read_text())["architectures"] == ["BertModel"]
    trained = load_file(str(checkpoint_of(mlm_run) / "model.safetensors"))
    encoder = {k[len("bert."):] for k in trained if k.startswith("bert.")}  # BertModel's names
    assert set(load_file(str(out / "model.safetensors"))) == encoder and len(encoder) == 39
