"""Which accelerations a run gets, said in its header: torch.compile when asked, and on
the CPU glibc's malloc keeping freed memory; no run imports numba or llvmlite."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pretextual.accel as accel
from pretextual.architectures.bert import BertModel, preset_config
from pretextual.core.trainer import Trainer
from run_helpers import tiny_overrides


def _encoder() -> BertModel:
    return BertModel(preset_config("tiny", vocab_size=100))


def test_the_cpu_gets_the_allocator_setting_and_compile_only_when_asked(monkeypatch):
    monkeypatch.setattr(accel, "keep_freed_memory", lambda: True)
    for device, compile, expected in (("cpu", False, ["glibc malloc keeps freed memory"]),
                                      ("cuda", False, []),
                                      ("cpu", True, ["glibc malloc keeps freed memory", "torch.compile"])):
        encoder = _encoder()
        encoder.compile = lambda: None  # what compiling does is tested in test_step_equivalence
        assert accel.accelerate(encoder, device, compile) == expected
        assert type(encoder.encoder).__name__ == "BertEncoder"  # the model's own classes stay
    monkeypatch.setattr(accel, "keep_freed_memory", lambda: False)  # not glibc: nothing to say
    assert accel.accelerate(_encoder(), "cpu", False) == []


def test_the_run_header_says_what_it_applied(tiny_config):
    lines = []
    Trainer(tiny_config("roberta"), log=lines.append).train()
    header = next(line for line in lines if line.startswith("objectives:"))
    assert header.endswith("| device cpu | glibc malloc keeps freed memory")


def test_a_run_imports_neither_numba_nor_llvmlite(corpus_file, cache_dir, tmp_path):
    """What a GPU run does on the host: build the trainer, mask, step, checkpoint and
    export; numba and llvmlite stay unimported (masking draws from torch generators)."""
    overrides = tiny_overrides(corpus_file, cache_dir, tmp_path / "run", 3) + [
        "trainer.export=safetensors"]
    script = textwrap.dedent(f"""
        import sys
        from pretextual.core.config import load_config
        from pretextual.core.trainer import Trainer
        Trainer(load_config("bert", {overrides!r}), log=lambda *_: None).train()
        print("loaded:", sorted(m for m in ("numba", "llvmlite") if m in sys.modules))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "loaded: []"
