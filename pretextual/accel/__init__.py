"""Accelerations, applied to a built model from outside it (as torchtitan applies its
converters): the model stays plain PyTorch, and each acceleration here keeps its
place only while docs/benchmarks.md shows its gain.

* ``trainer.compile``: ``torch.compile`` of the encoder (the standard path on GPUs);
* on the CPU, glibc's malloc keeps freed memory for reuse (:mod:`pretextual.accel.allocator`),
  so a step does not page-fault its large activations and gradients in afresh.
"""

from __future__ import annotations

from torch import nn

from pretextual.accel.allocator import keep_freed_memory


def accelerate(encoder: nn.Module, device_type: str, compile: bool) -> list[str]:
    """Apply the accelerations to a built encoder in place, before any distributed
    wrapping, so parameter names and the state dict stay as they are. Returns what was
    applied, in words."""
    applied = []
    if device_type == "cpu" and keep_freed_memory():
        applied.append("glibc malloc keeps freed memory")
    if compile:
        encoder.compile()  # in place: the module and its state dict stay as they are
        applied.append("torch.compile")
    return applied
