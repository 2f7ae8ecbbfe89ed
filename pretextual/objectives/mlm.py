"""Masked language modelling (BERT, Devlin et al. 2019, section 3.1).

Hides ``mask_prob`` of the ordinary tokens of each sequence; of those,
``mask_ratio`` become [MASK], ``random_ratio`` a random ordinary token and the
rest stay unchanged. The head predicts the original token at the selected
positions only (sparse prediction, as Google's run_pretraining.py does).

The head and the loss are shared with whole-word and span masking; the masking
itself (choosing positions, the 80/10/10 replacement) is in masking.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from pretextual.core.encoder import BertModel
from pretextual.core.fastpath import linear
from pretextual.errors import ConfigError
from pretextual.objectives.masking import IGNORE_INDEX, mask_tokens, replace_selected, select_tokens
from pretextual.plugins.api import (Batch, BuildContext, Objective, ObjectiveOutput, ObjectiveSpec,
                                    StepInputs)
from pretextual.plugins.hookspecs import hookimpl

# What plugins reuse (docs/plugins.md); select_tokens and replace_selected live in masking.py.
__all__ = ["IGNORE_INDEX", "MLMHead", "MLMOptions", "build", "check_masking_options",
           "masked_lm_loss", "replace_selected", "select_tokens"]


@dataclass
class MLMOptions:
    mask_prob: float = 0.15
    """Share of the ordinary (non-special, non-padding) tokens of each sequence to predict."""
    mask_ratio: float = 0.8
    """Share of the selected tokens replaced by [MASK]."""
    random_ratio: float = 0.1
    """Share of the selected tokens replaced by a random ordinary token (the rest stay)."""

    def check(self, name: str) -> None:
        """Called by the core when the config is checked: see check_masking_options."""
        check_masking_options(name, self)


def check_masking_options(name: str, options) -> None:
    """Raise ConfigError naming the key for an impossible masking configuration."""
    if not 0.0 < options.mask_prob < 1.0:
        raise ConfigError(f"objectives.{name}.mask_prob must be in (0, 1), got {options.mask_prob}")
    for key in ("mask_ratio", "random_ratio"):
        if not 0.0 <= getattr(options, key) <= 1.0:
            raise ConfigError(f"objectives.{name}.{key} must be in [0, 1], got {getattr(options, key)}")
    if options.mask_ratio + options.random_ratio > 1.0 + 1e-9:
        raise ConfigError(f"objectives.{name}.mask_ratio + objectives.{name}.random_ratio must be "
                          f"<= 1, got {options.mask_ratio} + {options.random_ratio}")


class MLMHeadTransform(nn.Module):
    def __init__(self, hidden_size: int, eps: float):
        super().__init__()
        self.dense = nn.Linear(hidden_size, hidden_size)
        self.LayerNorm = nn.LayerNorm(hidden_size, eps=eps)

    def forward(self, x):
        return self.LayerNorm(F.gelu(linear(x, self.dense.weight, self.dense.bias)))


class MLMHead(nn.Module):
    """Hugging Face's BertLMPredictionHead: transform, then the vocabulary
    projection tied to the word embeddings, plus a per-token bias."""

    def __init__(self, encoder: BertModel):
        super().__init__()
        config = encoder.config
        self.transform = MLMHeadTransform(config.hidden_size, config.layer_norm_eps)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))
        # Tied to the encoder's word embeddings: kept outside this module's own
        # parameters and state dict, so it is saved and counted once.
        self.__dict__["word_embeddings"] = encoder.embeddings.word_embeddings
        nn.init.normal_(self.transform.dense.weight, std=config.initializer_range)
        nn.init.zeros_(self.transform.dense.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return linear(self.transform(hidden), self.word_embeddings.weight, self.bias)

    def loss_and_accuracy(self, hidden: torch.Tensor, target: torch.Tensor
                          ) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean cross-entropy of ``forward(hidden)`` against ``target`` and the share
        of positions whose highest logit is the target, without materialising
        the loss's intermediate [n, vocab] tensors (see :class:`_VocabCrossEntropy`)."""
        x = self.transform(hidden)
        dtype = _compute_dtype(x)
        return _VocabCrossEntropy.apply(x, self.word_embeddings.weight, self.bias, target, dtype)


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype a linear layer computes in here: autocast's when it is on."""
    device = x.device.type
    return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else x.dtype


CHUNK_BYTES = 4 << 20
"""Rows of logits handled at once by the fused loss: about this many bytes of fp32 (cache-sized)."""


