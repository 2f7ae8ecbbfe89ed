"""The CPU kernels, applied to a built model: ``pip install 'pretextual[cpu]'``.

:func:`apply_cpu_kernels` gives the modules of a built encoder and its heads
accelerated classes with the same parameters, buffers and state-dict names
(a class swap, so the optimizer, checkpoints and exports see the plain model):

* ``nn.Dropout`` -> :class:`~pretextual.accel.dropout.Dropout` (compiled loop, mask recomputed);
* ``nn.Linear`` -> :class:`~pretextual.accel.onednn.OneDNNLinear` where oneDNN is chosen;
* self-attention -> one GEMM for query, key and value, and attention with that dropout;
* the encoder drops the attention mask of a batch with no padding (attention then
  skips the masking);
* the MLM head -> :class:`~pretextual.accel.fused_loss.FusedMLMHead` (fused vocabulary loss);

and sets glibc's malloc to keep freed memory for reuse (process-wide). Each
computes what the plain module computes (tests/accel); each one's gain is in
docs/benchmarks.md.
"""

from __future__ import annotations

import ctypes

import torch
from torch import nn

from pretextual.accel import dropout as cpu_dropout
from pretextual.accel import onednn
from pretextual.accel.fused_loss import FusedMLMHead, compute_dtype
from pretextual.accel.tracing import tracing
from pretextual.core.encoder import BertEncoder, BertSelfAttention
from pretextual.objectives.mlm import MLMHead


class CPUSelfAttention(BertSelfAttention):
    """Self-attention with one GEMM for query, key and value (the parameters stay three
    ``nn.Linear``, as Hugging Face names them) and the CPU dropout on the probabilities."""

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None) -> torch.Tensor:
        b, n, h = x.shape
        if attn_mask is not None:
            attn_mask = attn_mask.to(compute_dtype(x))
        weight = torch.cat([self.query.weight, self.key.weight, self.value.weight])
        bias = torch.cat([self.query.bias, self.key.bias, self.value.bias])
        qkv = onednn.linear(x, weight, bias).view(b, n, 3, self.num_heads, self.head_dim)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each [b, heads, n, head_dim]
        y = cpu_dropout.attention(q, k, v, attn_mask, self.dropout_p if self.training else 0.0)
        return y.transpose(1, 2).reshape(b, n, h)


class CPUEncoder(BertEncoder):
    """The layers with no attention mask when no key is masked: checking costs no
    device synchronisation on the CPU, and attention then skips the masking."""

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor | None) -> torch.Tensor:
        if (key_mask is not None and key_mask.dtype == torch.bool and not tracing()
                and key_mask.device.type == "cpu" and bool(key_mask.all())):
            key_mask = None
        return super().forward(x, key_mask)


_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters (malloc.h)
_KEEP_BYTES = 1 << 30


def keep_freed_memory() -> bool:
    """Make glibc's malloc serve blocks up to 1 GiB from its heap and keep freed memory
    for reuse (process-wide). By default blocks above 32 MiB are mapped and unmapped on
    every allocation and freed heap tops are returned to the system, so each training
    step page-faults its large activations and gradients in afresh. The process's peak
    memory stays the same. Returns False where the C library is not glibc."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc (musl, macOS, Windows)
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, _KEEP_BYTES)) and bool(mallopt(_M_TRIM_THRESHOLD, _KEEP_BYTES))


def kernel_swaps() -> list[tuple[type, type]]:
    """(plain class, accelerated class) pairs, as :func:`apply_cpu_kernels` swaps them."""
    swaps = [(nn.Dropout, cpu_dropout.Dropout), (BertSelfAttention, CPUSelfAttention),
             (BertEncoder, CPUEncoder), (MLMHead, FusedMLMHead)]
    if onednn.onednn_linear_active():
        swaps.append((nn.Linear, onednn.OneDNNLinear))
    return swaps


def apply_cpu_kernels(model: nn.Module) -> list[str]:
    """Swap the CPU kernels into ``model`` in place (see the module docstring); the
    names of what was swapped in. Only modules of exactly a plain class are swapped:
    a plugin's subclass keeps its own forward."""
    swapped = set()
    swaps = kernel_swaps()
    for module in model.modules():
        for plain, fast in swaps:
            if type(module) is plain:
                # Same parameters, buffers and names; another forward.
                module.__class__ = fast
                swapped.add(fast.__name__)
                break
    allocator = ["glibc malloc keeps freed memory"] if keep_freed_memory() else []
    return sorted(swapped) + allocator
