"""ELECTRA's replaced-token detection (Clark et al. 2020) as a pretextual objective, ``rtd``.

A small generator, trained by masked language modelling, fills the masked positions
with tokens it samples; the encoder, as the discriminator, reads the corrupted
sequence in a second forward pass and predicts at every non-padding position whether
the token is the original or a replacement. As in ELECTRA, the generator shares the
encoder's word embeddings and is ``generator_size_divisor`` times narrower. The
encoder may be of any architecture (bert, modernbert): the generator is a narrow BERT
of its own over the shared word-embedding table.

Masking: pretextual lets one objective of a mix corrupt the batch. With
``masking=mix`` (the default) rtd uses the ``mlm_labels`` of the MLM-family objective
selected next to it (mlm, wwm or span); alone, set ``masking=own`` and rtd masks
``mask_prob`` of the tokens itself, all with [MASK] as ELECTRA does.

Losses: ``loss/rtd`` is the discriminator's binary cross-entropy (ELECTRA weights it
50: ``objectives.rtd.weight=50``); the generator's MLM loss is added with weight 1 as
``loss/rtd.generator``. No gradient flows through the sampling.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from pretextual import (BuildContext, ConfigError, Encoder, Objective, ObjectiveOutput, ObjectiveSpec,
                        StepInputs, Vocab, hookimpl)
from pretextual.architectures.bert import BertConfig, BertEncoder
from pretextual.objectives.mlm import IGNORE_INDEX, replace_selected, select_tokens

MASKINGS = ("mix", "own")


@dataclass
class RTDOptions:
    generator_size_divisor: int = 4
    """The generator's hidden size, attention heads and feed-forward size are the encoder's divided by this (ELECTRA found 1/4 to 1/2 best)."""
    masking: str = "mix"
    """'mix': use the masking of the MLM-family objective in the mix (mlm, wwm, span); 'own': mask the batch itself, for rtd without one."""
    mask_prob: float = 0.15
    """With masking=own: share of the ordinary tokens of each sequence the generator fills in."""


class Generator(nn.Module):
    """A narrow BERT over the encoder's own word embeddings, with an MLM head tied to them."""

    def __init__(self, encoder: Encoder, divisor: int):
        super().__init__()
        c = encoder.config
        small = BertConfig(vocab_size=c.vocab_size, hidden_size=c.hidden_size // divisor,
                           num_hidden_layers=c.num_hidden_layers,
                           num_attention_heads=max(1, c.num_attention_heads // divisor),
                           intermediate_size=c.intermediate_size // divisor,
                           max_position_embeddings=c.max_position_embeddings,
                           initializer_range=c.initializer_range)
        # Shared with the encoder as in ELECTRA, and kept out of this module's parameters
        # so the table is saved and counted once (by the encoder).
        self.__dict__["word_embeddings"] = encoder.get_input_embeddings()
        self.position_embeddings = nn.Embedding(c.max_position_embeddings, c.hidden_size)
        self.embeddings_norm = nn.LayerNorm(c.hidden_size, eps=small.layer_norm_eps)
        self.project = nn.Linear(c.hidden_size, small.hidden_size)
        self.encoder = BertEncoder(small)
        self.dense = nn.Linear(small.hidden_size, c.hidden_size)
        self.LayerNorm = nn.LayerNorm(c.hidden_size, eps=small.layer_norm_eps)
        self.bias = nn.Parameter(torch.zeros(c.vocab_size))
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=c.initializer_range)
            if isinstance(module, nn.Linear):
                nn.init.zeros_(module.bias)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                where: torch.Tensor) -> torch.Tensor:
        """Vocabulary logits at the ``where`` positions only: [n_where, vocab]."""
        b, n = input_ids.shape
        positions = torch.arange(n, device=input_ids.device)
        x = self.embeddings_norm(self.word_embeddings(input_ids) + self.position_embeddings(positions))
        every = torch.arange(b * n, device=input_ids.device)  # BertEncoder's flat token positions
        x = self.encoder(self.project(x).flatten(0, 1), every, (b, n),
                         attention_mask.bool()[:, None, None, :]).view(b, n, -1)
        h = self.LayerNorm(F.gelu(self.dense(x[where])))
        return F.linear(h, self.word_embeddings.weight, self.bias)


