"""The Trainer's training step, eager and under torch.compile, gives the same losses as
a straightforward one.

The Trainer's model is nn.Linear, SDPA and the MLM loss as F.cross_entropy at the
labelled positions. "Straightforward" is written out below in plain torch: separate Q/K/V projections, explicit softmax
attention with a boolean mask, MLM logits at every position with ``ignore_index``, the
per-parameter (for-loop) AdamW. Same weights, same batches, dropout off; losses are
compared step after step (so gradients and optimizer updates are compared too), and
Hugging Face's BertForPreTraining is a second reference when installed.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from pretextual.core.trainer import Trainer

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
    """A batch with no padding at all (attention's mask all true)."""
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
def test_the_step_gives_the_straightforward_losses_fp32(trainer, kind):
    t = trainer()
    reference = Straightforward(t)
    for batch in batches(t, kind):
        got, expected = optimised_step(t, batch, False), reference.step(batch, False)
        assert got == pytest.approx(expected, rel=1e-5, abs=1e-5)


def test_the_step_gives_the_straightforward_losses_bf16(trainer):
    t = trainer()
    reference = Straightforward(t)
    for batch in batches(t, "padded"):
        got, expected = optimised_step(t, batch, True), reference.step(batch, True)
        # bf16 keeps 8 bits of mantissa; the two paths round at different places.
        assert got == pytest.approx(expected, rel=2e-2)


def test_the_gradients_match_the_straightforward_ones(trainer):
    check_gradients(trainer())


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
    """trainer.compile=true (torch.compile of the plain encoder) gives the same losses as eager."""
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
    assert compiled.accelerations[-1] == "torch.compile"
