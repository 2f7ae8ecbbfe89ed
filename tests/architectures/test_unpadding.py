"""Unpadded batches in either architecture: the linear layers' FLOPs follow the real
tokens, not the padded shape (only attention sees the padded rows), and padding positions
come out as zeros."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from pretextual.architectures import architecture, sized_config


def model_of(name: str):
    spec = architecture(name)
    torch.manual_seed(0)
    return spec.model(sized_config(spec, "tiny", {}, {}, vocab_size=300, pad_token_id=0)).eval()


def batch(lengths):
    ids = torch.randint(5, 300, (len(lengths), max(lengths)), generator=torch.Generator().manual_seed(0))
    mask = (torch.arange(max(lengths))[None] < torch.tensor(lengths)[:, None]).long()
    return ids.masked_fill(mask == 0, 0), mask


def matmul_flops(model, lengths) -> int:
    """FLOPs of the matrix products outside attention (mm/addmm, not bmm or SDPA)."""
    ids, mask = batch(lengths)
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(ids, mask)
    return sum(v for op, v in counter.get_flop_counts()["Global"].items()
               if str(op).split(".")[-1] in ("mm", "addmm"))


@pytest.mark.parametrize("name", ["bert", "modernbert"])
def test_no_flops_are_spent_on_padding(name):
    model = model_of(name)
    full, half = matmul_flops(model, (40, 40)), matmul_flops(model, (40, 20))
    pooler = 2 * 2 * model.config.hidden_size ** 2 if name == "bert" else 0  # one [CLS] a row
    assert full > 0 and half - pooler == pytest.approx((full - pooler) * 60 / 80)


@pytest.mark.parametrize("name", ["bert", "modernbert"])
def test_padding_positions_are_zeros_and_real_ones_do_not_depend_on_them(name):
    model = model_of(name)
    ids, mask = batch((40, 20))
    with torch.no_grad():
        out = model(ids, mask).last_hidden_state
        alone = model(ids[1:, :20], mask[1:, :20]).last_hidden_state
    assert not out[1, 20:].any()
    assert (out[1, :20] - alone[0]).abs().max() < 1e-5
