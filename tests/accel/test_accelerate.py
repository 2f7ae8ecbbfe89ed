"""Which accelerations a run gets: trainer.compile and trainer.cpu_kernels, and a run
that uses no CPU kernel never imports numba or llvmlite."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

import pretextual.accel as accel
from pretextual.core.config import load_config
from pretextual.core.encoder import BertModel, preset_config
from pretextual.core.trainer import Trainer
from pretextual.errors import ConfigError
from run_helpers import tiny_overrides


def _encoder() -> BertModel:
    return BertModel(preset_config("tiny", vocab_size=100))


def test_auto_on_the_cpu_swaps_the_kernels_in_when_installed():
    pytest.importorskip("numba")
    model = _encoder()
    applied = accel.accelerate(model, model, "cpu", compile=False, cpu_kernels=None)
    assert len(applied) == 1 and applied[0].startswith("CPU kernels (")
    assert type(model.encoder.layer[0].attention.self).__name__ == "CPUSelfAttention"


def test_auto_without_the_extra_is_one_line_naming_it_and_trains_plain(monkeypatch):
    monkeypatch.setattr(accel, "cpu_kernels_installed", lambda: False)
    lines = []
    model = _encoder()
    assert accel.accelerate(model, model, "cpu", False, None, lines.append) == []
    assert lines == ["note: training with plain PyTorch kernels; the CPU kernels are faster "
                     "here: pip install 'pretextual[cpu]'"]
    assert type(model.encoder.layer[0].attention.self).__name__ == "BertSelfAttention"


def test_on_where_the_kernels_cannot_run_is_a_config_error(monkeypatch):
    with pytest.raises(ConfigError, match=r"^trainer.cpu_kernels=true: the CPU kernels run on the "
                                          r"CPU, this run is on cuda$"):
        accel.accelerate(_encoder(), _encoder(), "cuda", False, True)
    monkeypatch.setattr(accel, "cpu_kernels_installed", lambda: False)
    with pytest.raises(ConfigError, match=r"needs the CPU kernels: pip install 'pretextual\[cpu\]'$"):
        accel.accelerate(_encoder(), _encoder(), "cpu", False, True)


def test_compiled_runs_and_other_devices_get_no_cpu_kernels():
    for device, compile in (("cuda", False), ("cpu", True)):
        model = _encoder()
        model.compile = lambda: None  # what compiling does is tested in test_step_equivalence
        applied = accel.accelerate(model, model, device, compile, None)
        assert applied == (["torch.compile"] if compile else [])
        assert type(model.encoder).__name__ == "BertEncoder"


def test_a_bad_choice_names_the_key(tiny_config):
    with pytest.raises(ConfigError, match=r"^trainer.cpu_kernels: "):
        tiny_config("bert", "trainer.cpu_kernels=sometimes")


def test_the_run_header_says_which_kernels_it_uses(tiny_config):
    lines = []
    Trainer(tiny_config("roberta", "trainer.cpu_kernels=false"), log=lines.append).train()
    header = next(line for line in lines if line.startswith("objectives:"))
    assert "CPU kernels" not in header
    pytest.importorskip("numba")
    lines.clear()
    Trainer(tiny_config("roberta", "trainer.cpu_kernels=true", "trainer.overwrite_output_dir=true"),
            log=lines.append).train()
    header = next(line for line in lines if line.startswith("objectives:"))
    assert "| CPU kernels (CPUEncoder, CPUSelfAttention, Dropout, FusedMLMHead" in header


def test_a_run_without_cpu_kernels_never_imports_numba(corpus_file, cache_dir, tmp_path):
    """What a GPU run does on the host: build the trainer, mask, step, checkpoint and
    export, with trainer.cpu_kernels=false; numba and llvmlite stay unimported."""
    overrides = tiny_overrides(corpus_file, cache_dir, tmp_path / "run", 3) + [
        "trainer.cpu_kernels=false", "trainer.export=safetensors"]
    script = textwrap.dedent(f"""
        import sys
        from pretextual.core.config import load_config
        from pretextual.core.trainer import Trainer
        Trainer(load_config("bert", {overrides!r}), log=lambda *_: None).train()
        loaded = sorted(m for m in ("numba", "llvmlite", "pretextual.accel.cpu") if m in sys.modules)
        print("loaded:", loaded)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "loaded: []"


def test_the_default_is_unset_the_choice_made_by_device():
    assert load_config("bert").trainer.cpu_kernels is None
