"""Whether code runs under a compiler or exporter, where the CPU kernels step aside."""

from __future__ import annotations

import torch


def tracing() -> bool:
    """Under torch.compile, torch.export or the ONNX exporters (plain aten ops only there)."""
    compiler = getattr(torch, "compiler", None)
    if compiler is not None:
        if getattr(compiler, "is_compiling", lambda: False)():
            return True
        if getattr(compiler, "is_exporting", lambda: False)():
            return True
    return torch.jit.is_tracing() or torch.onnx.is_in_onnx_export()
