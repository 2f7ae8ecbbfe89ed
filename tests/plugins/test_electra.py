"""The ELECTRA example package, pip-installed and selected from config next to the built-ins."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from statistics import mean

import pytest

from pretextual.core.trainer import Trainer
from pretextual.errors import ConfigError
from pretextual.plugins.manager import Plugins

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "pretextual-electra"


def test_rtd_next_to_mlm_trains_and_its_losses_fall(electra, train):
    records = [r for r in train(Plugins(), "objectives.rtd.weight=50", "trainer.lr=1e-3", steps=30)
               if "loss" in r]
    assert len(records) == 30

    def first_last(key):
        return mean(r[key] for r in records[:5]), mean(r[key] for r in records[-5:])

    rtd_first, rtd_last = first_last("loss/rtd")
    assert rtd_first == pytest.approx(0.69, abs=0.1)  # one logit near 0 per position: ln 2
    assert rtd_last < 0.75 * rtd_first  # about 0.62 -> 0.38 in 30 steps
    gen_first, gen_last = first_last("loss/rtd.generator")
    assert gen_last < gen_first - 0.5  # about 5.3 -> 4.3
    mlm_first, mlm_last = first_last("loss/mlm")
    assert mlm_last < mlm_first - 0.5
    for r in records:  # the mix: weighted terms plus the generator's loss with weight 1
        assert r["weight/rtd"] == 50.0
        assert r["loss"] == pytest.approx(r["loss/mlm"] + 50 * r["loss/rtd"] + r["loss/rtd.generator"],
                                          rel=1e-4)
    # mlm masks 15% of the ordinary tokens; the generator's samples replace almost all of them
    assert 0.08 < mean(r["rtd/replaced"] for r in records) < 0.15
    assert mean(r["rtd/accuracy"] for r in records[-5:]) > 0.8


def test_rtd_alone_masks_the_batch_itself(electra, train):
    records = [r for r in train(Plugins(), "objectives.rtd.weight=50", "objectives.rtd.masking=own",
                                "~objectives.mlm", "trainer.lr=1e-3", steps=10) if "loss" in r]
    assert "loss/mlm" not in records[0]
    assert mean(r["loss/rtd"] for r in records[-3:]) < mean(r["loss/rtd"] for r in records[:3]) - 0.05
    assert 0.08 < mean(r["rtd/replaced"] for r in records) < 0.15


def test_rtd_alone_without_its_own_masking_says_what_to_do(electra, train):
    with pytest.raises(ConfigError, match="^objectives.rtd.masking=mix needs an MLM-family objective "
                                          r".* or set objectives.rtd.masking=own$"):
        train(Plugins(), "objectives.rtd.weight=50", "~objectives.mlm", steps=2)


def test_rtd_masking_next_to_mlm_is_refused_at_start(electra, tiny_config):
    cfg = tiny_config("roberta", "objectives.rtd.weight=50", "objectives.rtd.masking=own")
    with pytest.raises(ConfigError, match="mlm and rtd conflict: both corrupt the batch"):
        Trainer(cfg, Plugins(), log=lambda *a: None)


def test_the_example_package_own_tests_pass(electra):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                             str(EXAMPLE / "tests")], capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stdout[-2000:]
    assert result.stdout.splitlines()[-1].startswith("9 passed")