class _VocabCrossEntropy(torch.autograd.Function):
    """Cross-entropy of the vocabulary projection, fused.

    Equal to ``F.cross_entropy(F.linear(x, weight, bias).float(), target)``
    (and ``argmax == target``), computed as: one GEMM for the logits (in
    autocast's dtype when it is on, as F.linear would), then row chunks of a
    few MB, each while it is in cache: max, exp, row sums, the
    log-sum-exp, the loss, and, when a gradient is wanted, the gradient of the
    mean loss with respect to the logits (softmax - one-hot) / n, written over
    the logits, and its column sums in fp32 (the bias gradient). Backward is
    two GEMMs, scaled by the incoming gradient. Compared with log_softmax +
    nll_loss this skips the zero-filled [n, vocab] gradient, the separate
    log-probability tensor, a cast of the logits to fp32 under bf16, and second
    passes for the argmax and the bias gradient.
    """

    @staticmethod
    def forward(ctx, x, weight, bias, target, dtype):
        device = x.device.type
        with torch.autocast(device, enabled=False):
            xc, wc = x.to(dtype), weight.to(dtype)
            # On the CPU the bias is added in fp32 per chunk, not by the GEMM: no [n, vocab]
            # broadcast copy of it before the product (a fifth of the GEMM's time). In fp32 on
            # a GPU the GEMM adds it (an epilogue); in bf16 it is added per chunk everywhere.
            in_gemm = dtype == torch.float32 and x.device.type != "cpu"
            if dtype == torch.float32:
                logits = linear(xc, wc, bias if in_gemm else None)
            else:
                logits = torch.mm(xc, wc.t())
            late_bias, in_place = (None if in_gemm else bias.float()), logits.dtype == torch.float32
            n, vocab = logits.shape
            rows = max(1, CHUNK_BYTES // (4 * vocab))
            want_grad = any(ctx.needs_input_grad[:3])
            losses = torch.empty(n, dtype=torch.float32, device=x.device)
            hits = torch.empty(n, dtype=torch.bool, device=x.device)
            # The bias gradient, summed over the rows chunk by chunk while each is in cache
            # in fp32: no second pass over the [n, vocab] gradient in backward.
            grad_bias = (torch.zeros(vocab, dtype=torch.float32, device=x.device)
                         if want_grad else None)
            for start in range(0, n, rows):
                stop = min(start + rows, n)
                t = target[start:stop, None]
                chunk = logits[start:stop]
                # fp32 logits are worked in place; bf16 ones in an fp32 copy of the chunk
                if not in_place:
                    chunk = chunk.float()
                if late_bias is not None:
                    chunk = chunk.add_(late_bias)
                picked = chunk.gather(1, t).squeeze(1)
                top = chunk.amax(1)  # max(1) also finds the index: 18x slower on the CPU
                hits[start:stop] = picked >= top  # the target holds the highest logit
                chunk.sub_(top[:, None]).exp_()
                total = chunk.sum(1)
                losses[start:stop] = top + total.log() - picked
                if want_grad:
                    chunk.mul_((1.0 / (total * n))[:, None])  # softmax / n
                    chunk.scatter_add_(1, t, chunk.new_full(t.shape, -1.0 / n))
                    grad_bias += chunk.sum(0)
                    if not in_place:
                        logits[start:stop] = chunk  # back into the bf16 buffer
        if want_grad:
            ctx.save_for_backward(logits, xc, wc, grad_bias)
            ctx.dtypes = (x.dtype, weight.dtype, bias.dtype)
        ctx.mark_non_differentiable(hits)
        return losses.mean(), hits.float().mean()

    @staticmethod
    def backward(ctx, grad_loss, grad_accuracy):
        grad, xc, wc, grad_bias = ctx.saved_tensors  # grad: d(mean loss)/d(logits), [n, vocab]
        x_dtype, w_dtype, b_dtype = ctx.dtypes
        unscaled = grad_loss.device.type == "cpu" and float(grad_loss) == 1.0
        scale = grad_loss.to(torch.float32)
        fp32 = grad.dtype == torch.float32

        def scaled(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
            t = t.to(dtype)
            return t if unscaled else t.mul_(scale.to(dtype))

        grad_x = grad_w = grad_b = None
        with torch.autocast(xc.device.type, enabled=False):
            if ctx.needs_input_grad[0]:
                grad_x = scaled(linear(grad, wc.t()) if fp32 else torch.mm(grad, wc), x_dtype)
            if ctx.needs_input_grad[1]:
                grad_w = scaled(linear(grad.t(), xc.t()) if fp32 else torch.mm(grad.t(), xc), w_dtype)
            if ctx.needs_input_grad[2]:
                # A copy: the saved sum must stay as it is for another backward.
                grad_b = scaled(grad_bias.clone(), b_dtype)
        return grad_x, grad_w, grad_b, None, None


def masked_lm_loss(inputs: StepInputs) -> ObjectiveOutput:
    """Cross-entropy of the MLM head, run only at the labelled positions."""
    labels = inputs.batch["mlm_labels"].reshape(-1)
    # Row-major positions of the labels (the order boolean indexing gives), gathered with
    # index_select: cheaper than boolean indexing forward and backward.
    where = (labels != IGNORE_INDEX).nonzero().squeeze(1)
    last = inputs.encoder_output.last_hidden_state
    hidden = last.reshape(-1, last.shape[-1]).index_select(0, where)  # [n_selected, hidden]
    target = labels.index_select(0, where)
    head = inputs.heads["mlm"]
    if isinstance(head, MLMHead):
        loss, accuracy = head.loss_and_accuracy(hidden, target)
    else:  # a head some plugin supplies under the same name: the plain computation
        logits = head(hidden)
        loss = F.cross_entropy(logits.float(), target)
        accuracy = (logits.argmax(-1) == target).float().mean()
    return ObjectiveOutput(loss=loss, metrics={"accuracy": accuracy})


def build(options: MLMOptions, context: BuildContext) -> Objective:
    """``mlm`` for a run: the MLM head, its loss, and masking over ``context.vocab``."""

    def mask(batch: Batch, generator: torch.Generator) -> Batch:
        return mask_tokens(batch, context.vocab, options.mask_prob, options.mask_ratio,
                           options.random_ratio, generator)

    return Objective(loss=masked_lm_loss, heads={"mlm": MLMHead}, batch_transform=mask)


@hookimpl
def pretextual_register_objectives(register):
    register(ObjectiveSpec(name="mlm", build=build, options=MLMOptions,
                           provides=("batch_transform",),
                           description="Masked language modelling, 80/10/10 (BERT)"))
