"""model.init_from: a run starting from a transformers-saved BertForMaskedLM or a pretextual
run: the first step's MLM loss equals transformers' own on the same batch, training lowers
it, heads the checkpoint lacks start fresh, and sizes that conflict are one line."""

import json

import numpy as np
import pytest
import torch
import transformers

from pretextual.cli import main
from pretextual.core.config import load_config
from pretextual.run import trainer_for
from pretextual.errors import ConfigError
from run_helpers import save_wordpiece_for_transformers, tiny_overrides


@pytest.fixture(scope="module")
def hf_mlm(corpus_file, tmp_path_factory):
    """A small BertForMaskedLM and its tokenizer, as transformers' save_pretrained writes them."""
    out = tmp_path_factory.mktemp("hf-mlm")
    fast = save_wordpiece_for_transformers(corpus_file, out)
    torch.manual_seed(3)
    config = transformers.BertConfig(vocab_size=len(fast), hidden_size=64,
                                     num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=128, max_position_embeddings=64)
    transformers.BertForMaskedLM(config).save_pretrained(out)
    return out


def _config(corpus_file, cache_dir, out, *extra, recipe="roberta", steps=5):
    return load_config(recipe, tiny_overrides(corpus_file, cache_dir, out, steps) + list(extra))


def test_the_first_loss_is_transformers_own_and_training_lowers_it(
        hf_mlm, corpus_file, cache_dir, tmp_path):
    said = []
    cfg = _config(corpus_file, cache_dir, tmp_path / "run", f"model.init_from={hf_mlm}",
                  "trainer.lr=3e-3", steps=30)
    trainer = trainer_for(cfg, log=said.append)
    assert f"init_from {hf_mlm}: encoder and head mlm loaded; the optimizer and the step start fresh" in said
    assert trainer.encoder_config.hidden_size == 64 and trainer.encoder_config.num_hidden_layers == 2
    batch = trainer.train_batches[0]
    hf = transformers.BertForMaskedLM.from_pretrained(hf_mlm).eval()
    trainer.model.eval()
    with torch.no_grad():
        _, logs = trainer.mix.loss(trainer.model, batch, 0)
        theirs = hf(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                    token_type_ids=batch["token_type_ids"], labels=batch["mlm_labels"]).loss
    assert abs(float(logs["loss/mlm"]) - float(theirs)) < 1e-5
    trainer.model.train()
    trainer.train()
    losses = [r["loss"] for r in map(json.loads, (tmp_path / "run" / "metrics.jsonl")
                                     .read_text().splitlines()) if "loss" in r]
    assert np.mean(losses[-5:]) < float(theirs) - 0.5
    # the run's tokenizer is the checkpoint's, id for id
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(hf_mlm)
    assert trainer.tokenizer.get_vocab() == hf_tokenizer.get_vocab()


def test_a_pretextual_run_loads_the_heads_it_has_and_says_which_start_fresh(
        corpus_file, cache_dir, tmp_path, capsys):
    first = tmp_path / "first"
    assert main(["train", "roberta", *tiny_overrides(corpus_file, cache_dir, first, 3)]) == 0
    capsys.readouterr()
    second = tmp_path / "second"
    assert main(["train", "bert", *tiny_overrides(corpus_file, cache_dir, second, 2),
                 f"model.init_from={first}"]) == 0
    assert (f"init_from {first}: encoder and head mlm loaded; head nsp start fresh (not in it); "
            f"the optimizer and the step start fresh") in capsys.readouterr().out
    start = json.loads((second / "checkpoints" / "step-0000002" / "trainer.json").read_text())
    assert start["step"] == 2  # its own steps, from 0


def test_a_conflicting_size_is_one_line(hf_mlm, corpus_file, cache_dir, tmp_path):
    cfg = _config(corpus_file, cache_dir, tmp_path / "run", f"model.init_from={hf_mlm}",
                  "model.hidden_size=128")
    with pytest.raises(ConfigError) as error:
        trainer_for(cfg, log=lambda *_: None)
    assert str(error.value) == (f"model.hidden_size=128: model.init_from={hf_mlm} has "
                                f"hidden_size=64; its sizes are the run's, so leave "
                                f"model.hidden_size unset")
