"""Config: recipes, overrides, and one clear line for every mistake a user can make."""

import re
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from pretextual.cli import main
from pretextual.core.config import load_config, objective_options, recipe_names
from pretextual.core.config_reference import reference_markdown
from pretextual.core.mix import ObjectiveMix, check_objectives
from pretextual.architectures.bert import preset_config
from pretextual.core.trainer import Trainer
from pretextual.errors import ConfigError
from pretextual.objectives.mlm import MLMOptions
from pretextual.plugins.api import BuildContext, Vocab
from pretextual.plugins.manager import Plugins

ROOT = Path(__file__).resolve().parents[2]
VOCAB = Vocab(size=100, pad_id=0, unk_id=1, cls_id=2, sep_id=3, mask_id=4, special_ids=(0, 1, 2, 3, 4))


def mix(*overrides, recipe="roberta"):
    cfg = load_config(recipe, list(overrides))
    context = BuildContext(preset_config("tiny", vocab_size=100), VOCAB, 64, True)
    return ObjectiveMix(check_objectives(cfg.objectives, Plugins()), context)


def test_recipes_are_shipped_and_default_is_modernbert():
    assert {"modernbert", "bert", "roberta", "albert", "spanbert"} <= set(recipe_names())
    default = load_config()
    assert set(default.objectives) == {"mlm"} and default.model.architecture == "modernbert"
    assert set(load_config("bert").objectives) == {"mlm", "nsp"}
    assert load_config("bert").model.architecture == "bert"
    assert set(load_config("spanbert").objectives) == {"span"}


def test_overrides_reach_objective_options():
    cfg = load_config("roberta", ["objectives.mlm.weight=0.5", "objectives.mlm.mask_prob=0.2",
                                  "data.max_seq_length=64"])
    m = mix("objectives.mlm.weight=0.5", "objectives.mlm.mask_prob=0.2")
    assert cfg.data.max_seq_length == 64
    assert m.weights(0) == {"mlm": 0.5}
    schedule, options = objective_options("mlm", cfg.objectives.mlm, MLMOptions)
    assert (schedule.weight, options.mask_prob, options.mask_ratio) == (0.5, 0.2, 0.8)


def test_yaml_file_and_delete_override(tmp_path):
    path = tmp_path / "mix.yaml"
    path.write_text("objectives:\n  mlm: {weight: 1.0}\n  nsp: {weight: 0.5}\ntrainer:\n  max_steps: 7\n")
    cfg = load_config(str(path), ["~objectives.nsp"])
    assert set(cfg.objectives) == {"mlm"}
    # a deletion does not stop later overrides from adding an objective
    cfg = load_config(str(path), ["~objectives.mlm", "objectives.wwm.weight=2"])
    assert set(cfg.objectives) == {"nsp", "wwm"}
    assert cfg.trainer.max_steps == 7


