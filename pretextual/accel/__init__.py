"""Accelerations, applied to a built model from outside it (as torchtitan applies its
converters): the model stays plain PyTorch, and each acceleration here keeps its
place only while docs/benchmarks.md shows its gain.

* ``trainer.compile``: ``torch.compile`` of the encoder (the standard path on GPUs);
* ``trainer.cpu_kernels``: the CPU kernels of :mod:`pretextual.accel.cpu` (an extra:
  ``pip install 'pretextual[cpu]'``, numba and llvmlite), which a run on another
  device never imports.
"""

from __future__ import annotations

from torch import nn

from pretextual.errors import ConfigError

CPU_EXTRA = "pip install 'pretextual[cpu]'"


def cpu_kernels_installed() -> bool:
    """Whether the CPU kernels' extra (numba, llvmlite) is importable."""
    import importlib.util

    return all(importlib.util.find_spec(name) is not None for name in ("numba", "llvmlite"))


def accelerate(model: nn.Module, encoder: nn.Module, device_type: str, compile: bool,
               cpu_kernels: bool | None, log=print) -> list[str]:
    """Apply the chosen accelerations to a built ``model`` (encoder and heads) in place,
    before any distributed wrapping, so parameter names and the state dict stay as they
    are. ``cpu_kernels``: True (a ConfigError where they cannot apply), False, or
    None (on for an uncompiled run on the CPU when the extra is installed, with one
    line naming the extra when it is not). Returns what was applied, in words."""
    if cpu_kernels:
        if device_type != "cpu":
            raise ConfigError(f"trainer.cpu_kernels=true: the CPU kernels run on the CPU, "
                              f"this run is on {device_type}")
        if not cpu_kernels_installed():
            raise ConfigError(f"trainer.cpu_kernels=true needs the CPU kernels: {CPU_EXTRA}")
    use_cpu = cpu_kernels or (cpu_kernels is None and device_type == "cpu" and not compile)
    if use_cpu and not cpu_kernels_installed():
        log(f"note: training with plain PyTorch kernels; the CPU kernels are faster here: "
            f"{CPU_EXTRA}")
        use_cpu = False
    applied = []
    if use_cpu:
        from pretextual.accel.cpu import apply_cpu_kernels

        applied.append(f"CPU kernels ({', '.join(apply_cpu_kernels(model))})")
    if compile:
        encoder.compile()  # in place: the module and its state dict stay as they are
        applied.append("torch.compile")
    return applied
