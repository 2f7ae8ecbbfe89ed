"""The safetensors export through Hugging Face transformers: loads with no missing encoder
weight, same hidden states, same tokens, heads under Hugging Face's names, fine-tunes."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

from export_helpers import TEXTS_A, TEXTS_B, padded_batch, reference_model, run_tokenizer

pytest.importorskip("transformers")
from transformers import (AutoModel, AutoModelForMaskedLM,  # noqa: E402
                          AutoModelForNextSentencePrediction, AutoModelForPreTraining,
                          AutoModelForSequenceClassification, AutoTokenizer, pipeline)

HIDDEN_TOLERANCE = 1e-5
HEADS_TOLERANCE = 1e-4  # logits over the vocabulary are larger numbers than hidden states



def real_diff(a: torch.Tensor, b: torch.Tensor, batch) -> torch.Tensor:
    """Max abs difference of per-token outputs at the real tokens (padding positions are
    meaningless: transformers computes them, pretextual's unpadded encoder leaves zeros)."""
    return (a - b)[batch["attention_mask"].bool()].abs().max()

def batches(run_dir):
    """The two padded test batches (singles and pairs), shapes [3, n] and [5, m]."""
    pad = reference_model(run_dir).bert.config.pad_token_id
    return [padded_batch(run_tokenizer(run_dir), texts, pad) for texts in (TEXTS_A, TEXTS_B)]


def test_layout_and_metadata(encoder_export, mlm_run):
    config = json.loads((encoder_export / "config.json").read_text())
    assert config["model_type"] == "bert" and config["architectures"] == ["BertModel"]
    assert config["hidden_size"] == 128 and config["num_hidden_layers"] == 2
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "model.safetensors",
                 "export.json"):
        assert (encoder_export / name).is_file(), name
    with safe_open(str(encoder_export / "model.safetensors"), "pt") as f:
        keys, metadata = set(f.keys()), f.metadata()
    assert keys == set(reference_model(mlm_run).bert.state_dict())
    assert metadata["format"] == "pt" and metadata["step"] == "3"
    assert metadata["objectives"] == "mlm" and metadata["pretextual_version"]
    assert all(isinstance(v, str) for v in metadata.values())


def test_autotokenizer_encodes_as_pretextual(encoder_export, mlm_run):
    theirs = AutoTokenizer.from_pretrained(encoder_export)
    ours = run_tokenizer(mlm_run)
    cls, sep = ours.token_to_id("[CLS]"), ours.token_to_id("[SEP]")
    a, b = "The Boat sees the river bank.", "A guard follows the king."
    ids_a, ids_b = ours.encode(a, add_special_tokens=False).ids, ours.encode(b, add_special_tokens=False).ids
    assert theirs(a)["input_ids"] == [cls, *ids_a, sep]
    pair = theirs(a, b)
    assert pair["input_ids"] == [cls, *ids_a, sep, *ids_b, sep]
    assert pair["token_type_ids"] == [0] * (len(ids_a) + 2) + [1] * (len(ids_b) + 1)
    assert theirs.pad_token_id == 0 and theirs.mask_token == "[MASK]"


def test_tokenizer_max_length_is_the_trained_sequence_length(encoder_export):
    # tiny_overrides trains on data.max_seq_length=32; the position table is longer
    assert json.loads((encoder_export / "config.json").read_text())["max_position_embeddings"] > 32
    assert json.loads((encoder_export / "tokenizer_config.json").read_text())["model_max_length"] == 32
    theirs = AutoTokenizer.from_pretrained(encoder_export)
    long_text = " ".join(["The boat sees the river bank."] * 20)
    assert len(theirs(long_text)["input_ids"]) > 32
    ids = theirs(long_text, truncation=True)["input_ids"]
    assert len(ids) == 32 and ids[-1] == theirs.sep_token_id


