"""Fast CPU paths of the encoder, kept out of the model's code.

Each one computes what the plain PyTorch op computes (tested against it in
tests/benchmarks/test_step_equivalence.py) and steps aside where it cannot
apply: under autocast, on other devices, and in compiled or exported code,
which must see plain aten ops.

* :func:`linear`: ``F.linear`` whose three GEMMs (forward, input and weight
  gradients) run through oneDNN for fp32 on AMD CPUs, where oneDNN uses
  AVX-512 and torch's default BLAS (MKL) does not: GEMMs 1.2-1.4x and training
  steps 1.03-1.16x faster on a 2-core AMD EPYC. Elsewhere F.linear stays (see
  :func:`onednn_linear_wanted`).
  ``PRETEXTUAL_ONEDNN_LINEAR=1`` or ``0`` forces it on or off.
* :func:`dropout` / :class:`Dropout`: inverted dropout as one compiled loop
  (numba) whose keep mask comes from a counter-based generator (SplitMix64 of
  the element pair's index), so backward recomputes the mask instead of storing it:
  forward and backward 6.3-6.6x faster than torch's in fp32, 4.8x in bf16 on an
  Intel Xeon, 7.5-9.0x and 7.7-7.9x on an AMD EPYC (1-2M elements, 2 threads), and a bf16 training step measured 1.15x faster than with a
  stored mask drawn by NumPy.
* :func:`attention`: with dropout on the CPU, attention written out with
  :func:`dropout` instead of torch's math kernel and its ``bernoulli_``.
* :func:`keep_freed_memory`: glibc's malloc keeps large freed blocks for reuse
  instead of returning them to the system, so a training step does not page-fault
  its activations in afresh every time.
* :func:`tracing` and :func:`exporting`: whether the code runs under
  torch.compile, torch.export or the ONNX exporters.
"""

from __future__ import annotations

import ctypes
import functools
import math
import os

import numpy as np
import torch
import torch.nn.functional as F
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic
from torch import nn

ONEDNN_ENV = "PRETEXTUAL_ONEDNN_LINEAR"
_onednn_forced: bool | None = None  # set_onednn_linear's choice; None: the default's
_onednn_use: bool | None = None  # whether linear uses oneDNN, decided on first use


def cpuinfo(key: str) -> str:
    """The first value of ``key`` in /proc/cpuinfo ("vendor_id", "model name"), "" where unknown."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith(key):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


@functools.lru_cache(maxsize=1)
def cpu_vendor() -> str:
    """The CPU's vendor string ("GenuineIntel", "AuthenticAMD"), "" where unknown."""
    return cpuinfo("vendor_id")


def onednn_linear_wanted() -> bool:
    """Whether :func:`linear` should use oneDNN: as forced by :func:`set_onednn_linear`
    or ``PRETEXTUAL_ONEDNN_LINEAR`` (1 or 0), else on AMD CPUs only, where MKL, torch's
    default BLAS, does not run its AVX-512 kernels (on a 2-core AMD EPYC: fp32 GEMMs of the
    benchmark's shapes at 140-167 GFLOP/s through MKL, 195-202 through oneDNN; training
    steps 1.03-1.16x faster with oneDNN, alternating processes). Elsewhere
    torch's own F.linear stays: on Intel MKL measured as fast over a whole training step
    (fp32 step 539 ms with MKL, 563 ms with oneDNN, A/B in one process), and on other
    CPUs nothing was measured."""
    if _onednn_forced is not None:
        return _onednn_forced
    setting = os.environ.get(ONEDNN_ENV, "auto").strip().lower()
    if setting in ("", "auto"):
        return cpu_vendor() == "AuthenticAMD"
    return setting not in ("0", "false", "off", "no")


@functools.lru_cache(maxsize=1)
def onednn_linear_op():
    """oneDNN's linear on ordinary strided tensors (probed once), or None when this
    torch lacks it or it disagrees with F.linear; whether :func:`linear` uses it is
    :func:`onednn_linear_active`."""
    op = getattr(getattr(torch.ops, "mkldnn", None), "_linear_pointwise", None)
    if op is None or not torch.backends.mkldnn.is_available():
        return None
    try:
        g = torch.Generator().manual_seed(0)
        x, w = torch.randn(5, 12, generator=g), torch.randn(7, 12, generator=g)
        b, y = torch.randn(7, generator=g), torch.randn(5, 7, generator=g)
        # The three uses: forward, input gradient (transposed weight), weight
        # gradient (both operands transposed views).
        if (torch.allclose(op(x, w, b, "none", [], ""), F.linear(x, w, b), atol=1e-5)
                and torch.allclose(op(y, w.t(), None, "none", [], ""), y @ w, atol=1e-5)
                and torch.allclose(op(y.t(), x.t(), None, "none", [], ""), y.t() @ x, atol=1e-5)):
            return op
    except Exception:  # not built in, or another signature: keep the default path
        pass
    return None


def _onednn_linear_op():
    """The oneDNN linear op when :func:`linear` uses it (wanted, and usable), else None."""
    global _onednn_use
    if _onednn_use is None:
        _onednn_use = onednn_linear_wanted()
    return onednn_linear_op() if _onednn_use else None


def set_onednn_linear(enabled: bool | None) -> None:
    """Turn the oneDNN path of :func:`linear` on (when available) or off for this
    process; None goes back to the default choice (:func:`onednn_linear_wanted`)."""
    global _onednn_forced, _onednn_use
    _onednn_forced, _onednn_use = enabled, None


def onednn_linear_active() -> bool:
    """Whether :func:`linear` runs fp32 CPU GEMMs through oneDNN in this process."""
    return _onednn_linear_op() is not None


