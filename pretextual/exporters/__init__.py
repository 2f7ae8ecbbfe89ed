"""Exporters: a trained checkpoint as files other tools load (safetensors for
Hugging Face transformers, ONNX for onnxruntime), each format a plugin.

``export_checkpoint`` writes an export; ``from_pretrained`` loads one back.
"""

from pretextual.exporters.export import export_checkpoint
from pretextual.exporters.load import from_pretrained

__all__ = ["export_checkpoint", "from_pretrained"]