def test_automodel_loads_every_encoder_weight_and_matches(encoder_export, mlm_run):
    model, info = AutoModel.from_pretrained(encoder_export, output_loading_info=True)
    assert info["missing_keys"] == set() and info["unexpected_keys"] == set()
    ours = reference_model(mlm_run).bert
    shapes = set()
    for batch in batches(mlm_run):
        assert (batch["attention_mask"] == 0).any() and (batch["token_type_ids"] == 1).any()
        shapes.add(tuple(batch["input_ids"].shape))
        with torch.no_grad():
            theirs, expected = model(**batch), ours(**batch)
        assert real_diff(theirs.last_hidden_state, expected.last_hidden_state, batch) <= HIDDEN_TOLERANCE
        assert (theirs.pooler_output - expected.pooler_output).abs().max() <= HIDDEN_TOLERANCE
    assert len(shapes) == 2


def test_sequence_classification_loads_encoder_and_fine_tunes(encoder_export):
    model, info = AutoModelForSequenceClassification.from_pretrained(
        encoder_export, num_labels=2, output_loading_info=True)
    assert info["missing_keys"] == {"classifier.weight", "classifier.bias"}  # the new head only
    tokenizer = AutoTokenizer.from_pretrained(encoder_export)
    river = "water boat fish bank stream bridge current shore".split()
    castle = "tower wall gate king guard moat stone knight".split()
    texts = [" ".join(words[i:] + words[:i]) for words in (river, castle) for i in range(8)]
    labels = torch.tensor([0] * 8 + [1] * 8)
    batch = tokenizer(texts, padding=True, return_tensors="pt")
    torch.manual_seed(0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model.train()
    losses = []
    for _ in range(12):
        loss = model(**batch, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0], losses


def test_default_export_mlm_logits_and_fill_mask(full_export, mlm_run):
    out, _ = full_export
    assert json.loads((out / "config.json").read_text())["architectures"] == ["BertForMaskedLM"]
    ours = reference_model(mlm_run)
    masked_lm, info = AutoModelForMaskedLM.from_pretrained(out, output_loading_info=True)
    assert info["missing_keys"] == set()
    pretraining, info = AutoModelForPreTraining.from_pretrained(out, output_loading_info=True)
    assert info["missing_keys"] == {"cls.seq_relationship.weight", "cls.seq_relationship.bias"}  # no NSP
    for batch in batches(mlm_run):
        with torch.no_grad():
            expected = ours.heads["mlm"](ours.bert(**batch).last_hidden_state)
            assert real_diff(masked_lm(**batch).logits, expected, batch) <= HEADS_TOLERANCE
            assert real_diff(pretraining(**batch).prediction_logits, expected, batch) <= HEADS_TOLERANCE

    fill = pipeline("fill-mask", model=str(out), top_k=3)
    tokenizer = run_tokenizer(mlm_run)
    batch = padded_batch(tokenizer, ["The boat sees the [MASK] bank."], 0)
    where = batch["input_ids"][0].tolist().index(tokenizer.token_to_id("[MASK]"))
    with torch.no_grad():
        logits = ours.heads["mlm"](ours.bert(**batch).last_hidden_state)[0, where]
    assert [r["token"] for r in fill("The boat sees the [MASK] bank.")] == logits.topk(3).indices.tolist()


def exported_with_heads(run_dir, out, auto_class, architecture):
    """The run exported (with its heads, by default), loaded by ``auto_class`` with every
    key matched."""
    from pretextual.exporters.export import export_checkpoint
    export_checkpoint(run_dir, out, ["safetensors"], log=lambda *a: None)
    assert json.loads((out / "config.json").read_text())["architectures"] == [architecture]
    model, info = auto_class.from_pretrained(out, output_loading_info=True)
    assert info["missing_keys"] == set() and info["unexpected_keys"] == set()
    return model


def test_nsp_becomes_seq_relationship(nsp_run, tmp_path):
    out = tmp_path / "export"
    model = exported_with_heads(nsp_run, out, AutoModelForPreTraining, "BertForPreTraining")
    ours = reference_model(nsp_run)
    for batch in batches(nsp_run):
        with torch.no_grad():
            theirs, encoded = model(**batch), ours.bert(**batch)
            nsp = ours.heads["nsp"](encoded.pooler_output)
            mlm = ours.heads["mlm"](encoded.last_hidden_state)
        assert (theirs.seq_relationship_logits - nsp).abs().max() <= HIDDEN_TOLERANCE
        assert real_diff(theirs.prediction_logits, mlm, batch) <= HEADS_TOLERANCE
    assert not (out / "pretextual_heads.safetensors").exists()


def test_the_export_at_the_end_of_training_holds_the_trained_mlm_head(corpus_file, cache_dir,
                                                                      tmp_path):
    from pretextual.core.config import load_config
    from pretextual.core.trainer import Trainer
    from run_helpers import tiny_overrides
    run = tmp_path / "run"
    Trainer(load_config("roberta", tiny_overrides(corpus_file, cache_dir, run, 3)
                        + ["trainer.export=safetensors"]), log=lambda *a: None).train()
    export = run / "export"
    assert json.loads((export / "config.json").read_text())["architectures"] == ["BertForMaskedLM"]
    masked_lm, info = AutoModelForMaskedLM.from_pretrained(export, output_loading_info=True)
    assert info["missing_keys"] == set() and info["mismatched_keys"] == set()
    encoder, info = AutoModel.from_pretrained(export, output_loading_info=True)
    assert info["missing_keys"] == set()  # the heads are there, and ignored
    ours = reference_model(run)
    for batch in batches(run):
        with torch.no_grad():
            hidden = ours.bert(**batch).last_hidden_state
            expected = ours.heads["mlm"](hidden)
            assert real_diff(masked_lm(**batch).logits, expected, batch) <= HIDDEN_TOLERANCE
            assert real_diff(encoder(**batch).last_hidden_state, hidden, batch) <= HIDDEN_TOLERANCE


def test_an_nsp_only_export_is_bert_for_next_sentence_prediction(corpus_file, cache_dir, tmp_path):
    from pretextual.core.config import load_config
    from pretextual.core.trainer import Trainer
    from run_helpers import tiny_overrides
    run = tmp_path / "run"
    Trainer(load_config("bert", tiny_overrides(corpus_file, cache_dir, run, 3) + ["~objectives.mlm"]),
            log=lambda *a: None).train()
    model = exported_with_heads(run, tmp_path / "export", AutoModelForNextSentencePrediction,
                                "BertForNextSentencePrediction")
    ours = reference_model(run)
    for batch in batches(run):
        with torch.no_grad():
            nsp = ours.heads["nsp"](ours.bert(**batch).pooler_output)
            assert (model(**batch).logits - nsp).abs().max() <= HIDDEN_TOLERANCE


def test_a_model_saved_by_transformers_bert_for_masked_lm_loads_into_pretextual(encoder_export,
                                                                                  mlm_run, tmp_path):
    from pretextual.exporters import from_pretrained
    from pretextual.objectives.mlm import MLMHead
    torch.manual_seed(0)  # the MLM head transformers adds is new: any seed will do
    theirs = AutoModelForMaskedLM.from_pretrained(encoder_export).eval()
    saved = tmp_path / "hf-mlm"
    theirs.save_pretrained(saved)
    AutoTokenizer.from_pretrained(encoder_export).save_pretrained(saved)
    with safe_open(str(saved / "model.safetensors"), "pt") as f:
        assert not any(".pooler." in k for k in f.keys())  # what BertForMaskedLM saves
    with pytest.warns(UserWarning, match=r"model\.safetensors: has no pooler \(saved from "
                                         r"BertForMaskedLM\?\); the pooler is newly initialized"):
        loaded = from_pretrained(saved)
    assert loaded.heads.keys() == {"mlm"}
    head = MLMHead(loaded.encoder)
    head.load_state_dict(loaded.heads["mlm"], strict=True)
    for batch in batches(mlm_run):
        with torch.no_grad():
            expected = theirs(**batch, output_hidden_states=True)
            ours = loaded.encoder(**batch)
            logits = head(ours.last_hidden_state)
        assert real_diff(ours.last_hidden_state, expected.hidden_states[-1], batch) <= HIDDEN_TOLERANCE
        assert real_diff(logits, expected.logits, batch) <= HEADS_TOLERANCE
    text = "The boat sees the river bank."
    assert loaded.tokenizer.encode(text).ids == from_pretrained(encoder_export).tokenizer.encode(text).ids
