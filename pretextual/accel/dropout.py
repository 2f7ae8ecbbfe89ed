"""Dropout as one compiled loop (numba) whose mask backward recomputes instead of storing it.

The keep mask comes from a counter-based generator (SplitMix64 of the element pair's
index), so nothing but a seed is saved for backward, and the loop, free of a
generator's state, vectorizes. :func:`attention` is scaled-dot-product attention
written out with this dropout where torch's CPU kernel would draw its mask with
``bernoulli_``. Both compute what the plain ops compute, in distribution (tested in
tests/accel), and step aside on other devices and in compiled or exported code.
The gains are measured in docs/benchmarks.md.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic
from torch import nn

from pretextual.accel.tracing import tracing


# Dropout's keep/drop decisions: elements 2j and 2j + 1 of a call are kept when the
# high and the low 32 bits of SplitMix64's j-th output from the call's seed are at least
# round(p * 2^32). One 64-bit output serves two elements: the hash is most of the loop's
# time. The decision is a pure function of (seed, i), so backward
# recomputes the mask instead of storing it, and the loop, free of a generator's state,
# vectorizes.
_GAMMA = np.uint64(0x9E3779B97F4A7C15)
_MIX1, _MIX2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_LOW32 = np.uint64(0xFFFFFFFF)


@njit(inline="always")
def _draws(seed, j):
    """SplitMix64's j-th output (Steele et al. 2014): two 32-bit draws."""
    z = seed + np.uint64(j + 1) * _GAMMA
    z = (z ^ (z >> np.uint64(30))) * _MIX1
    z = (z ^ (z >> np.uint64(27))) * _MIX2
    return z ^ (z >> np.uint64(31))


@njit(inline="always")
def _factor(draw, threshold, scale):
    return scale if draw >= threshold else np.float32(0.0)


@njit(cache=True, nogil=True)
def _dropout_f32(x, out, seed, threshold, scale):
    n = x.size
    for j in range(n // 2):
        z = _draws(seed, j)
        out[2 * j] = x[2 * j] * _factor(z >> np.uint64(32), threshold, scale)
        out[2 * j + 1] = x[2 * j + 1] * _factor(z & _LOW32, threshold, scale)
    if n % 2:
        out[n - 1] = x[n - 1] * _factor(_draws(seed, n // 2) >> np.uint64(32), threshold, scale)


@intrinsic
def _as_float32(typingctx, bits):
    """Reinterpret uint32 bits as float32 (a bit cast, which numba has no function for)."""
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())
    return types.float32(types.uint32), codegen


@intrinsic
def _as_uint32(typingctx, value):
    """Reinterpret float32 as its uint32 bits."""
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))
    return types.uint32(types.float32), codegen


@njit(inline="always")
def _times_bf16(bits, factor):
    """A bfloat16 bit pattern (uint16) widened to float32, multiplied, and rounded back
    to nearest-even as torch rounds (a NaN stays a NaN)."""
    v = _as_float32(np.uint32(bits) << np.uint32(16)) * factor
    b = _as_uint32(v)
    rounded = (b + ((b >> np.uint32(16)) & np.uint32(1)) + np.uint32(0x7FFF)) >> np.uint32(16)
    return np.uint16(0x7FC0) if v != v else np.uint16(rounded)