class DiscriminatorHead(nn.Module):
    """ELECTRA's discriminator head: dense and GELU, then one logit per position."""

    def __init__(self, encoder: Encoder):
        super().__init__()
        c = encoder.config
        self.dense = nn.Linear(c.hidden_size, c.hidden_size)
        self.out = nn.Linear(c.hidden_size, 1)
        for module in (self.dense, self.out):
            nn.init.normal_(module.weight, std=c.initializer_range)
            nn.init.zeros_(module.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.out(F.gelu(self.dense(hidden))).squeeze(-1)


def rtd_loss(inputs: StepInputs, vocab: Vocab) -> ObjectiveOutput:
    """Generator MLM loss, sampled replacements, then the discriminator's loss on every position."""
    batch = inputs.batch
    labels = batch["mlm_labels"]
    masked = labels != IGNORE_INDEX
    attention_mask, token_type_ids = batch["attention_mask"], batch["token_type_ids"]

    gen_logits = inputs.heads["rtd_generator"](batch["input_ids"], attention_mask, masked).float()
    target = labels[masked]
    gen_loss = F.cross_entropy(gen_logits, target)
    with torch.no_grad():  # ELECTRA samples (argmax would be too easy to detect); never a special token
        gen_logits[:, list(vocab.special_ids)] = float("-inf")
        sampled = torch.multinomial(gen_logits.softmax(-1), 1).squeeze(1)
    original = torch.where(masked, labels, batch["input_ids"])
    corrupted = original.masked_scatter(masked, sampled)
    replaced = corrupted != original  # a sampled original token counts as original, as in ELECTRA

    output = inputs.encoder(input_ids=corrupted, attention_mask=attention_mask,
                            token_type_ids=token_type_ids)
    real = attention_mask.bool()
    logits = inputs.heads["rtd_discriminator"](output.last_hidden_state[real]).float()
    is_replaced = replaced[real].float()
    loss = F.binary_cross_entropy_with_logits(logits, is_replaced)
    return ObjectiveOutput(
        loss=loss, aux_losses={"generator": gen_loss},
        metrics={"accuracy": ((logits > 0).float() == is_replaced).float().mean(),
                 "replaced": is_replaced.mean(),
                 "generator_accuracy": (sampled == target).float().mean()})


def build(options: RTDOptions, context: BuildContext) -> Objective:
    """Check the options against the encoder's sizes; mask the batch only with masking=own."""
    if options.masking not in MASKINGS:
        raise ConfigError(f"objectives.rtd.masking: expected one of {', '.join(MASKINGS)}, "
                          f"got {options.masking!r}")
    c, d = context.encoder_config, options.generator_size_divisor
    if d < 1 or c.hidden_size % d or (c.hidden_size // d) % max(1, c.num_attention_heads // d):
        raise ConfigError(f"objectives.rtd.generator_size_divisor={d} does not divide the encoder "
                          f"(hidden size {c.hidden_size}, {c.num_attention_heads} heads) evenly")
    if not 0.0 < options.mask_prob < 1.0:
        raise ConfigError(f"objectives.rtd.mask_prob must be in (0, 1), got {options.mask_prob}")
    if options.masking == "mix" and not {"mlm", "wwm", "span"} & set(context.objectives):
        raise ConfigError("objectives.rtd.masking=mix needs an MLM-family objective (mlm, wwm, span) "
                          "in the mix; add one (objectives.mlm.weight=1) or set "
                          "objectives.rtd.masking=own")

    def mask(batch, generator):  # every selected token becomes [MASK], as in ELECTRA
        selected = select_tokens(batch, options.mask_prob, generator)
        return replace_selected(batch, selected, context.vocab, 1.0, 0.0, generator)

    return Objective(loss=partial(rtd_loss, vocab=context.vocab),
                     batch_transform=mask if options.masking == "own" else None,
                     heads={"rtd_generator": partial(Generator, divisor=d),
                            "rtd_discriminator": DiscriminatorHead})


@hookimpl
def pretextual_register_objectives(register):
    register(ObjectiveSpec(
        name="rtd", build=build, options=RTDOptions,
        provides=lambda options: ("batch_transform",) if options.masking == "own" else (),
        description="ELECTRA replaced-token detection: a small generator fills in masked "
                    "tokens, the encoder tells replaced from original at every position"))
