"""What the ONNX exporter and its int8 quantization share: the file name, the optional
packages they need, an onnxruntime session, and quieting the libraries while they run."""

from __future__ import annotations

import contextlib
import logging
import warnings
from pathlib import Path

from pretextual.errors import PretextualError

ONNX_FILE = "model.onnx"


def require_onnx():
    """(onnx, onnxruntime), or a PretextualError saying what to install."""
    try:
        import onnx
        import onnxruntime
        import onnxscript  # noqa: F401  (torch.onnx's exporter needs it)
    except ImportError as exc:
        raise PretextualError(f"onnx: the ONNX exporter needs onnx, onnxruntime and onnxscript "
                              f"(pip install onnx onnxruntime onnxscript): {exc}") from None
    return onnx, onnxruntime


def cpu_session(path: Path):
    """An onnxruntime CPU session of ``path``."""
    _, ort = require_onnx()
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


@contextlib.contextmanager
def quiet(logger_name: str):
    """Silence a library's progress warnings while it runs (torch.onnx's "torchvision
    is not installed", onnxruntime quantization's advice on the root logger)."""
    logger = logging.getLogger(logger_name)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(level)
