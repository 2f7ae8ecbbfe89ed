"""ModernBERT: the same function as transformers' ModernBertModel / ModernBertForMaskedLM
given the same weights, exported as a native transformers model (AutoModelForMaskedLM,
fill-mask), read back from a directory transformers saved, run by onnxruntime, and
trained by every built-in objective."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
import transformers

from pretextual.architectures import architecture, sized_config
from pretextual.architectures.common import allowed_keys, attention_bias
from pretextual.architectures.modernbert import rotary
from pretextual.core.config import load_config
from pretextual.core.mix import PretrainingModel
from pretextual.core.trainer import Trainer
from pretextual.objectives.mlm import MLMHead
from pretextual.run import trainer_for
from run_helpers import save_wordpiece_for_transformers, tiny_overrides

SPEC = architecture("modernbert")
WINDOW = 16  # local_attention: the test length (40) is longer than it


def tiny(vocab_size: int = 500, **fields):
    return sized_config(SPEC, "tiny", {}, {}, vocab_size=vocab_size, pad_token_id=0,
                        max_position_embeddings=128, local_attention=WINDOW, **fields)


def hf_config(config, attn: str):
    return transformers.ModernBertConfig(
        vocab_size=config.vocab_size, hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size, num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads, pad_token_id=config.pad_token_id,
        cls_token_id=2, sep_token_id=3, bos_token_id=2, eos_token_id=3,
        local_attention=config.local_attention, max_position_embeddings=config.max_position_embeddings,
        attn_implementation=attn)


def padded_batch(vocab_size: int, lengths=(40, 29, 7)) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(5, vocab_size, (len(lengths), max(lengths)), generator=torch.Generator().manual_seed(0))
    mask = (torch.arange(max(lengths))[None] < torch.tensor(lengths)[:, None]).long()
    return ids.masked_fill(mask == 0, 0), mask


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_hidden_states_and_mlm_logits_equal_transformers_with_padding_beyond_the_window(attn):
    config = tiny()
    torch.manual_seed(0)
    ours = PretrainingModel(SPEC.model(config), {"mlm": MLMHead}).eval()
    hf = transformers.ModernBertForMaskedLM(hf_config(config, attn)).eval()
    state = ours.state_dict()
    theirs = {"model." + k[len("bert."):]: v for k, v in state.items() if k.startswith("bert.")}
    theirs.update({"head.dense.weight": state["heads.mlm.transform.dense.weight"],
                   "head.norm.weight": state["heads.mlm.transform.norm.weight"],
                   "decoder.bias": state["heads.mlm.bias"],
                   "decoder.weight": state["bert.embeddings.tok_embeddings.weight"]})
    assert hf.load_state_dict(theirs, strict=True)
    ids, mask = padded_batch(config.vocab_size)
    with torch.no_grad():
        out = ours.bert(ids, mask)
        logits = ours.heads["mlm"](out.last_hidden_state)
        hf_hidden = hf.model(input_ids=ids, attention_mask=mask).last_hidden_state
        hf_logits = hf(input_ids=ids, attention_mask=mask).logits
    real = mask.bool()
    assert (out.last_hidden_state - hf_hidden)[real].abs().max() < 1e-5
    assert (logits - hf_logits)[real].abs().max() < 1e-5
    assert torch.equal(out.pooler_output, out.last_hidden_state[:, 0])  # no pooler: the [CLS] vector


def test_the_local_window_is_half_each_side():
    """A token's change reaches, in one local layer, exactly the positions within
    local_attention // 2 of it."""
    config = tiny(num_hidden_layers=2, global_attn_every_n_layers=2)  # layer 0 global, layer 1 local
    torch.manual_seed(0)
    model = SPEC.model(config).eval().double()  # a change far below the residual's survives
    layer = model.layers[1]
    assert not layer.is_global
    x = torch.randn(1, 40, config.hidden_size, dtype=torch.float64)
    rope = tuple(t.double() for t in rotary(torch.arange(40), config.hidden_size
                                            // config.num_attention_heads, config.local_rope_theta))
    mask = attention_bias(allowed_keys(None, None, WINDOW // 2, 40, x.device), x.dtype)
    changed = x.clone()
    changed[0, 20] += 1.0
    real = torch.arange(40)  # one unpadded row: every flat position is a real token
    with torch.no_grad():
        moved = (layer(changed[0], real, (1, 40), rope, mask)
                 - layer(x[0], real, (1, 40), rope, mask)).abs().amax(-1)
    reached = (moved > 0).nonzero().squeeze(1).tolist()
    assert reached == list(range(20 - WINDOW // 2, 20 + WINDOW // 2 + 1))


def test_the_parameter_count_is_the_papers_base():
    base = sized_config(SPEC, "base", {}, {}, vocab_size=50368)
    assert (base.num_hidden_layers, base.hidden_size, base.intermediate_size,
            base.num_attention_heads, base.global_attn_every_n_layers, base.local_attention) == \
        (22, 768, 1152, 12, 3, 128)
    # ModernBERT-base: 149M parameters (Warner et al. 2024, table 3), embeddings included
    assert base.num_parameters() == pytest.approx(149e6, rel=0.01)


@pytest.fixture(scope="module")
def modernbert_run(corpus_file, cache_dir, tmp_path_factory):
    """A tiny ModernBERT MLM run trained 30 steps and exported."""
    out = tmp_path_factory.mktemp("modernbert") / "run"
    cfg = load_config("roberta", tiny_overrides(corpus_file, cache_dir, out, 30)
                      + ["model.architecture=modernbert", "trainer.export=safetensors,onnx",
                         "trainer.lr=3e-3"])
    Trainer(cfg, log=lambda *a: None).train()
    return out


def test_training_lowers_the_loss_and_records_the_architecture(modernbert_run):
    losses = [r["loss"] for r in map(json.loads, (modernbert_run / "metrics.jsonl")
                                     .read_text().splitlines()) if "loss" in r]
    assert np.mean(losses[-5:]) < np.mean(losses[:3]) - 1.0
    resolved = (modernbert_run / "config.yaml").read_text()
    assert "architecture: modernbert" in resolved and "document_attention: true" in resolved


def test_the_export_is_a_transformers_modernbert(modernbert_run):
    export = modernbert_run / "export"
    config = json.loads((export / "config.json").read_text())
    assert config["model_type"] == "modernbert" and config["architectures"] == ["ModernBertForMaskedLM"]
    tokenizer = transformers.AutoTokenizer.from_pretrained(export)
    assert type(transformers.AutoModel.from_pretrained(export)).__name__ == "ModernBertModel"
    hf = transformers.AutoModelForMaskedLM.from_pretrained(export, attn_implementation="sdpa").eval()
    assert type(hf).__name__ == "ModernBertForMaskedLM"
    from pretextual.exporters.load import from_pretrained
    ours = from_pretrained(export)
    head = MLMHead(ours.encoder)
    head.load_state_dict(ours.heads["mlm"])
    enc = tokenizer(["the ship sees the tide near the dock.", "a bell."], padding=True,
                    return_tensors="pt")
    with torch.no_grad():
        logits = head(ours.encoder(enc["input_ids"], enc["attention_mask"]).last_hidden_state)
        theirs = hf(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"]).logits
    real = enc["attention_mask"].bool()
    assert (logits - theirs)[real].abs().max() < 1e-5
    fill = transformers.pipeline("fill-mask", model=hf, tokenizer=tokenizer)
    guesses = fill(f"the ship sees the {tokenizer.mask_token}.")
    assert len(guesses) == 5 and sum(g["score"] for g in guesses) <= 1.0 + 1e-6


def test_onnxruntime_matches_torch_beyond_the_local_window(tmp_path):
    pytest.importorskip("onnxruntime")
    from pretextual.exporters.onnx import export_onnx
    from pretextual.exporters.onnx_runtime import ONNX_FILE, cpu_session
    from pretextual.plugins.api import ExportedModel, ExportOptions
    config = tiny()
    torch.manual_seed(1)
    encoder = SPEC.model(config).eval()
    model = ExportedModel(encoder=encoder, heads={}, tokenizer=None, metadata={}, max_seq_length=128)
    summary = export_onnx(model, tmp_path, ExportOptions())
    assert "2x25 with padding" in " ".join(summary.lines)  # the exporter's own check beyond the window
    session = cpu_session(tmp_path / ONNX_FILE)
    ids, mask = padded_batch(config.vocab_size, lengths=(37, 21, 30, 3))  # a shape no test uses
    feed = {"input_ids": ids.numpy(), "attention_mask": mask.numpy(),
            "token_type_ids": np.zeros_like(ids.numpy())}
    hidden, pooled = session.run(["last_hidden_state", "pooler_output"], feed)
    with torch.no_grad():
        expected = encoder(ids, mask).last_hidden_state.numpy()
    real = mask.numpy().astype(bool)
    assert np.abs(hidden - expected)[real].max() < 1e-4
    assert np.abs(pooled - expected[:, 0]).max() < 1e-4


@pytest.fixture(scope="module")
def hf_modernbert(corpus_file, tmp_path_factory):
    """A small ModernBertForMaskedLM and a WordPiece tokenizer, as transformers saves them."""
    out = tmp_path_factory.mktemp("hf-modernbert")
    fast = save_wordpiece_for_transformers(corpus_file, out)
    torch.manual_seed(3)
    config = transformers.ModernBertConfig(
        vocab_size=len(fast), hidden_size=64, intermediate_size=96,
        num_hidden_layers=3, num_attention_heads=4, local_attention=16, max_position_embeddings=64,
        pad_token_id=fast.pad_token_id, cls_token_id=fast.cls_token_id, sep_token_id=fast.sep_token_id,
        bos_token_id=fast.cls_token_id, eos_token_id=fast.sep_token_id)
    transformers.ModernBertForMaskedLM(config).save_pretrained(out)
    return out


def test_continued_pretraining_from_a_directory_transformers_saved(
        hf_modernbert, corpus_file, cache_dir, tmp_path):
    said = []
    cfg = load_config("roberta", tiny_overrides(corpus_file, cache_dir, tmp_path / "run", 20)
                      + [f"model.init_from={hf_modernbert}", "trainer.lr=3e-3"])
    trainer = trainer_for(cfg, log=said.append)
    assert f"init_from {hf_modernbert}: encoder and head mlm loaded; the optimizer and the step start fresh" in said
    assert trainer.encoder_config.architecture == "modernbert"
    assert (trainer.encoder_config.hidden_size, trainer.encoder_config.local_attention) == (64, 16)
    hf = transformers.ModernBertForMaskedLM.from_pretrained(hf_modernbert,
                                                            attn_implementation="sdpa").eval()
    trainer.model.eval()
    cfg.data.document_attention = False  # transformers has no document mask to compare with
    batch = {k: v for k, v in trainer.train_batches[0].items() if k != "document_ids"}
    with torch.no_grad():
        _, logs = trainer.mix.loss(trainer.model, batch, 0)
        theirs = hf(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                    labels=batch["mlm_labels"]).loss
    assert abs(float(logs["loss/mlm"]) - float(theirs)) < 1e-5
    assert float(theirs) == pytest.approx(math.log(300), abs=0.5)  # untrained: near uniform


@pytest.mark.parametrize("recipe", ["bert", "albert", "spanbert"])  # mlm+nsp, wwm+sop, span
def test_every_built_in_objective_trains_a_modernbert(recipe, tiny_config):
    cfg = tiny_config(recipe, "model.architecture=modernbert", steps=4)
    trainer = Trainer(cfg, log=lambda *a: None)
    trainer.train()
    rows = [json.loads(line) for line in (trainer.out / "metrics.jsonl").read_text().splitlines()]
    losses = [r for r in rows if "loss" in r]
    assert losses and all(math.isfinite(r["loss"]) for r in losses)
    for name in cfg.objectives:
        assert any(f"loss/{name}" in r for r in losses), name
