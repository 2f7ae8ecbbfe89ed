"""pretextual loads its own exports back, heads included, without pickle; heads with no
Hugging Face counterpart keep their own names."""

from __future__ import annotations

import json
import pickle
import shutil

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from export_helpers import TEXTS_B, copy_run, padded_batch, reference_model, reseal, run_tokenizer
from pretextual.errors import CheckpointError
from pretextual.exporters import export_checkpoint, from_pretrained
from pretextual.objectives.mlm import MLMHead


def quiet(*_):
    pass


def test_encoder_export_loads_back_exactly(encoder_export, mlm_run):
    loaded = from_pretrained(encoder_export)
    expected = reference_model(mlm_run).bert.state_dict()
    assert loaded.encoder.state_dict().keys() == expected.keys()
    assert all(torch.equal(v, expected[k]) for k, v in loaded.encoder.state_dict().items())
    assert loaded.heads == {} and loaded.metadata["heads"] == ""
    assert loaded.metadata["step"] == "3" and loaded.metadata["objectives"] == "mlm"
    assert loaded.tokenizer.encode("Boat").ids[0] == loaded.tokenizer.token_to_id("[CLS]")
    assert loaded.max_seq_length == 32  # the trained length (tiny_overrides), not the position table
    assert list(loaded.metadata) == sorted(loaded.metadata)  # the same order every load


@pytest.mark.parametrize("written, expected", [(None, 512), (int(1e30), 512), (True, 512), (16, 16)])
def test_trained_length_falls_back_to_the_position_table(encoder_export, tmp_path, written, expected):
    # A Hugging Face directory may hold no model_max_length, or transformers' "unknown" sentinel.
    copy = tmp_path / "hf"
    shutil.copytree(encoder_export, copy)
    config = json.loads((copy / "tokenizer_config.json").read_text())
    config.pop("model_max_length")
    if written is not None:
        config["model_max_length"] = written
    (copy / "tokenizer_config.json").write_text(json.dumps(config))
    assert json.loads((copy / "config.json").read_text())["max_position_embeddings"] == 512
    assert from_pretrained(copy).max_seq_length == expected
    (copy / "tokenizer_config.json").unlink()
    assert from_pretrained(copy).max_seq_length == 512


def test_heads_load_back_and_give_the_same_logits(full_export, mlm_run):
    out, _ = full_export
    loaded = from_pretrained(out)
    ours = reference_model(mlm_run)
    assert loaded.heads.keys() == {"mlm"}
    head = MLMHead(loaded.encoder)
    head.load_state_dict(loaded.heads["mlm"], strict=True)
    batch = padded_batch(run_tokenizer(mlm_run), TEXTS_B, 0)
    with torch.no_grad():
        got = head(loaded.encoder(**batch).last_hidden_state)
        expected = ours.heads["mlm"](ours.bert(**batch).last_hidden_state)
    assert torch.equal(got, expected)


def test_sop_head_keeps_its_name(sop_run, tmp_path):
    out = tmp_path / "export"
    report = export_checkpoint(sop_run, out, ["safetensors"], with_heads=True, log=quiet)
    assert report.summaries["safetensors"].files == ["model.safetensors", "pretextual_heads.safetensors"]
    assert json.loads((out / "config.json").read_text())["architectures"] == ["BertForMaskedLM"]
    with safe_open(str(out / "pretextual_heads.safetensors"), "pt") as f:
        assert set(f.keys()) == {"sop.weight", "sop.bias"}
        assert f.metadata()["heads"] == "sop" and f.metadata()["objectives"] == "wwm,sop"
    loaded = from_pretrained(out)
    expected = reference_model(sop_run).heads
    assert loaded.heads.keys() == {"mlm", "sop"} and loaded.metadata["heads"] == "mlm,sop"
    for name in ("mlm", "sop"):
        assert all(torch.equal(v, expected[name].state_dict()[k]) for k, v in loaded.heads[name].items())


def test_third_party_and_misshapen_heads_keep_their_names(mlm_run, tmp_path):
    ckpt = copy_run(mlm_run, tmp_path)
    tensors = load_file(str(ckpt / "model.safetensors"))
    tensors["heads.probe.proj.weight"] = torch.randn(4, 128)
    tensors["heads.nsp.weight"] = torch.randn(3, 128)  # named as NSP but 3-way: no HF counterpart
    save_file(tensors, str(ckpt / "model.safetensors"))
    reseal(ckpt)
    out = tmp_path / "export"
    lines = export_checkpoint(ckpt, out, ["safetensors"], with_heads=True, log=quiet).lines()
    assert "    head probe -> pretextual_heads.safetensors (probe.*, no Hugging Face counterpart)" in lines
    loaded = from_pretrained(out)
    assert torch.equal(loaded.heads["probe"]["proj.weight"], tensors["heads.probe.proj.weight"])
    assert torch.equal(loaded.heads["nsp"]["weight"], tensors["heads.nsp.weight"])
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        assert not any(k.startswith("cls.seq_relationship") for k in f.keys())


def test_no_pickle_anywhere(mlm_run, tmp_path, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("pickle used")

    for target, name in ((torch, "load"), (pickle, "load"), (pickle, "loads")):
        monkeypatch.setattr(target, name, refuse)
    out = tmp_path / "export"
    export_checkpoint(mlm_run, out, ["safetensors"], with_heads=True, log=quiet)
    from_pretrained(out)
    transformers = pytest.importorskip("transformers")
    transformers.AutoModel.from_pretrained(out)
    assert not [p for p in out.iterdir() if p.suffix in (".bin", ".pt", ".pkl", ".pth")]


def test_not_an_export(encoder_export, tmp_path):
    with pytest.raises(CheckpointError, match=r"config\.json: missing"):
        from_pretrained(tmp_path)
    bad = tmp_path / "bad"
    shutil.copytree(encoder_export, bad)
    config = json.loads((bad / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps({**config, "model_type": "roberta"}))
    with pytest.raises(CheckpointError, match=r"config\.json: not a BERT or ModernBERT config"):
        from_pretrained(bad)
    (bad / "config.json").write_text(json.dumps({**config, "hidden_size": 64}))
    with pytest.raises(CheckpointError, match=r"model\.safetensors: does not fit the encoder"):
        from_pretrained(bad)