@pytest.mark.parametrize("overrides, message", [
    (["trainer.max_step=3"], r"trainer\.max_step.*Did you mean"),
    (["data.batch_size=many"], r"data\.batch_size"),
    (["model.preset=gigantic"], r"model\.preset: bert has no preset 'gigantic' \(known: tiny, mini"),
    (["data.max_seq_length=1024"], r"data\.max_seq_length \(1024\) exceeds"),
    (["~objectives.mlm"], r"objectives: no objective selected"),
    (["notakey"], r"notakey: expected key=value"),
    (["plugins.modules=my_mod"], r"^plugins\.modules: takes a list, written in brackets: "
                                 r"plugins\.modules=\[my_mod\] \(several: plugins\.modules=\[a,b\]\)$"),
    (["trainer.log_every=0"], r"trainer\.log_every must be positive, got 0"),
    (["trainer.lr=-1e-3"], r"trainer\.lr must not be negative"),
    (["trainer.eval_every=-1"], r"trainer\.eval_every must not be negative"),
    (["data.num_workers=-2"], r"data\.num_workers must not be negative"),
    (["trainer.device=gpu"], r"trainer\.device: unknown device 'gpu'"),
    (["trainer.device=cuda:one"], r"trainer\.device: unknown device 'cuda:one'"),
    (["trainer.device='cuda:'"], r"trainer\.device: unknown device 'cuda:'"),
    (["model.num_attention_heads=0"], r"^model\.num_attention_heads must be positive, got 0$"),
    (["model.hidden_size=0"], r"^model\.hidden_size must be positive, got 0$"),
    (["model.intermediate_size=0"], r"^model\.intermediate_size must be positive, got 0$"),
    (["model.num_hidden_layers=0"], r"^model\.num_hidden_layers must be positive, got 0$"),
    (["model.num_hidden_layers=-1"], r"^model\.num_hidden_layers must be positive, got -1$"),
    (["model.hidden_dropout_prob=1.5"], r"^model\.hidden_dropout_prob must be in \[0, 1\), got 1\.5$"),
    (["model.attention_probs_dropout_prob=-0.1"],
     r"^model\.attention_probs_dropout_prob must be in \[0, 1\), got -0\.1$"),
    (["model.hidden_dropout_prob=nan"], r"^model\.hidden_dropout_prob must be in \[0, 1\), got nan$"),
    (["trainer.adam_beta1=1.5"], r"^trainer\.adam_beta1 must be in \[0, 1\), got 1\.5$"),
    (["trainer.adam_beta2=1.0"], r"^trainer\.adam_beta2 must be in \[0, 1\), got 1\.0$"),
    (["trainer.adam_eps=-1"], r"^trainer\.adam_eps must be positive, got -1\.0$"),
    (["trainer.adam_eps=0"], r"^trainer\.adam_eps must be positive, got 0\.0$"),
    (["trainer.lr=nan"], r"^trainer\.lr must be a finite number, got nan$"),
    (["trainer.lr=inf"], r"^trainer\.lr must be a finite number, got inf$"),
    (["model.num_attention_heads=3"],  # tiny: hidden 128
     r"^model\.hidden_size \(128, from model\.preset=tiny\) must be a multiple of "
     r"model\.num_attention_heads \(3\)$"),
    (["model.preset=tiny", "model.hidden_size=100", "model.num_attention_heads=3"],
     r"^model\.hidden_size \(100\) must be a multiple of model\.num_attention_heads \(3\)$"),
    (["model.preset=base", "model.hidden_size=100"],  # base: 12 heads
     r"^model\.hidden_size \(100\) must be a multiple of model\.num_attention_heads "
     r"\(12, from model\.preset=base\)$"),
])
def test_bad_config_is_one_clear_line(overrides, message):
    with pytest.raises(ConfigError, match=message) as info:
        load_config("roberta", overrides)
    assert "\n" not in str(info.value)


def test_a_model_that_cannot_fit_in_memory_is_refused_when_the_config_is_checked(capsys):
    assert main(["config", "roberta", "model.hidden_size=1000000", "model.num_attention_heads=1"]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1
    assert re.match(r"pretextual: error: model sizes \(model\.hidden_size=1000000, "
                    r"model\.num_attention_heads=1\): about \d+\.\d billion parameters need at "
                    r"least [\d,]+ GiB to train .* more than this machine's [\d,]+ GiB of memory$",
                    error.strip())
    load_config("roberta", ["model.preset=base"])  # what fits is left alone


def test_limits_leave_legitimate_values_alone():
    cfg = load_config("roberta", ["model.preset=tiny", "model.hidden_size=96", "model.num_hidden_layers=1",
                                  "model.hidden_dropout_prob=0", "model.attention_probs_dropout_prob=0",
                                  "trainer.adam_beta1=0", "trainer.adam_beta2=0.999", "trainer.adam_eps=1e-12",
                                  "trainer.lr=0"])
    assert (cfg.model.hidden_size, cfg.model.num_attention_heads, cfg.model.intermediate_size) == (96, None, None)


def test_cuda_without_cuda_is_one_clear_line_when_a_run_starts(monkeypatch):
    from pretextual.core.distributed import device_for

    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    cfg = load_config("roberta", ["trainer.device=cuda:1"])  # a GPU run's config still loads and prints
    with pytest.raises(ConfigError, match=r"trainer\.device=cuda:1: CUDA is not available"):
        device_for(cfg.trainer.device)
    assert device_for("auto").type == "cpu"


def test_bad_yaml_file_names_the_file_and_the_key(tmp_path):
    typo = tmp_path / "typo.yaml"
    typo.write_text("trainer:\n  lr: fast\n")
    with pytest.raises(ConfigError, match=r"typo\.yaml: trainer\.lr: .*'fast'"):
        load_config(str(typo))
    listed = tmp_path / "listed.yaml"  # a list where a mapping belongs: OmegaConf names no key
    listed.write_text("objectives: [mlm, nsp]\n")
    with pytest.raises(ConfigError, match=r"^.*listed\.yaml: objectives: Cannot merge incompatible"):
        load_config(str(listed))
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"\xff\xfe\x00trainer")
    with pytest.raises(ConfigError, match=r"binary\.yaml: cannot read the config file"):
        load_config(str(binary))


