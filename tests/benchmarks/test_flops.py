"""The FLOP accounting behind the MFU rows (benchmarks/flops.py)."""

from __future__ import annotations

import pytest
import torch

from benchmarks import flops as F


@pytest.mark.parametrize("sizes, rel", [((4, 256, 4, 1024, 30522, 32, 128, 608), 5e-3),
                                        ((2, 64, 2, 256, 1000, 4, 32, 20), 2e-2)],
                         ids=["reference", "smoke"])
def test_step_matmul_replay_does_the_useful_flops(sizes, rel):
    layers, hidden, heads, intermediate, vocab, batch, seq, predictions = sizes
    replay = F.step_gemms(layers, hidden, heads, intermediate, vocab, batch, seq, predictions,
                          torch.float32, torch.device("cpu"))
    useful = F.StepWork(layers, hidden, intermediate, vocab, (seq,) * batch, predictions,
                        sentence_head=True).flops()
    # The useful count also has 6N for LayerNorm parameters and biases, which no matmul does
    # (a larger share at small hidden sizes).
    assert replay() == pytest.approx(useful, rel=rel)
    assert replay() < useful


def test_gemm_cases_repeat_until_the_asked_flops():
    cases, meta = F.gemm_cases([(64, 32, 16), (128, 128, 128)], torch.device("cpu"), min_flops=1e7)
    for name, (_, _, (m, k, n)) in meta.items():
        calls = -(-int(1e7) // (2 * m * k * n))
        assert cases[name]() == 2.0 * m * k * n * calls, name