@njit(cache=True, nogil=True)
def _dropout_bf16(x, out, seed, threshold, scale):
    """The same on bfloat16 bit patterns."""
    n = x.size
    for j in range(n // 2):
        z = _draws(seed, j)
        out[2 * j] = _times_bf16(x[2 * j], _factor(z >> np.uint64(32), threshold, scale))
        out[2 * j + 1] = _times_bf16(x[2 * j + 1], _factor(z & _LOW32, threshold, scale))
    if n % 2:
        out[n - 1] = _times_bf16(x[n - 1], _factor(_draws(seed, n // 2) >> np.uint64(32),
                                                   threshold, scale))


def _draw_parameters(p: float) -> tuple[np.uint64, np.float32]:
    """The drop threshold of 32-bit draws and the scale that keeps the expected value:
    the drop probability is p rounded to a multiple of 2^-32."""
    threshold = min(round(p * 2.0**32), 2**32 - 1)
    return np.uint64(threshold), np.float32(2.0**32 / (2**32 - threshold))


def _apply_mask(x: torch.Tensor, p: float, seed: int) -> torch.Tensor:
    """``x`` times the keep mask of (p, seed), in float32 and rounded once to x's dtype."""
    x = x.detach().contiguous()
    out = torch.empty_like(x)
    threshold, scale = _draw_parameters(p)
    if x.dtype == torch.bfloat16:
        src, dst = (t.view(torch.int16).numpy().view(np.uint16).reshape(-1) for t in (x, out))
        _dropout_bf16(src, dst, np.uint64(seed), threshold, scale)
    else:
        _dropout_f32(x.numpy().reshape(-1), out.numpy().reshape(-1), np.uint64(seed), threshold, scale)
    return out


def keep_mask(shape: tuple[int, ...], p: float, seed: int) -> torch.Tensor:
    """The float32 mask :func:`dropout` multiplies by for ``seed``: 0 with probability p
    (rounded to a multiple of 2^-32), else 1/(1 - that probability), so the expected
    value is kept exactly."""
    return _apply_mask(torch.ones(shape), p, seed)


class _Dropout(torch.autograd.Function):
    """Inverted dropout with the mask of :func:`keep_mask` for a seed drawn from torch's
    generator. Forward and backward each multiply by the mask, recomputed from the
    seed (nothing but the seed is saved), in float32 and rounded once, as
    ``(x * mask).to(x.dtype)``."""

    @staticmethod
    def forward(ctx, x, p):
        ctx.seed = int(torch.randint(0, 2**62, (1,)).item())  # torch.manual_seed governs the stream
        ctx.p = p
        return _apply_mask(x, p, ctx.seed)

    @staticmethod
    def backward(ctx, grad):
        return _apply_mask(grad, ctx.p, ctx.seed), None


def dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """``F.dropout(x, p, training)``: the same distribution (each element zeroed with
    probability p, the rest scaled by 1/(1-p); on the CPU p rounded to 2^-32, see
    :func:`keep_mask`). For float32 and bfloat16 on the CPU one compiled loop draws
    the mask and multiplies, and backward recomputes the mask."""
    if not training or p == 0.0:
        return x
    if (x.device.type != "cpu" or p >= 1.0 or x.dtype not in (torch.float32, torch.bfloat16)
            or tracing()):
        return F.dropout(x, p, True)
    return _Dropout.apply(x, p)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None,
              dropout_p: float) -> torch.Tensor:
    """``F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=dropout_p)``
    for [batch, heads, seq, head_dim] inputs and an additive or boolean (True: may
    attend) ``bias``, or None. With dropout on the CPU, torch runs its unfused math
    kernel and draws the mask with bernoulli_; written out here with :func:`dropout`
    instead. The probabilities are in the inputs' dtype (softmax accumulates in fp32
    inside), as the next matmul takes them: under bf16 autocast no fp32 copy of the
    [batch, heads, seq, seq] probabilities and their gradient is made."""
    if dropout_p == 0.0 or q.device.type != "cpu" or tracing():
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=dropout_p)
    scores = torch.matmul(q, k.transpose(-1, -2)).mul_(1.0 / math.sqrt(q.shape[-1]))
    if bias is not None and bias.dtype == torch.bool:
        scores = scores.masked_fill_(~bias, torch.finfo(scores.dtype).min)
    elif bias is not None:
        scores = scores.add_(bias)
    return torch.matmul(dropout(torch.softmax(scores, dim=-1), dropout_p, True), v)


class Dropout(nn.Dropout):
    """nn.Dropout (same name and no state, so Hugging Face's layout is kept) using :func:`dropout`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p, self.training)
