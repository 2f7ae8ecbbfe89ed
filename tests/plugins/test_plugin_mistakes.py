"""The mistakes a plugin author makes in an objective are one line naming the objective
(PluginError), found before the first step where they can be, never a deep traceback; a head
tied to the encoder in the usual PyTorch way checkpoints, resumes and exports."""

from __future__ import annotations

import shutil
from dataclasses import dataclass

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import pretextual
from pretextual.core.checkpoint import open_checkpoint
from pretextual.core.config import load_config
from pretextual.core.mix import check_objectives
from pretextual.core.trainer import Trainer
from pretextual.errors import ConfigError, PluginError
from pretextual.exporters import export_checkpoint, from_pretrained
from pretextual.plugins.manager import Plugins

from run_helpers import final_weights


class FirstTokenHead(nn.Module):
    """Predicts from [CLS] whether the sequence is longer than half the batch's width."""

    def __init__(self, encoder):
        super().__init__()
        self.dense = nn.Linear(encoder.config.hidden_size, 2)

    def forward(self, hidden):
        return self.dense(hidden[:, 0])


class TiedHead(nn.Module):
    """A decoder tied to the word embeddings as PyTorch code usually ties it."""

    def __init__(self, encoder):
        super().__init__()
        self.decoder = nn.Linear(encoder.config.hidden_size, encoder.config.vocab_size, bias=False)
        self.decoder.weight = encoder.embeddings.word_embeddings.weight

    def forward(self, hidden):
        return self.decoder(hidden[:, 0])


