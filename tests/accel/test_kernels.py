"""The CPU kernels compute what the plain ops compute: dropout's distribution and
gradient, attention with that dropout, and oneDNN's linear layers chosen by CPU vendor."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("numba", reason="the CPU kernels are the pretextual[cpu] extra")

from pretextual.accel import dropout as cpu_dropout  # noqa: E402
from pretextual.accel import onednn  # noqa: E402


def test_onednn_linear_is_chosen_by_cpu_vendor_unless_forced(monkeypatch):
    """Default: oneDNN on AMD CPUs only (where MKL lacks its AVX-512 kernels);
    PRETEXTUAL_ONEDNN_LINEAR=1/0 overrides the choice."""
    monkeypatch.delenv(onednn.ONEDNN_ENV, raising=False)
    monkeypatch.setattr(onednn, "_onednn_forced", None)
    for vendor, wanted in (("GenuineIntel", False), ("AuthenticAMD", True), ("", False)):
        monkeypatch.setattr(onednn, "cpu_vendor", lambda v=vendor: v)
        assert onednn.onednn_linear_wanted() is wanted
        for setting, forced in (("1", True), ("0", False), ("auto", wanted)):
            monkeypatch.setenv(onednn.ONEDNN_ENV, setting)
            assert onednn.onednn_linear_wanted() is forced
        monkeypatch.delenv(onednn.ONEDNN_ENV)


def _scale(p: float) -> float:
    """The scale of kept elements: p is drawn at 2^-32 resolution (at most 1 - 2^-32, so the
    scale stays finite), the scale is that probability's."""
    threshold = min(round(p * 2**32), 2**32 - 1)
    return float(torch.tensor(2**32 / (2**32 - threshold), dtype=torch.float32))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fast_dropout_has_dropouts_distribution_and_gradient(dtype):
    """The CPU dropout (compiled, counter-based mask) drops with probability p, scales by
    1/(1-p), routes the gradient through the same mask, and follows torch.manual_seed."""
    p = 0.1
    x = torch.ones(1000, 1000, dtype=dtype, requires_grad=True)
    torch.manual_seed(0)
    y = cpu_dropout.dropout(x, p, True)
    assert y.dtype == dtype
    dropped = float((y == 0).float().mean())
    assert abs(dropped - p) < 5 * math.sqrt(p * (1 - p) / x.numel())  # 5 sigma
    kept = y[y != 0].float()
    assert torch.equal(kept, torch.full_like(kept, float(torch.tensor(_scale(p)).to(dtype))))
    if dtype == torch.float32:  # the expected value is kept exactly (bf16 rounds the scale)
        assert abs(float(y.detach().mean()) - 1.0) < 5 * math.sqrt(p / (1 - p) / x.numel())
    upstream = torch.randn(x.shape).to(dtype)
    y.backward(upstream)
    assert torch.equal(x.grad, (upstream.float() * (y.detach() != 0) * _scale(p)).to(dtype))
    torch.manual_seed(0)
    assert torch.equal(cpu_dropout.dropout(x, p, True), y)
    assert not torch.equal(cpu_dropout.dropout(x, p, True), y)  # the next call draws afresh
    assert cpu_dropout.dropout(x, p, False) is x


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fast_dropout_is_the_product_with_its_mask_rounded_once(dtype):
    """y = (x * mask) in float32, rounded once to x's dtype, for any values (NaN, inf,
    signs, tiny and huge), as torch computes ``(x * mask).to(dtype)``; nothing but the
    seed is kept for backward (the mask is recomputed)."""
    g = torch.Generator().manual_seed(1)
    x = (torch.randn(64, 333, generator=g) * torch.logspace(-30, 30, 333)).to(dtype)
    x[0, :4] = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0])
    x.requires_grad_()
    torch.manual_seed(5)
    packed = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: packed.append(t) or t, lambda t: t):
        y = cpu_dropout.dropout(x, 0.3, True)
    assert packed == []
    torch.manual_seed(5)
    seed = int(torch.randint(0, 2**62, (1,)).item())  # the draw dropout made
    expected = (x.detach().float() * cpu_dropout.keep_mask(tuple(x.shape), 0.3, seed)).to(dtype)
    assert torch.equal(y.isnan(), expected.isnan())
    assert torch.equal(y.nan_to_num(7.0), expected.nan_to_num(7.0))
    number = ~expected.isnan()  # a NaN's sign bit means nothing
    assert torch.equal(torch.signbit(y)[number], torch.signbit(expected)[number])


