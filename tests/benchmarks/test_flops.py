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


@pytest.mark.parametrize("m, k, n", [(96, 16, 48), (96, 48, 16)], ids=["wider-out", "wider-in"])
def test_step_matmul_replay_computes_each_linear_layers_products(m, k, n):
    g = torch.Generator().manual_seed(0)
    x, w, grad = (torch.randn(*s, generator=g) for s in ((m, k), (n, k), (m, n)))
    forward, grad_input, grad_weight = (mm() for mm in F.linear_gemms(x, w, grad))
    torch.testing.assert_close(forward, x @ w.t())
    torch.testing.assert_close(grad_input, grad @ w)
    torch.testing.assert_close(grad_weight, grad.t() @ x)


def test_the_onednn_peak_case_computes_a_linear_layer():
    dnn = F.onednn_linear_op()
    if dnn is None:
        pytest.skip("this torch has no oneDNN linear")
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(32, 16, generator=g), torch.randn(8, 16, generator=g)
    torch.testing.assert_close(dnn(x, w, None, "none", [], ""), x @ w.t())
