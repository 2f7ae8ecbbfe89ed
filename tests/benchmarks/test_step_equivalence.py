"""The optimised training step gives the same losses as the straightforward one.

"Optimised" is what pretextual runs: the Trainer's model, objective mix and
optimizer (fused QKV GEMM, oneDNN linear layers on AMD CPUs, the attention mask
dropped when nothing is padded, the MLM loss fused and computed only at the
labelled positions). "Straightforward" is written out below in plain torch:
separate Q/K/V projections, explicit softmax attention with a boolean mask,
MLM logits at every position with ``ignore_index``, the per-parameter
(for-loop) AdamW. Same weights, same batches, dropout off; losses are compared
step after step (so gradients and optimizer updates are compared too), and
Hugging Face's BertForPreTraining is a second reference when installed.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from pretextual.core import fastpath
from pretextual.core.trainer import Trainer
from pretextual.objectives import mlm as mlm_module

STEPS = 3
NO_DROPOUT = ("model.hidden_dropout_prob=0", "model.attention_probs_dropout_prob=0")


def straightforward_loss(p: dict[str, torch.Tensor], batch: dict[str, torch.Tensor], heads: int,
                         eps: float) -> torch.Tensor:
    """BERT pretraining loss (MLM + NSP) from the parameters, the obvious way."""
    ids, types = batch["input_ids"], batch["token_type_ids"]
    keep = batch["attention_mask"].bool()[:, None, None, :]
    b, n = ids.shape
    x = (p["bert.embeddings.word_embeddings.weight"][ids]
         + p["bert.embeddings.position_embeddings.weight"][torch.arange(n)][None]
         + p["bert.embeddings.token_type_embeddings.weight"][types])
    hidden = x.shape[-1]
    ln = lambda t, name: F.layer_norm(t, (hidden,), p[f"{name}.weight"], p[f"{name}.bias"], eps)
    lin = lambda t, name: t @ p[f"{name}.weight"].t() + p[f"{name}.bias"]
    x = ln(x, "bert.embeddings.LayerNorm")
    layers = 1 + max(int(k.split(".")[3]) for k in p if k.startswith("bert.encoder.layer."))
    d = hidden // heads
    for i in range(layers):
        pre = f"bert.encoder.layer.{i}"
        split = lambda t: t.view(b, n, heads, d).transpose(1, 2)
        q = split(lin(x, f"{pre}.attention.self.query"))
        k = split(lin(x, f"{pre}.attention.self.key"))
        v = split(lin(x, f"{pre}.attention.self.value"))
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(d)
        scores = scores.masked_fill(~keep, float("-inf"))
        attended = (torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(b, n, hidden)
        x = ln(lin(attended, f"{pre}.attention.output.dense") + x, f"{pre}.attention.output.LayerNorm")
        inner = F.gelu(lin(x, f"{pre}.intermediate.dense"))
        x = ln(lin(inner, f"{pre}.output.dense") + x, f"{pre}.output.LayerNorm")
    pooled = torch.tanh(lin(x[:, 0], "bert.pooler.dense"))
    t = ln(F.gelu(lin(x, "heads.mlm.transform.dense")), "heads.mlm.transform.LayerNorm")
    logits = t @ p["bert.embeddings.word_embeddings.weight"].t() + p["heads.mlm.bias"]  # every position
    mlm = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(),
                          batch["mlm_labels"].reshape(-1), ignore_index=-100)
    nsp = F.cross_entropy(lin(pooled, "heads.nsp").float(), batch["next_sentence_label"])
    return mlm + nsp


def optimised_step(trainer: Trainer, batch, bf16: bool) -> float:
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        total, _ = trainer.forward(batch, 0)
    total.backward()
    torch.nn.utils.clip_grad_norm_(trainer.model.parameters(), trainer.cfg.trainer.max_grad_norm)
    trainer.optimizer.step()
    trainer.optimizer.zero_grad(set_to_none=True)
    return float(total.detach())


class Straightforward:
    """The reference: its own copy of the weights and a for-loop AdamW with the trainer's settings."""

    def __init__(self, trainer: Trainer):
        self.trainer = trainer
        self.params = {k: v.detach().clone().requires_grad_(True)
                       for k, v in trainer.model.named_parameters()}
        t = trainer.cfg.trainer
        decay = [v for v in self.params.values() if v.ndim >= 2]
        no_decay = [v for v in self.params.values() if v.ndim < 2]
        self.optimizer = torch.optim.AdamW(
            [{"params": decay, "weight_decay": t.weight_decay},
             {"params": no_decay, "weight_decay": 0.0}],
            lr=trainer.optimizer.param_groups[0]["lr"], betas=(t.adam_beta1, t.adam_beta2),
            eps=t.adam_eps, foreach=False, fused=False)

    def step(self, batch, bf16: bool) -> float:
        config = self.trainer.encoder_config
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = straightforward_loss(self.params, batch, config.num_attention_heads,
                                        config.layer_norm_eps)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(self.params.values()),
                                       self.trainer.cfg.trainer.max_grad_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(loss.detach())