def test_dropout_mask_holds_probabilities_near_0_and_1():
    """32-bit draws: the drop rate is p at any p (5 sigma), the scale 1/(1-p) of p
    rounded to 2^-32, the mean 1, and neighbouring decisions are independent."""
    for p in (1e-4, 0.1, 0.5, 0.9999):
        mask = cpu_dropout.keep_mask((2000, 1000), p, seed=1)
        assert float(mask.max()) == pytest.approx(1 / (1 - p), rel=1e-6), p
        drop = (mask == 0).double()
        assert abs(float(drop.mean()) - p) < 5 * math.sqrt(p * (1 - p) / mask.numel()), p
        assert abs(float(mask.double().mean()) - 1.0) < 5 * math.sqrt(p / (1 - p) / mask.numel()), p
        flat = drop.reshape(-1)
        both = float((flat[1:] * flat[:-1]).mean())  # adjacent elements, drawn from adjacent counters
        assert abs(both - p * p) < 5 * math.sqrt(p * p * (1 - p * p) / flat.numel()), p
    assert torch.equal(cpu_dropout.keep_mask((3, 5), 0.1, 7), cpu_dropout.keep_mask((3, 5), 0.1, 7))
    assert not torch.equal(cpu_dropout.keep_mask((100,), 0.5, 7), cpu_dropout.keep_mask((100,), 0.5, 8))
    assert set(cpu_dropout.keep_mask((1000,), 1 - 2**-40, 1).unique().tolist()) <= {0.0, _scale(1 - 2**-40)}


@pytest.mark.parametrize("mask", ["none", "additive", "boolean"])
def test_attention_with_dropout_is_the_written_out_computation(mask):
    """cpu_dropout.attention with dropout (its own CPU path) computes
    dropout(softmax(q k^T / sqrt(d) + bias)) v with dropout's mask, forward and backward."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 7, 4, generator=g, requires_grad=True) for _ in range(3))
    keep = torch.ones(2, 1, 1, 7, dtype=torch.bool)
    keep[1, ..., 5:] = False
    bias = {"none": None, "additive": torch.zeros(keep.shape).masked_fill(~keep, -1e9),
            "boolean": keep}[mask]
    torch.manual_seed(3)
    got = cpu_dropout.attention(q, k, v, bias, 0.25)
    torch.manual_seed(3)
    dropped = cpu_dropout.dropout(torch.ones(2, 3, 7, 7), 0.25, True)  # the same draw
    scores = q @ k.transpose(-1, -2) / 2.0
    if mask != "none":
        scores = scores.masked_fill(~keep, float("-inf"))
    expected = (torch.softmax(scores, -1) * dropped) @ v
    assert (got - expected).abs().max() < 1e-5
    upstream = torch.randn(got.shape, generator=g)
    grads = torch.autograd.grad(got, (q, k, v), upstream)
    reference = torch.autograd.grad(expected, (q, k, v), upstream)
    assert all((a - b).abs().max() < 1e-5 for a, b in zip(grads, reference))
    assert float((dropped == 0).float().mean()) > 0  # some were dropped
    assert torch.equal(cpu_dropout.attention(q, k, v, bias, 0.0),
                       F.scaled_dot_product_attention(q, k, v, attn_mask=bias))


def test_attention_with_dropout_in_bf16_keeps_bf16_probabilities():
    """bf16 attention with dropout gives bf16 outputs and gradients that match the fp32
    computation with the same dropout draw to bf16's precision."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 16, 8, generator=g) for _ in range(3))
    low = [t.bfloat16().requires_grad_(True) for t in (q, k, v)]
    high = [t.bfloat16().float().requires_grad_(True) for t in (q, k, v)]
    torch.manual_seed(3)
    got = cpu_dropout.attention(*low, None, 0.25)
    torch.manual_seed(3)
    expected = cpu_dropout.attention(*high, None, 0.25)
    assert got.dtype == torch.bfloat16
    assert (got.float() - expected).abs().max() < 0.05 * expected.abs().max()
    upstream = torch.randn(got.shape, generator=g)
    grads = torch.autograd.grad(got, low, upstream.bfloat16())
    reference = torch.autograd.grad(expected, high, upstream)
    for a, b in zip(grads, reference):
        assert a.dtype == torch.bfloat16
        assert (a.float() - b).abs().max() < 0.05 * b.abs().max()