def tracing() -> bool:
    """Under torch.compile, torch.export or the ONNX exporters (plain aten ops only there)."""
    compiler = getattr(torch, "compiler", None)
    if compiler is not None:
        if getattr(compiler, "is_compiling", lambda: False)():
            return True
        if getattr(compiler, "is_exporting", lambda: False)():
            return True
    return torch.jit.is_tracing() or torch.onnx.is_in_onnx_export()


def exporting() -> bool:
    """Under torch.export or the ONNX exporters (not plain torch.compile)."""
    compiler = getattr(torch, "compiler", None)
    exporting = getattr(compiler, "is_exporting", lambda: False)() if compiler is not None else False
    return exporting or torch.onnx.is_in_onnx_export()


def _mm_nt(op, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b.T`` for 2-D ``a`` [m, k] and ``b`` [n, k] through oneDNN. oneDNN reads
    ``b`` in any layout but copies ``a`` when its rows are not dense, and a large
    transposing copy costs as much as the GEMM; when ``a`` is a strided view and ``b``
    is smaller, the transposed product ``(b @ a.T).T`` copies ``b`` instead (and the
    product, which is then the smaller of the two, back to dense rows)."""
    if not a.is_contiguous() and b.numel() < a.numel():
        return op(b.contiguous(), a, None, "none", [], "").t().contiguous()
    return op(a.contiguous(), b, None, "none", [], "")


class _OneDNNLinear(torch.autograd.Function):
    """y = x W^T + b with every GEMM (forward and both gradients) through oneDNN."""

    @staticmethod
    def forward(ctx, x, weight, bias):
        op = _onednn_linear_op()
        if x.dim() == 2 and bias is None and not x.is_contiguous():
            # A transposed view, as a head's weight gradient passes: no dense copy of it.
            ctx.save_for_backward(x, weight)
            ctx.has_bias = False
            return _mm_nt(op, x, weight)
        # Dense rows: oneDNN is slow on operands with unusual strides (a [:, 0] slice).
        x2 = x.reshape(-1, x.shape[-1]).contiguous()
        y = op(x2, weight, bias, "none", [], "")
        ctx.save_for_backward(x2, weight)
        ctx.has_bias = bias is not None
        return y.view(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx, grad):
        op = _onednn_linear_op()
        x2, weight = ctx.saved_tensors
        g2 = grad.reshape(-1, grad.shape[-1]).contiguous()
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_x = op(g2, weight.t(), None, "none", [], "").view(*grad.shape[:-1], weight.shape[1])
        if ctx.needs_input_grad[1]:
            grad_w = _mm_nt(op, g2.t(), x2.t())  # G^T X [out, in], the cheaper way round
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_b = g2.sum(0)
        return grad_x, grad_w, grad_b


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)``; fp32 on the CPU goes through oneDNN where
    :func:`onednn_linear_wanted` (same result within float rounding, faster where
    the default BLAS lacks AVX-512).
    Autocast, other devices and dtypes, and compiled or exported code take F.linear."""
    if (x.device.type == "cpu" and x.dtype == torch.float32 and weight.dtype == torch.float32
            and x.numel() > 0 and not torch.is_autocast_enabled("cpu") and not tracing()
            and _onednn_linear_op() is not None):
        return _OneDNNLinear.apply(x, weight, bias)
    return F.linear(x, weight, bias)


# Dropout's keep/drop decisions: elements 2j and 2j + 1 of a call are kept when the
# high and the low 32 bits of SplitMix64's j-th output from the call's seed are at least
# round(p * 2^32). One 64-bit output serves two elements: the hash is most of the loop's
# time, and this made the kernel 1.4-1.5x faster in fp32 and 1.3-1.4x in bf16 (1M and 2M
# elements, same-process A/B). The decision is a pure function of (seed, i), so backward
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
    the mask and multiplies (numba, counter-based generator; 4.8-9.0x faster than
    torch's dropout forward and backward, see the module docstring), and backward
    recomputes the mask."""
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
    [batch, heads, seq, seq] probabilities and their gradient is made, which made a bf16
    training step on the reference config 1.04x faster (same-process A/B)."""
    if dropout_p == 0.0 or q.device.type != "cpu" or tracing():
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=dropout_p)
    scores = torch.matmul(q, k.transpose(-1, -2)).mul_(1.0 / math.sqrt(q.shape[-1]))
    if bias is not None and bias.dtype == torch.bool:
        scores = scores.masked_fill_(~bias, torch.finfo(scores.dtype).min)
    elif bias is not None:
        scores = scores.add_(bias)
    return torch.matmul(dropout(torch.softmax(scores, dim=-1), dropout_p, True), v)


_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters (malloc.h)
_KEEP_BYTES = 1 << 30


def keep_freed_memory() -> bool:
    """Make glibc's malloc serve blocks up to 1 GiB from its heap and keep freed memory
    for reuse (process-wide). By default blocks above 32 MiB are mapped and unmapped on
    every allocation and freed heap tops are returned to the system, so each training
    step page-faults its large activations and gradients in afresh: 60,000 to 100,000
    page faults and about a sixth of a step on the reference config. The process's peak
    memory stays the same. Returns False where the C library is not glibc."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc (musl, macOS, Windows)
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, _KEEP_BYTES)) and bool(mallopt(_M_TRIM_THRESHOLD, _KEEP_BYTES))


class Dropout(nn.Dropout):
    """nn.Dropout (same name and no state, so Hugging Face's layout is kept) using :func:`dropout`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p, self.training)


__all__ = ["linear", "set_onednn_linear", "onednn_linear_active", "onednn_linear_wanted",
           "onednn_linear_op", "cpuinfo", "cpu_vendor", "keep_mask", "dropout", "Dropout", "attention", "keep_freed_memory",
           "tracing", "exporting"]