def full_batch(trainer: Trainer, seed: int = 0):
    """A batch with no padding at all (the path where attention drops its mask)."""
    vocab, rows, length = trainer.vocab, 8, 32
    g = torch.Generator().manual_seed(seed)
    ordinary = vocab.ordinary_ids()
    ids = ordinary[torch.randint(len(ordinary), (rows, length), generator=g)]
    ids[:, 0], ids[:, 15], ids[:, -1] = vocab.cls_id, vocab.sep_id, vocab.sep_id
    positions = torch.arange(length)[None].expand(rows, length)
    batch = {"input_ids": ids, "attention_mask": torch.ones(rows, length, dtype=torch.long),
             "token_type_ids": (positions > 15).long(),
             "special_tokens_mask": (positions == 0) | (positions == 15) | (positions == length - 1),
             "word_starts": torch.ones(rows, length, dtype=torch.bool),
             "next_sentence_label": torch.randint(0, 2, (rows,), generator=g)}
    return trainer.mix.batch_transform(batch, torch.Generator().manual_seed(seed + 1))


def batches(trainer: Trainer, kind: str):
    if kind == "padded":
        found = [trainer.train_batches[i] for i in range(STEPS)]
        assert any(not b["attention_mask"].bool().all() for b in found), "want padding in the batches"
        return found
    return [full_batch(trainer, seed) for seed in range(STEPS)]


@pytest.fixture
def trainer(tiny_config):
    def make(*overrides):
        return Trainer(tiny_config("bert", *NO_DROPOUT, *overrides), log=lambda *_: None)
    return make


@pytest.mark.parametrize("kind", ["padded", "full"])
def test_optimised_step_gives_the_straightforward_losses_fp32(trainer, kind, monkeypatch):
    # Several row chunks in the fused MLM loss, as with a real vocabulary.
    monkeypatch.setattr(mlm_module, "CHUNK_BYTES", 4 * 300 * 5)
    t = trainer()
    reference = Straightforward(t)
    for batch in batches(t, kind):
        got, expected = optimised_step(t, batch, False), reference.step(batch, False)
        assert got == pytest.approx(expected, rel=1e-5, abs=1e-5)


def test_optimised_step_gives_the_straightforward_losses_bf16(trainer):
    t = trainer()
    reference = Straightforward(t)
    for batch in batches(t, "padded"):
        got, expected = optimised_step(t, batch, True), reference.step(batch, True)
        # bf16 keeps 8 bits of mantissa; the two paths round at different places.
        assert got == pytest.approx(expected, rel=2e-2)


@pytest.mark.parametrize("onednn", [True, False], ids=["onednn", "f.linear"])
def test_gradients_match_the_straightforward_ones(trainer, onednn):
    fastpath.set_onednn_linear(onednn)
    if onednn and not fastpath.onednn_linear_active():
        fastpath.set_onednn_linear(None)
        pytest.skip("this torch has no usable oneDNN linear")
    try:
        check_gradients(trainer())
    finally:
        fastpath.set_onednn_linear(None)


def check_gradients(t: Trainer) -> None:
    reference = Straightforward(t)
    batch = batches(t, "padded")[0]
    total, _ = t.forward(batch, 0)
    total.backward()
    loss = straightforward_loss(reference.params, batch, t.encoder_config.num_attention_heads,
                                t.encoder_config.layer_norm_eps)
    loss.backward()
    for name, p in t.model.named_parameters():
        expected = reference.params[name].grad
        assert p.grad is not None, name
        scale = expected.abs().max().clamp_min(1e-6)
        assert (p.grad - expected).abs().max() / scale < 1e-4, name


