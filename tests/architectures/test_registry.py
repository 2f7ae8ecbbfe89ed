"""model.architecture: encoders registered by name through the plugin hook, the built-in
ones and a plugin's, and the one-line errors a user can cause."""

from __future__ import annotations

import json

import pytest

from pretextual.architectures import architecture
from pretextual.core.config import load_config
from pretextual.core.trainer import Trainer
from pretextual.errors import CheckpointError, ConfigError
from run_helpers import tiny_overrides

PLUGIN = '''
import dataclasses
from typing import ClassVar

import pretextual
from pretextual.architectures.bert import BertConfig, BertModel, PRESET_FIELDS


@dataclasses.dataclass
class NarrowConfig(BertConfig):
    architecture: ClassVar[str] = "narrow-bert"


@pretextual.hookimpl
def pretextual_register_architectures(register):
    register(pretextual.ArchitectureSpec(
        name="narrow-bert", config=NarrowConfig, model=BertModel,
        presets={"micro": dict(PRESET_FIELDS["tiny"], hidden_size=32, intermediate_size=64)},
        intermediate_ratio=2.0, dropouts={"hidden_dropout_prob": ("hidden_dropout_prob",),
        "attention_probs_dropout_prob": ("attention_probs_dropout_prob",)}))
'''


def test_the_built_in_architectures_are_registered_by_name():
    bert, modernbert = architecture("bert"), architecture("modernbert")
    assert set(bert.presets) == set(modernbert.presets) == {"tiny", "mini", "small", "medium",
                                                            "base", "large"}
    assert (bert.document_attention, modernbert.document_attention) == (False, True)
    assert "pooler" in bert.pooled and "[CLS]" in modernbert.pooled


def test_an_unknown_architecture_or_preset_is_one_line(corpus_file, cache_dir, tmp_path):
    base = tiny_overrides(corpus_file, cache_dir, tmp_path / "run")
    with pytest.raises(ConfigError, match=r"^model\.architecture: no plugin registers an "
                                          r"architecture named 'gpt' \(known: bert, modernbert\)$"):
        load_config("roberta", base + ["model.architecture=gpt"])
    with pytest.raises(ConfigError, match=r"^model\.preset: modernbert has no preset 'huge'"):
        load_config("roberta", base + ["model.architecture=modernbert", "model.preset=huge"])


def test_a_plugins_architecture_trains(corpus_file, cache_dir, tmp_path, monkeypatch):
    (tmp_path / "narrow_arch.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = load_config("roberta", tiny_overrides(corpus_file, cache_dir, tmp_path / "run", 3)
                      + ["plugins.modules=[narrow_arch]", "model.architecture=narrow-bert",
                         "model.preset=micro"])
    trainer = Trainer(cfg, log=lambda *a: None)
    assert trainer.encoder_config.hidden_size == 32 and type(trainer.encoder_config).__name__ == "NarrowConfig"
    trainer.train()
    meta = json.loads(next((tmp_path / "run" / "checkpoints").iterdir()).joinpath("trainer.json").read_text())
    assert meta["architecture"] == "narrow-bert"


def test_a_hidden_size_set_alone_brings_the_architectures_intermediate_size(tiny_config):
    bert = Trainer(tiny_config("roberta", "model.hidden_size=64"), log=lambda *a: None)
    modern = Trainer(tiny_config("roberta", "model.architecture=modernbert", "model.hidden_size=64"),
                     log=lambda *a: None)
    assert (bert.encoder_config.intermediate_size, modern.encoder_config.intermediate_size) == (256, 96)
    # dropouts unset: each architecture's own; set: in the fields that architecture takes them
    assert (bert.encoder_config.hidden_dropout_prob, modern.encoder_config.mlp_dropout) == (0.1, 0.0)
    modern = Trainer(tiny_config("roberta", "model.architecture=modernbert",
                                 "model.hidden_dropout_prob=0.05"), log=lambda *a: None)
    assert (modern.encoder_config.embedding_dropout, modern.encoder_config.mlp_dropout) == (0.05, 0.05)


def test_resuming_with_another_architecture_is_refused(tiny_config, tmp_path):
    Trainer(tiny_config("roberta", steps=2), log=lambda *a: None).train()
    cfg = tiny_config("roberta", "model.architecture=modernbert", steps=4)
    with pytest.raises(CheckpointError, match=r"was written for model\.architecture=bert, not modernbert"):
        Trainer(cfg, log=lambda *a: None, resume=True).train()
