"""The MLM loss fused with its vocabulary projection, for the CPU.

:class:`FusedMLMHead` is the MLM head whose ``loss_and_accuracy`` computes
``F.cross_entropy`` of the logits and the accuracy in cache-sized row chunks,
without the [n, vocab] intermediates of log_softmax + nll_loss (tested equal to
the plain head's in tests/accel; its gain is measured in docs/benchmarks.md).
"""

from __future__ import annotations

import torch

from pretextual.accel import onednn
from pretextual.objectives.mlm import MLMHead


class FusedMLMHead(MLMHead):
    """The MLM head (same parameters and names) with the fused loss."""

    def loss_and_accuracy(self, hidden: torch.Tensor, target: torch.Tensor
                          ) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.transform(hidden)
        return _VocabCrossEntropy.apply(x, self.word_embeddings.weight, self.bias, target,
                                        compute_dtype(x))


def compute_dtype(x: torch.Tensor) -> torch.dtype:
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
                logits = onednn.linear(xc, wc, bias if in_gemm else None)
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
                grad_x = scaled(onednn.linear(grad, wc.t()) if fp32 else torch.mm(grad, wc), x_dtype)
            if ctx.needs_input_grad[1]:
                grad_w = scaled(onednn.linear(grad.t(), xc.t()) if fp32 else torch.mm(grad.t(), xc), w_dtype)
            if ctx.needs_input_grad[2]:
                # A copy: the saved sum must stay as it is for another backward.
                grad_b = scaled(grad_bias.clone(), b_dtype)
        return grad_x, grad_w, grad_b, None, None