def test_fallback_paths_agree_with_the_fast_ones(trainer):
    """oneDNN linear layers on (the default on AMD CPUs) and off (F.linear
    everywhere, the default elsewhere) give the same losses."""
    fastpath.set_onednn_linear(True)
    try:
        if not fastpath.onednn_linear_active():
            pytest.skip("this torch has no usable oneDNN linear")
        onednn, plain = trainer(), trainer()
        for batch in batches(onednn, "padded"):
            fastpath.set_onednn_linear(True)
            got = optimised_step(onednn, batch, False)
            fastpath.set_onednn_linear(False)
            assert not fastpath.onednn_linear_active()
            assert got == pytest.approx(optimised_step(plain, batch, False), rel=1e-5, abs=1e-5)
    finally:
        fastpath.set_onednn_linear(None)


def test_onednn_linear_is_chosen_by_cpu_vendor_unless_forced(monkeypatch):
    """Default: oneDNN on AMD CPUs only (where MKL lacks its AVX-512 kernels);
    PRETEXTUAL_ONEDNN_LINEAR=1/0 overrides the choice."""
    monkeypatch.delenv(fastpath.ONEDNN_ENV, raising=False)
    monkeypatch.setattr(fastpath, "_onednn_forced", None)
    for vendor, wanted in (("GenuineIntel", False), ("AuthenticAMD", True), ("", False)):
        monkeypatch.setattr(fastpath, "cpu_vendor", lambda v=vendor: v)
        assert fastpath.onednn_linear_wanted() is wanted
        for setting, forced in (("1", True), ("0", False), ("auto", wanted)):
            monkeypatch.setenv(fastpath.ONEDNN_ENV, setting)
            assert fastpath.onednn_linear_wanted() is forced
        monkeypatch.delenv(fastpath.ONEDNN_ENV)