def long_or_short(inputs):
    logits = inputs.heads["lengthy"](inputs.encoder_output.last_hidden_state)
    mask = inputs.batch["attention_mask"]
    labels = (mask.sum(1) > mask.shape[1] // 2).long()
    return pretextual.ObjectiveOutput(loss=F.cross_entropy(logits, labels))


def objective_plugin(loss=long_or_short, heads=None, transform=None, build=None, options=None,
                     name="lengthy", twice=False, provides=None):
    """An in-process plugin registering one objective, with one part swapped for a mistake."""
    if provides is None:
        provides = ("batch_transform",) if transform else ()

    def make(opts, context):
        return pretextual.Objective(loss=loss, heads=heads or {"lengthy": FirstTokenHead},
                                    batch_transform=transform)

    class Plugin:
        @pretextual.hookimpl
        def pretextual_register_objectives(self, register):
            for _ in range(2 if twice else 1):
                register(pretextual.ObjectiveSpec(name=name, build=build or make, options=options,
                                                  provides=provides))

    plugins = Plugins(strict=True)
    plugins.register(Plugin(), name="lengthy-plugin", package="pretextual-lengthy", version="0.1")
    return plugins


def run(tiny_config, plugins, *overrides, steps=2):
    return Trainer(tiny_config("roberta", "objectives.lengthy.weight=1", *overrides, steps=steps),
                   plugins, log=lambda *_: None).train()


def output(**fields):
    """A loss function returning what ``fields`` make of the correct output."""
    def loss(inputs):
        right = long_or_short(inputs)
        made = fields["make"](right.loss)
        return made if fields.get("bare") else pretextual.ObjectiveOutput(
            loss=made, metrics=fields.get("metrics", {}))
    return loss


@pytest.mark.parametrize("loss, message", [
    (output(make=lambda l: l.repeat(8)),
     r"^objectives\.lengthy: loss\(\)'s loss must be a 0-dim floating-point tensor \(a mean\), got "
     r"a torch\.float32 tensor of shape \[8\]$"),
    (output(make=lambda l: float(l.detach())), r"loss\(\)'s loss must be a 0-dim floating-point tensor \(a mean\), got float$"),
    (output(make=lambda l: l, bare=True),
     r"^objectives\.lengthy: loss\(\) must return a pretextual\.ObjectiveOutput, got Tensor$"),
    (output(make=lambda l: l.detach()),
     r"loss\(\)'s loss does not depend on any parameter \(detached, or a constant\)"),
    (output(make=lambda l: l, metrics={"per": torch.ones(8)}),
     r"loss\(\)'s metrics\['per'\] must be a number or a one-element tensor, got shape \[8\]$"),
    (output(make=lambda l: 1 / 0), r"^objectives\.lengthy: loss\(\) raised ZeroDivisionError: division "
                                   r"by zero \(at test_plugin_mistakes\.py:\d+\)$"),
])
def test_a_loss_that_is_not_a_scalar_term_names_the_objective(tiny_config, loss, message):
    with pytest.raises(PluginError, match=message):
        run(tiny_config, objective_plugin(loss=loss))


def drop(key):
    def transform(batch, generator):
        return {k: v for k, v in batch.items() if k != key}
    return transform


def forget_return(batch, generator):
    batch["input_ids"][:, 1] = 0


def float_ids(batch, generator):
    return {**batch, "input_ids": batch["input_ids"].float()}


def raises(batch, generator):
    raise ValueError("no such token")


@pytest.mark.parametrize("transform, message", [
    (drop("attention_mask"), r"batch_transform returned a batch without 'attention_mask'$"),
    (forget_return, r"batch_transform must return the batch \(a dict of tensors\), got NoneType$"),
    (float_ids, r"batch_transform returned 'input_ids' as a torch\.float32 tensor of shape \[8, \d+\]; "
                r"the encoder takes integers of the batch's shape \[8, \d+\]$"),
    (raises, r"batch_transform raised ValueError: no such token \(at test_plugin_mistakes\.py:\d+\)$"),
])
def test_a_batch_transform_that_breaks_the_batch_fails_before_the_first_step(tiny_config, transform,
                                                                             message):
    cfg = tiny_config("bert", "~objectives.mlm", "objectives.lengthy.weight=1")  # mlm has the transform
    with pytest.raises(PluginError, match=r"^objectives\.lengthy: " + message):
        Trainer(cfg, objective_plugin(transform=transform), log=lambda *_: None)


@pytest.mark.parametrize("mistake, message", [
    (dict(heads={"lengthy": lambda encoder: "not a module"}),
     r"^head 'lengthy': its factory returned str, not an nn\.Module$"),
    (dict(heads={"lengthy": nn.Linear(4, 2)}),
     r"^objectives\.lengthy: heads\['lengthy'\] must be a factory \(a class or function taking "
     r"the encoder\), got Linear$"),
    (dict(heads={"my.head": FirstTokenHead}),
     r"^objectives\.lengthy: head name 'my\.head' is not a state-dict key"),
    (dict(build=lambda options, context: None),
     r"^objectives\.lengthy: build\(\) must return a pretextual\.Objective, got NoneType$"),
    (dict(build=lambda options, context: int("x")),
     r"^objectives\.lengthy: build\(\) raised ValueError: invalid literal"),
])
def test_heads_and_build_mistakes_are_one_line(tiny_config, mistake, message):
    with pytest.raises(PluginError, match=message):
        run(tiny_config, objective_plugin(**mistake))


@dataclass
class ShadowingOptions:
    weight: float = 3.0  # the core's key: the plugin could never receive its own value


@dataclass
class CheckedOptions:
    size: int = 3

    def check(self, name):
        if self.size > 2:
            raise ValueError("size must be at most 2")


@pytest.mark.parametrize("mistake, message", [
    (dict(name="my.obj"), r"objective name 'my\.obj' is not a config key"),
    (dict(options=ShadowingOptions), r"objective 'lengthy': its options field 'weight' is a key "
                                     r"the core sets for every objective"),
    (dict(options=dict), r"objective 'lengthy': options must be a dataclass"),
    (dict(provides="batch_transform"), r"objective 'lengthy': provides must be a collection of "
                                       r"'example_builder', 'batch_transform'"),
    (dict(provides=("masker",)), r"objective 'lengthy': provides must be a collection of"),
    (dict(twice=True), r"^objective 'lengthy' is registered twice by plugin 'lengthy-plugin' "
                       r"\(package pretextual-lengthy 0\.1\): give each registration its own name$"),
])
def test_a_spec_no_run_could_use_is_refused_when_registered(mistake, message):
    with pytest.raises(PluginError, match=message):
        objective_plugin(**mistake)


def keep(batch, generator):
    return batch


@pytest.mark.parametrize("declared, transform, message", [
    ((), keep, r"^objectives\.lengthy: build\(\) returned a batch_transform, but its ObjectiveSpec "
               r"does not declare it; add provides=\('batch_transform',\)"),
    (("example_builder",), None, r"^objectives\.lengthy: its ObjectiveSpec declares provides "
                                 r"'example_builder', but build\(\) returned no example_builder$"),
    (lambda options: "example_builder", None, r"^objectives\.lengthy: provides must be a collection "
                                              r"of 'example_builder', 'batch_transform', got "
                                              r"'example_builder'$"),
])
def test_parts_built_must_be_the_parts_declared(tiny_config, declared, transform, message):
    with pytest.raises(PluginError, match=message):
        run(tiny_config, objective_plugin(transform=transform, provides=declared))


def test_a_declared_part_conflicts_before_anything_is_built():
    built = []
    plugins = objective_plugin(build=lambda options, context: built.append(1),
                               provides=lambda options: ("batch_transform",))
    cfg = load_config("roberta", ["objectives.lengthy.weight=1"])
    with pytest.raises(ConfigError, match=r"^objectives: mlm and lengthy conflict: both corrupt the "
                                          r"batch .* drop one \(e\.g\. ~objectives\.lengthy\)$"):
        check_objectives(cfg.objectives, plugins)
    assert built == []


def test_an_options_check_that_raises_is_one_line():
    plugins = objective_plugin(options=CheckedOptions)
    cfg = load_config("roberta", ["objectives.lengthy.weight=1"])
    with pytest.raises(PluginError, match=r"^objectives\.lengthy: the options' check\(\) raised "
                                          r"ValueError: size must be at most 2 \(at "
                                          r"test_plugin_mistakes\.py:\d+\)$"):
        check_objectives(cfg.objectives, plugins)


def test_a_transform_failing_in_a_dataloader_worker_is_still_one_line(tiny_config):
    fails_later = lambda batch, generator: raises(batch, generator) if batch["input_ids"][0, 1] % 2 \
        else batch
    cfg = tiny_config("bert", "~objectives.mlm", "objectives.lengthy.weight=1", "data.num_workers=1",
                      steps=40)
    with pytest.raises(PluginError) as info:
        Trainer(cfg, objective_plugin(transform=fails_later), log=lambda *_: None).train()
    assert "\n" not in str(info.value)
    assert str(info.value).startswith("objectives.lengthy: batch_transform raised ValueError: no such token")


def short_tags(docs, rng):
    return [{"input_ids": np.array([2, 7, 3]), "token_type_ids": np.zeros(3, dtype=np.int64),
             "word_starts": np.ones(3, dtype=np.uint8), "tags": np.zeros(1)} for _ in range(40)]


def test_examples_that_do_not_collate_name_their_builder(tiny_config):
    def make(options, context):
        return pretextual.Objective(loss=long_or_short, heads={"lengthy": FirstTokenHead},
                                    example_builder=short_tags)
    cfg = tiny_config("roberta", "objectives.lengthy.weight=1")
    with pytest.raises(PluginError, match=r"^objectives\.lengthy: example_builder made examples that "
                                          r"do not make a batch \(the training split: \d+ documents\)"):
        Trainer(cfg, objective_plugin(build=make, provides=("example_builder",)), log=lambda *_: None)


def test_a_constant_loss_after_the_first_step_is_allowed(tiny_config):
    calls = {"n": 0}

    def nothing_to_predict_later(inputs):
        calls["n"] += 1
        right = long_or_short(inputs)
        return right if calls["n"] == 1 else pretextual.ObjectiveOutput(loss=torch.zeros(()))

    run(tiny_config, objective_plugin(loss=nothing_to_predict_later), steps=3)
    assert calls["n"] >= 3


def test_a_head_tied_to_the_word_embeddings_checkpoints_resumes_and_exports(tiny_config, tmp_path):
    tied = dict(heads={"lengthy": TiedHead},
                loss=lambda inputs: pretextual.ObjectiveOutput(loss=F.cross_entropy(
                    inputs.heads["lengthy"](inputs.encoder_output.last_hidden_state),
                    inputs.batch["input_ids"][:, 1])))
    straight = tmp_path / "straight"
    run(tiny_config, objective_plugin(**tied), f"trainer.output_dir={straight}", steps=4)
    meta = open_checkpoint(straight / "checkpoints" / "step-0000004").meta
    assert meta["tied"] == {"heads.lengthy.decoder.weight": "bert.embeddings.word_embeddings.weight"}

    cut = tmp_path / "cut"
    run(tiny_config, objective_plugin(**tied), f"trainer.output_dir={cut}", "trainer.checkpoint_every=2",
        steps=4)
    shutil.rmtree(cut / "checkpoints" / "step-0000004")
    Trainer(tiny_config("roberta", "objectives.lengthy.weight=1", f"trainer.output_dir={cut}", steps=4),
            objective_plugin(**tied), log=lambda *_: None, resume=True).train()
    a, b = final_weights(straight), final_weights(cut)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)

    export_checkpoint(straight, tmp_path / "export", ["safetensors"], with_heads=True,
                      plugins=objective_plugin(**tied), log=lambda *_: None)
    loaded = from_pretrained(tmp_path / "export")
    head = TiedHead(loaded.encoder)
    head.load_state_dict(loaded.heads["lengthy"])
    assert torch.equal(head.decoder.weight, loaded.encoder.embeddings.word_embeddings.weight)

    # Two heads tied to the same embeddings: each is stored, and exported, on its own.
    two = dict(tied, heads={"lengthy": TiedHead, "other": TiedHead})
    both = tmp_path / "both"
    run(tiny_config, objective_plugin(**two), f"trainer.output_dir={both}", steps=2)
    assert len(open_checkpoint(both / "checkpoints" / "step-0000002").meta["tied"]) == 2
    export_checkpoint(both, tmp_path / "export-both", ["safetensors"], with_heads=True,
                      plugins=objective_plugin(**two), log=lambda *_: None)
    assert from_pretrained(tmp_path / "export-both").heads.keys() >= {"lengthy", "other"}


def compiled_at(filename: str):
    """A function that divides by zero, as if defined in ``filename``."""
    namespace = {}
    exec(compile("def broken(x):\n    return x / 0\n", filename, "exec"), namespace)
    return namespace["broken"]


def test_an_error_in_pretextuals_own_code_keeps_its_traceback_and_a_plugins_does_not():
    from pathlib import Path

    from pretextual.errors import plugin_call
    package = Path(pretextual.__file__).resolve().parent
    # A plugin module next to the package (site-packages/pretextual_myobj.py) is a plugin's.
    with pytest.raises(PluginError, match=r"^objectives\.x: loss\(\) raised ZeroDivisionError: "
                                          r"division by zero \(at pretextual_myobj\.py:2\)$"):
        plugin_call("objectives.x", "loss()", compiled_at(str(package.parent / "pretextual_myobj.py")), 1)
    with pytest.raises(ZeroDivisionError):  # a bug of pretextual's: raised as it is
        plugin_call("objectives.x", "loss()", compiled_at(str(package / "objectives" / "mlm.py")), 1)
