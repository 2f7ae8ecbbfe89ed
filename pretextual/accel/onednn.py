"""Linear layers whose GEMMs run through oneDNN on CPUs where torch's default BLAS is slower.

:func:`linear` is ``F.linear`` whose three GEMMs (forward, input and weight gradients)
run through oneDNN for fp32 on AMD CPUs, where oneDNN uses AVX-512 and MKL, torch's
default BLAS, does not (measured in docs/benchmarks.md); elsewhere, under autocast,
and in compiled or exported code it is F.linear. ``PRETEXTUAL_ONEDNN_LINEAR=1`` or
``0`` forces it on or off. :class:`OneDNNLinear` is ``nn.Linear`` using it.
"""

from __future__ import annotations

import functools
import os

import torch
import torch.nn.functional as F
from torch import nn

from pretextual.accel.tracing import tracing

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
    or ``PRETEXTUAL_ONEDNN_LINEAR`` (1 or 0), else on AMD CPUs only, where MKL does not
    run its AVX-512 kernels. On Intel, MKL measured as fast over a whole training step;
    on other CPUs nothing was measured."""
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




class OneDNNLinear(nn.Linear):
    """nn.Linear (same parameters and names) computed by :func:`linear`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)
