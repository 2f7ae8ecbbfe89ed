"""The fused MLM loss equals F.cross_entropy of the plain head's logits."""

from __future__ import annotations

import pytest
import torch

from pretextual.accel.fused_loss import FusedMLMHead
from pretextual.core.encoder import BertModel, preset_config


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_fused_head_loss_and_gradients_equal_plain_cross_entropy(dtype):
    """FusedMLMHead.loss_and_accuracy (fused, chunked) against F.cross_entropy of the plain
    projection in fp32: loss, accuracy and the gradients of input, tied weight and bias.
    Under bf16 autocast the GEMMs round to bf16, but the bias gradient is summed from
    fp32 probabilities, so it keeps fp32's accuracy."""
    torch.manual_seed(0)
    config = preset_config("tiny", vocab_size=3000)
    encoder = BertModel(config)
    head = FusedMLMHead(encoder)
    with torch.no_grad():
        head.bias.normal_(std=0.5)  # a bias that matters, not BERT's zeros
    hidden = torch.randn(300, config.hidden_size)
    target = torch.randint(0, config.vocab_size, (300,))
    target[:20] = head(hidden[:20]).argmax(-1)  # some hits, so accuracy is not 0
    params = [hidden.requires_grad_(), encoder.embeddings.word_embeddings.weight, head.bias]

    upstream = torch.tensor(0.37)  # a loss weight: backward scales by it
    logits = head(hidden)
    expected_loss = torch.nn.functional.cross_entropy(logits, target)
    expected_accuracy = (logits.argmax(-1) == target).float().mean()
    expected = torch.autograd.grad(expected_loss, params, upstream)

    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
        loss, accuracy = head.loss_and_accuracy(hidden, target)
    got = torch.autograd.grad(loss, params, upstream, retain_graph=True)
    again = torch.autograd.grad(loss, params, upstream)  # backward leaves what it saved as it was
    assert all(torch.equal(a, g) for a, g in zip(again, got))

    close = 1e-5 if dtype == torch.float32 else 2e-2  # bf16 keeps 8 bits of mantissa
    assert float(loss.detach()) == pytest.approx(float(expected_loss.detach()), rel=close)
    assert float(accuracy.detach()) == pytest.approx(float(expected_accuracy.detach()), abs=0.02 if close > 1e-5 else 0)
    for name, g, e in zip(("hidden", "weight", "bias"), got, expected):
        error = float((g.float() - e).abs().max() / e.abs().max())
        assert error < (1e-5 if name == "bias" else close), (name, error)
