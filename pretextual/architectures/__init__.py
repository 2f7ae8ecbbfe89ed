"""Encoder architectures: one plain-PyTorch file each, read top to bottom like nanoGPT's
model.py (``bert.py``, ``modernbert.py``), registered by name through the
``pretextual_register_architectures`` hook as any plugin's would be
(``model.architecture``). What they share (the output, attention masks, positions,
parameter counts) is in ``common.py``."""

from __future__ import annotations

import functools
from typing import Any

from torch import nn

from pretextual.plugins.api import ArchitectureSpec


SIZES = ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size")
"""The size fields every architecture's config has, which model.* keys override."""


@functools.lru_cache(maxsize=4)
def _registry(modules: tuple[str, ...]):
    from pretextual.plugins.manager import Plugins
    return Plugins(extra_modules=modules)


def architecture(name: str, plugins: Any = None, modules: tuple[str, ...] = ()) -> ArchitectureSpec:
    """The architecture registered as ``name`` by ``plugins`` (default: the built-in and
    installed plugins and ``modules``); PluginError listing the known ones otherwise."""
    return (plugins or _registry(tuple(modules))).architecture(name)


def sized_config(spec: ArchitectureSpec, preset: str, sizes: dict[str, int | None],
                 dropouts: dict[str, float | None], **fields: Any) -> Any:
    """``spec``'s config of a named preset with the sizes that are set (a hidden size set
    alone brings the architecture's intermediate size with it), the dropouts that are set
    (each to the fields the architecture takes it in) and ``fields``. KeyError for a preset
    the architecture does not have."""
    chosen = dict(spec.presets[preset])
    chosen.update({k: v for k, v in sizes.items() if v is not None})
    if sizes.get("hidden_size") is not None and sizes.get("intermediate_size") is None:
        chosen["intermediate_size"] = round(spec.intermediate_ratio * sizes["hidden_size"])
    for key, value in dropouts.items():
        if value is not None:
            chosen.update({name: value for name in spec.dropouts[key]})
    return spec.config(**{**chosen, **fields})


def config_from_dict(name: str, fields: dict[str, Any]) -> Any:
    """The config of architecture ``name`` from its fields (a checkpoint's record of them);
    TypeError for a field it does not have."""
    return architecture(name).config(**fields)


def build_encoder(config: Any, plugins: Any = None) -> nn.Module:
    """A freshly initialised encoder of ``config``'s architecture (as ``plugins``, default
    the built-in and installed ones, registered it)."""
    return architecture(config.architecture, plugins).model(config)


def transformer_layers(encoder: nn.Module) -> nn.ModuleList:
    """The encoder's stack of layers (the first ModuleList in it): what FSDP shards one
    by one."""
    return next(m for m in encoder.modules() if isinstance(m, nn.ModuleList))