@pytest.mark.parametrize("overrides, message", [
    (["objectives.mlm.weight=-1"], r"objectives\.mlm\.weight must not be negative"),
    (["objectives.mlm.weight=inf"], r"^objectives\.mlm\.weight must be a finite number, got inf$"),
    (["objectives.mlm.start_weight=nan"], r"^objectives\.mlm\.start_weight must be a finite number, got nan$"),
    (["objectives=[mlm]"], r"^objectives: Cannot merge incompatible container types$"),
    (["objectives.mlm.weight=0"], r"every weight is zero"),
    (["objectives.mlm.mask_probb=0.2"], r"objectives\.mlm\.mask_probb.*Did you mean"),
    (["objectives.mlm.mask_prob=high"], r"objectives\.mlm\.mask_prob"),
    (["objectives.mlm.mask_prob=1.5"], r"objectives\.mlm\.mask_prob must be in \(0, 1\)"),
    (["objectives.mlm.mask_ratio=0.95", "objectives.mlm.random_ratio=0.1"], r"<= 1"),
    (["objectives.mlm.schedule=cosine"], r"unknown schedule 'cosine'"),
    (["objectives.bogus.weight=1"], r"objectives\.bogus: no plugin registers an objective named 'bogus'"),
])
def test_bad_objective_config(overrides, message):
    with pytest.raises(Exception, match=message):
        mix(*overrides)


def test_weight_schedules():
    m = mix("objectives.mlm.schedule=linear", "objectives.mlm.start_weight=0",
            "objectives.mlm.weight=2", "objectives.mlm.schedule_steps=10")
    assert [m.weights(s)["mlm"] for s in (0, 5, 10, 20)] == [0.0, 1.0, 2.0, 2.0]
    m = mix("objectives.mlm.schedule=step", "objectives.mlm.start_weight=0.5",
            "objectives.mlm.schedule_steps=3")
    assert [m.weights(s)["mlm"] for s in (0, 2, 3)] == [0.5, 0.5, 1.0]


def test_cli_reports_errors_in_one_line(capsys):
    assert main(["config", "roberta", "trainer.max_step=3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("pretextual: error: trainer.max_step")


@pytest.mark.parametrize("recipe, override, message", [
    ("roberta", "objectives.mlmm.weight=1", "objectives.mlmm: no plugin registers an objective named 'mlmm'"),
    ("roberta", "objectives.mlm.mask_prob=1.5", "objectives.mlm.mask_prob must be in (0, 1), got 1.5"),
    ("roberta", "objectives.mlm.schedule=cosine", "objectives.mlm.schedule: unknown schedule 'cosine' "
                                                  "(known: constant, linear, step)"),
    ("roberta", "objectives.mlm.weight=0", "objectives: every weight is zero"),
    ("spanbert", "objectives.span.max_span=0", "objectives.span.max_span must be at least 1, got 0"),
    ("bert", "objectives.nsp.random_next_prob=2", "objectives.nsp.random_next_prob must be in [0, 1], got 2.0"),
    ("bert", "objectives.sop.weight=1", "objectives: nsp and sop conflict: both build examples from "
                                        "documents and a batch has only one way of being built; drop "
                                        "one (e.g. ~objectives.sop)"),
    ("roberta", "objectives.span.weight=1", "objectives: mlm and span conflict: both corrupt the batch"),
])
def test_cli_config_refuses_what_train_refuses(capsys, recipe, override, message):
    assert main(["config", recipe, override]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert captured.out == "" and len(err) == 1 and err[0].startswith(f"pretextual: error: {message}")


def test_a_conflicting_mix_is_refused_before_the_corpus_is_read(tmp_path):
    cfg = load_config("roberta", ["objectives.wwm.weight=1", f"data.corpus={tmp_path / 'missing.txt'}",
                                  f"trainer.output_dir={tmp_path / 'run'}"])
    with pytest.raises(ConfigError, match=r"^objectives: mlm and wwm conflict: both corrupt the batch"):
        Trainer(cfg, Plugins(), log=lambda *_: None)


def test_cli_prints_resolved_config(capsys):
    assert main(["config", "albert", "objectives.sop.weight=0.5", "objectives.wwm.weight=1"]) == 0
    printed = OmegaConf.create(capsys.readouterr().out).objectives
    # every key as the run reads it, typed: 1 from the command line is the float 1.0
    assert printed.wwm == {"weight": 1.0, "schedule": "constant", "start_weight": 0.0,
                           "schedule_steps": 0, "schedules": {}, "mask_prob": 0.15,
                           "mask_ratio": 0.8, "random_ratio": 0.1}
    assert type(printed.wwm.weight) is float and printed.sop.weight == 0.5


def test_config_reference_is_up_to_date(monkeypatch):
    monkeypatch.setenv("PRETEXTUAL_LOAD_PLUGINS", "")  # built-ins only, whatever is installed
    generated = reference_markdown(Plugins().objectives)
    assert (ROOT / "docs" / "config.md").read_text() == generated + "\n", \
        "docs/config.md is stale: run `PRETEXTUAL_LOAD_PLUGINS= pretextual config --reference > docs/config.md`"
