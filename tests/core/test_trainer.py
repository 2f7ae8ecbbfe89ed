"""Training runs end to end: losses fall, metrics are logged, resume is exact."""

import json
import math
import shutil

import pytest
import torch
from omegaconf import OmegaConf
from safetensors.torch import load_file
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

from pretextual.core.checkpoint import list_checkpoints, open_checkpoint
from pretextual.core.trainer import Trainer
from pretextual.plugins.hookspecs import hookimpl
from pretextual.plugins.manager import Plugins
from run_helpers import final_weights


def read_metrics(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_loss_falls_and_metrics_are_logged(tiny_config, tmp_path):
    cfg = tiny_config("roberta", "trainer.lr=3e-3", "trainer.eval_every=20", steps=60)
    final = Trainer(cfg, log=lambda *_: None).train()
    lines = read_metrics(tmp_path / "run")
    steps = [l for l in lines if "loss/mlm" in l]
    evals = [l for l in lines if "eval/loss" in l]
    assert [l["step"] for l in steps] == list(range(1, 61))
    for key in ("loss", "loss/mlm", "weight/mlm", "lr", "tokens_per_s", "mlm/accuracy"):
        assert key in steps[0]
    assert steps[0]["loss"] == pytest.approx(steps[0]["loss/mlm"] * steps[0]["weight/mlm"])
    first = sum(l["loss"] for l in steps[:5]) / 5
    last = sum(l["loss"] for l in steps[-5:]) / 5
    assert last < first - 1.0, (first, last)  # ln(300) = 5.7 at the start
    assert [l["step"] for l in evals] == [20, 40, 60]
    # Held-out loss far below a uniform guess's ln(300); after step 20 it is on a plateau where
    # the tokenizer (see below) decides the order of the evals.
    assert all(e["eval/loss/mlm"] < math.log(300) - 1.0 for e in evals), evals
    # 15x chance (1/300); measured 0.08-0.16, with the tokenizer as the varying part: WordPiece
    # training breaks count ties in hash-map order, which differs between processes.
    assert final["eval/mlm/accuracy"] > 0.05
    assert (tmp_path / "run" / "tokenizer.json").is_file()
    recorded = OmegaConf.load(tmp_path / "run" / "config.yaml").objectives
    assert recorded.mlm.mask_prob == 0.15 and recorded.mlm.weight == 1.0  # defaults filled in


def test_a_warmup_longer_than_the_run_is_said_and_the_lr_never_peaks(tiny_config, tmp_path):
    cfg = tiny_config("roberta", "trainer.warmup_steps=8", "trainer.lr=1e-3", steps=4)
    messages = []
    Trainer(cfg, log=messages.append).train()
    assert ("warning: trainer.warmup_steps=8 is more than trainer.max_steps=4: the learning rate "
            "rises for the whole run and peaks at 50% of trainer.lr (lower trainer.warmup_steps)"
            ) in messages
    lrs = [line["lr"] for line in read_metrics(tmp_path / "run") if "lr" in line]
    assert lrs == pytest.approx([1e-3 * step / 8 for step in range(1, 5)])


def test_same_seed_gives_identical_weights(tiny_config, tmp_path):
    a = tiny_config("roberta", f"trainer.output_dir={tmp_path / 'a'}", steps=4)
    b = tiny_config("roberta", f"trainer.output_dir={tmp_path / 'b'}", steps=4)
    Trainer(a, log=lambda *_: None).train()
    Trainer(b, log=lambda *_: None).train()
    wa, wb = final_weights(tmp_path / "a"), final_weights(tmp_path / "b")
    assert wa.keys() == wb.keys()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_resume_matches_an_uninterrupted_run(tiny_config, tmp_path):
    straight = tiny_config("roberta", f"trainer.output_dir={tmp_path / 'straight'}",
                           "trainer.checkpoint_every=3", steps=8)
    Trainer(straight, log=lambda *_: None).train()

    # Stop at step 5 and drop its checkpoint: as if killed after step 3's checkpoint.
    cut = tiny_config("roberta", f"trainer.output_dir={tmp_path / 'cut'}",
                      "trainer.checkpoint_every=3", steps=8)

    class StopAtFive:
        @hookimpl
        def pretextual_on_step_end(self, step, trainer):
            trainer.should_stop = step == 5

    plugins = Plugins()
    assert plugins.register(StopAtFive(), name="stop-at-five")
    Trainer(cut, plugins, log=lambda *_: None).train()
    shutil.rmtree(tmp_path / "cut" / "checkpoints" / "step-0000005")
    messages = []
    Trainer(cut, log=messages.append, resume=True).train()
    assert any("resumed from" in m and "step-0000003" in m for m in messages)
    assert not any("differs from the checkpoint" in m for m in messages)
    wa, wb = final_weights(tmp_path / "straight"), final_weights(tmp_path / "cut")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    straight_losses = [l["loss"] for l in read_metrics(tmp_path / "straight") if "loss/mlm" in l]
    cut_losses = [l["loss"] for l in read_metrics(tmp_path / "cut") if "loss/mlm" in l]
    assert cut_losses == straight_losses


def test_resume_goes_on_with_the_new_optimizer_settings_and_says_what_changed(tiny_config, tmp_path):
    Trainer(tiny_config("roberta", steps=4), log=lambda *_: None).train()
    changed = tiny_config("roberta", "trainer.lr=0.01", "trainer.weight_decay=0.5",
                          "trainer.adam_beta1=0.5", "trainer.checkpoint_every=8", steps=8)
    messages = []
    Trainer(changed, log=messages.append, resume=True).train()
    note = next(m for m in messages if "differs from the checkpoint" in m)
    for change in ("trainer.adam_beta1: 0.9 -> 0.5", "trainer.lr: 0.001 -> 0.01",
                   "trainer.max_steps: 4 -> 8", "trainer.weight_decay: 0.01 -> 0.5"):
        assert change in note
    # The new peak on the new schedule from the first resumed step (warm-up 2, decay to step 8).
    lrs = {l["step"]: l["lr"] for l in read_metrics(tmp_path / "run") if "lr" in l}
    assert lrs[5] == pytest.approx(0.01 * (8 - 4) / (8 - 2))
    assert lrs[6] == pytest.approx(0.01 * (8 - 5) / (8 - 2))
    groups = open_checkpoint(tmp_path / "run" / "checkpoints" / "step-0000008").meta["param_groups"]
    assert sorted(g["weight_decay"] for g in groups) == [0.0, 0.5]
    assert all(g["betas"][0] == 0.5 and g["initial_lr"] == 0.01 for g in groups)
    assert "lr: 0.01" in (tmp_path / "run" / "config.yaml").read_text()


def test_resume_with_another_global_batch_says_so(tiny_config, tmp_path):
    Trainer(tiny_config("roberta", steps=2), log=lambda *_: None).train()
    messages = []
    Trainer(tiny_config("roberta", "trainer.grad_accum_steps=2", steps=3), log=messages.append,
            resume=True).train()
    note = next(m for m in messages if "differs from the checkpoint" in m)
    assert "trainer.grad_accum_steps: 1 -> 2" in note
    assert note.endswith("global batch: 8 -> 16 (data.batch_size x processes x trainer.grad_accum_steps)")


def test_resume_beyond_max_steps_trains_nothing_and_leaves_the_run_as_it_is(tiny_config, tmp_path):
    Trainer(tiny_config("roberta", steps=4), log=lambda *_: None).train()
    run = tmp_path / "run"
    before = {name: (run / name).read_text() for name in ("config.yaml", "metrics.jsonl")}
    messages = []
    assert Trainer(tiny_config("roberta", steps=3), log=messages.append, resume=True).train() == {}
    assert any("nothing to train: the checkpoint is at step 4 and trainer.max_steps=3" in m
               for m in messages)
    assert {name: (run / name).read_text() for name in before} == before
    assert [p.name for p in list_checkpoints(run / "checkpoints")] == ["step-0000004"]


def test_evaluation_is_the_mean_over_held_out_examples_whatever_the_batch_size(tiny_config, tmp_path):
    # 47 held-out pairs: in batches of 8 the last holds 7, of 3 the last holds 2. A mean of
    # batch means would weigh those as much as full ones.
    corpus = tmp_path / "docs.txt"
    corpus.write_text("\n".join(" ".join(f"Document {d} sentence {s} has some words {s * d}."
                                         for s in range(12)) + "\n" for d in range(40)))
    results = {}
    for batch_size in (8, 7, 3):
        trainer = Trainer(tiny_config("bert", f"data.corpus={corpus}", f"data.batch_size={batch_size}",
                                      "trainer.eval_batches=1000", "data.eval_fraction=0.25"),
                          log=lambda *_: None)
        batches = trainer.eval_batches.available(1000)
        assert sum(trainer.eval_batches[i]["input_ids"].shape[0] for i in range(batches)) == 47
        results[batch_size] = trainer.evaluate()
    accuracies = [r["eval/nsp/accuracy"] for r in results.values()]
    correct = round(accuracies[0] * 47)
    assert accuracies == pytest.approx([correct / 47] * 3, abs=1e-6)
    losses = [r["eval/loss/nsp"] for r in results.values()]
    assert max(losses) - min(losses) < 1e-3


def test_checkpoints_keep_the_latest_k(tiny_config, tmp_path):
    cfg = tiny_config("roberta", "trainer.checkpoint_every=2", "trainer.keep_checkpoints=2", steps=7)
    Trainer(cfg, log=lambda *_: None).train()
    names = [p.name for p in list_checkpoints(tmp_path / "run" / "checkpoints")]
    assert names == ["step-0000006", "step-0000007"]
    assert not [p for p in (tmp_path / "run" / "checkpoints").iterdir() if p.name.startswith(".tmp")]


def test_corrupt_latest_checkpoint_falls_back(tiny_config, tmp_path, capsys):
    cfg = tiny_config("roberta", "trainer.checkpoint_every=2", "trainer.keep_checkpoints=3", steps=4)
    Trainer(cfg, log=lambda *_: None).train()
    latest = list_checkpoints(tmp_path / "run" / "checkpoints")[-1] / "model.safetensors"
    latest.write_bytes(latest.read_bytes()[:100])  # truncated
    messages = []
    Trainer(cfg, log=messages.append, resume=True).resume()
    assert "step-0000004" in capsys.readouterr().err
    assert any("step-0000002" in m for m in messages)


def test_gradient_accumulation_steps_on_the_mean_of_its_micro_batches(tiny_config, tmp_path):
    """Two steps of 2 x 4 accumulated examples give the weights and AdamW moments of a
    plain loop that steps on the mean gradient of the same micro-batches. The moments
    keep the gradient's scale (AdamW's update nearly does not), so a sum instead of the
    mean fails too; clipping is off for the same reason."""
    cfg = tiny_config("roberta", "model.hidden_dropout_prob=0", "model.attention_probs_dropout_prob=0",
                      "data.batch_size=4", "trainer.grad_accum_steps=2", "trainer.warmup_steps=0",
                      "trainer.max_grad_norm=0", steps=2)
    reference = Trainer(cfg, log=lambda *_: None)  # same seed: same initial weights and batches
    Trainer(cfg, log=lambda *_: None).train()
    for step in range(2):
        for micro in range(2):
            total, _ = reference.forward(reference.train_batches[2 * step + micro], step)
            (total / 2).backward()
        reference.optimizer.step()
        reference.optimizer.zero_grad(set_to_none=True)
        reference.scheduler.step()
    checkpoint = list_checkpoints(tmp_path / "run" / "checkpoints")[-1]
    expected = reference.model.state_dict()
    moments = get_optimizer_state_dict(reference.model, reference.optimizer,
                                       options=StateDictOptions(full_state_dict=True))["state"]
    expected.update({f"state.{name}.{key}": value for name, state in moments.items()
                     for key, value in state.items() if key != "step"})
    trained = {**load_file(str(checkpoint / "model.safetensors")),
               **{k: v for k, v in load_file(str(checkpoint / "optimizer.safetensors")).items()
                  if k.startswith("state.") and not k.endswith(".step")}}
    assert sum(k.startswith("state.") for k in trained) > 10 and set(trained) <= set(expected)
    for name, value in trained.items():
        assert torch.allclose(value, expected[name], rtol=1e-5, atol=1e-9), name


def test_dataloader_workers_give_the_same_run(tiny_config, tmp_path):
    a = tiny_config("roberta", f"trainer.output_dir={tmp_path / 'a'}", "data.num_workers=0", steps=3)
    b = tiny_config("roberta", f"trainer.output_dir={tmp_path / 'b'}", "data.num_workers=2", steps=3)
    Trainer(a, log=lambda *_: None).train()
    Trainer(b, log=lambda *_: None).train()
    wa, wb = final_weights(tmp_path / "a"), final_weights(tmp_path / "b")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_an_existing_tokenizer_is_used_as_is(tiny_config, tmp_path):
    first = tiny_config("roberta", f"trainer.output_dir={tmp_path / 'first'}", steps=1)
    Trainer(first, log=lambda *_: None).train()
    saved = tmp_path / "first" / "tokenizer.json"
    second = tiny_config("roberta", f"data.tokenizer={saved}", f"data.cache_dir={tmp_path / 'c2'}",
                         f"trainer.output_dir={tmp_path / 'second'}", steps=1)
    messages = []
    Trainer(second, log=messages.append).train()
    assert not any("training a WordPiece tokenizer" in m for m in messages)
    assert (tmp_path / "second" / "tokenizer.json").read_text() == saved.read_text()


def test_training_exports_the_final_encoder(tiny_config, tmp_path):
    cfg = tiny_config("roberta", "trainer.export=safetensors,onnx", steps=2)
    Trainer(cfg, log=lambda *_: None).train()
    export = tmp_path / "run" / "export"
    for name in ("config.json", "model.safetensors", "tokenizer.json", "model.onnx"):
        assert (export / name).is_file(), name
    assert json.loads((export / "config.json").read_text())["model_type"] == "bert"


def test_bad_output_dir_and_export_are_one_line_before_any_work(tiny_config, tmp_path, monkeypatch):
    from pretextual.errors import ConfigError

    def no_work(*args, **kwargs):
        raise AssertionError("the corpus was read before the config was checked")

    monkeypatch.setattr("pretextual.core.run_data.tokenized_corpus", no_work)

    a_file = tmp_path / "a_file"
    a_file.write_text("")
    with pytest.raises(ConfigError, match=r"trainer\.output_dir=.*a_file exists and is not a directory"):
        Trainer(tiny_config("roberta", f"trainer.output_dir={a_file / 'run'}"), log=lambda *_: None)
    with pytest.raises(ConfigError, match=r"trainer\.export: no plugin registers an exporter named 'foo' "
                                          r"\(known: .*safetensors"):
        Trainer(tiny_config("roberta", "trainer.export=safetensors,foo"), log=lambda *_: None)
    assert not (tmp_path / "run").exists()  # nothing was written