def test_same_losses_as_hugging_face_bert_for_pretraining(trainer):
    transformers = pytest.importorskip("transformers")
    t = trainer()
    c = t.encoder_config
    hf = transformers.BertForPreTraining(transformers.BertConfig(
        **{**c.to_dict(), "attn_implementation": "sdpa"})).train()
    state = {}
    for k, v in t.model.state_dict().items():
        k = k.replace("heads.mlm.", "cls.predictions.").replace("heads.nsp.", "cls.seq_relationship.")
        state[k] = v.clone()
    missing, unexpected = hf.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"cls.predictions.decoder.weight",
                                               "cls.predictions.decoder.bias"}
    tc = t.cfg.trainer
    no_decay = [p for n, p in hf.named_parameters() if p.ndim < 2]
    decay = [p for n, p in hf.named_parameters() if p.ndim >= 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": tc.weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}],
                                  lr=t.optimizer.param_groups[0]["lr"],
                                  betas=(tc.adam_beta1, tc.adam_beta2), eps=tc.adam_eps)
    for batch in batches(t, "padded"):
        loss = hf(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                  token_type_ids=batch["token_type_ids"], labels=batch["mlm_labels"],
                  next_sentence_label=batch["next_sentence_label"]).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(hf.parameters(), tc.max_grad_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        assert optimised_step(t, batch, False) == pytest.approx(float(loss.detach()), rel=1e-5, abs=1e-5)


def test_compiled_encoder_gives_the_same_losses(trainer):
    """trainer.compile=true (torch.compile of the encoder) gives the same losses as eager:
    the fast paths step aside under compilation (plain F.linear and SDPA), so the
    compiled graph computes the same function."""
    eager, compiled = trainer(), trainer("trainer.compile=true")
    # nn.Module.compile() keeps the module and stores the compiled call beside it.
    assert compiled.model.bert._compiled_call_impl is not None
    assert eager.model.bert._compiled_call_impl is None
    try:
        for batch in batches(eager, "full"):  # one shape: one compilation
            expected = optimised_step(eager, batch, False)
            assert optimised_step(compiled, batch, False) == pytest.approx(expected, rel=1e-5, abs=1e-5)
    except Exception as exc:  # no C++ compiler, or an inductor limitation of this platform
        if "Compiler" in type(exc).__name__ or "compiler" in str(exc).lower()[:500]:
            pytest.skip(f"torch.compile unavailable here: {type(exc).__name__}")
        raise
    assert set(compiled.model.state_dict()) == set(eager.model.state_dict())


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
    y = fastpath.dropout(x, p, True)
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
    assert torch.equal(fastpath.dropout(x, p, True), y)
    assert not torch.equal(fastpath.dropout(x, p, True), y)  # the next call draws afresh
    assert fastpath.dropout(x, p, False) is x


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
        y = fastpath.dropout(x, 0.3, True)
    assert packed == []
    torch.manual_seed(5)
    seed = int(torch.randint(0, 2**62, (1,)).item())  # the draw dropout made
    expected = (x.detach().float() * fastpath.keep_mask(tuple(x.shape), 0.3, seed)).to(dtype)
    assert torch.equal(y.isnan(), expected.isnan())
    assert torch.equal(y.nan_to_num(7.0), expected.nan_to_num(7.0))
    number = ~expected.isnan()  # a NaN's sign bit means nothing
    assert torch.equal(torch.signbit(y)[number], torch.signbit(expected)[number])


def test_dropout_mask_holds_probabilities_near_0_and_1():
    """32-bit draws: the drop rate is p at any p (5 sigma), the scale 1/(1-p) of p
    rounded to 2^-32, the mean 1, and neighbouring decisions are independent."""
    for p in (1e-4, 0.1, 0.5, 0.9999):
        mask = fastpath.keep_mask((2000, 1000), p, seed=1)
        assert float(mask.max()) == pytest.approx(1 / (1 - p), rel=1e-6), p
        drop = (mask == 0).double()
        assert abs(float(drop.mean()) - p) < 5 * math.sqrt(p * (1 - p) / mask.numel()), p
        assert abs(float(mask.double().mean()) - 1.0) < 5 * math.sqrt(p / (1 - p) / mask.numel()), p
        flat = drop.reshape(-1)
        both = float((flat[1:] * flat[:-1]).mean())  # adjacent elements, drawn from adjacent counters
        assert abs(both - p * p) < 5 * math.sqrt(p * p * (1 - p * p) / flat.numel()), p
    assert torch.equal(fastpath.keep_mask((3, 5), 0.1, 7), fastpath.keep_mask((3, 5), 0.1, 7))
    assert not torch.equal(fastpath.keep_mask((100,), 0.5, 7), fastpath.keep_mask((100,), 0.5, 8))
    assert set(fastpath.keep_mask((1000,), 1 - 2**-40, 1).unique().tolist()) <= {0.0, _scale(1 - 2**-40)}


@pytest.mark.parametrize("mask", ["none", "additive", "boolean"])
def test_attention_with_dropout_is_the_written_out_computation(mask):
    """fastpath.attention with dropout (its own CPU path) computes
    dropout(softmax(q k^T / sqrt(d) + bias)) v with dropout's mask, forward and backward."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 7, 4, generator=g, requires_grad=True) for _ in range(3))
    keep = torch.ones(2, 1, 1, 7, dtype=torch.bool)
    keep[1, ..., 5:] = False
    bias = {"none": None, "additive": torch.zeros(keep.shape).masked_fill(~keep, -1e9),
            "boolean": keep}[mask]
    torch.manual_seed(3)
    got = fastpath.attention(q, k, v, bias, 0.25)
    torch.manual_seed(3)
    dropped = fastpath.dropout(torch.ones(2, 3, 7, 7), 0.25, True)  # the same draw
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
    assert torch.equal(fastpath.attention(q, k, v, bias, 0.0),
                       F.scaled_dot_product_attention(q, k, v, attn_mask=bias))


def test_attention_with_dropout_in_bf16_keeps_bf16_probabilities():
    """bf16 attention with dropout gives bf16 outputs and gradients that match the fp32
    computation with the same dropout draw to bf16's precision."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 16, 8, generator=g) for _ in range(3))
    low = [t.bfloat16().requires_grad_(True) for t in (q, k, v)]
    high = [t.bfloat16().float().requires_grad_(True) for t in (q, k, v)]
    torch.manual_seed(3)
    got = fastpath.attention(*low, None, 0.25)
    torch.manual_seed(3)
    expected = fastpath.attention(*high, None, 0.25)
    assert got.dtype == torch.bfloat16
    assert (got.float() - expected).abs().max() < 0.05 * expected.abs().max()
    upstream = torch.randn(got.shape, generator=g)
    grads = torch.autograd.grad(got, low, upstream.bfloat16())
    reference = torch.autograd.grad(expected, high, upstream)
    for a, b in zip(grads, reference):
        assert a.dtype == torch.bfloat16
        assert (a.float() - b).abs().max() < 0.05 * b.abs().max()
