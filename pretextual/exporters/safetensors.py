"""The safetensors exporter: a directory Hugging Face transformers loads as it is.

With heads (the default), ``model.safetensors`` is laid out as transformers' pretraining
class of the architecture: for BERT, BertForPreTraining (the encoder under ``bert.``, the
MLM and NSP heads as ``cls.predictions.*`` and ``cls.seq_relationship.*``); for
ModernBERT, ModernBertForMaskedLM (the encoder under ``model.``, the MLM head as
``head.*`` and ``decoder.bias``). The MLM decoder is tied to the word embeddings, so it
is not stored, as transformers stores it; ``AutoModel.from_pretrained(DIR)`` still finds
every encoder weight and ignores the heads. Heads with no Hugging Face counterpart go to
``pretextual_heads.safetensors`` under their own names. The encoder alone is stored
under its base model's key names.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from safetensors.torch import save_file

from pretextual.exporters.hf import hf_counterpart, layout
from pretextual.exporters.load import HEADS_FILE, MODEL_FILE, from_pretrained
from pretextual.errors import PretextualError
from pretextual.plugins.api import ExportedModel, ExporterSpec, ExportOptions, ExportSummary
from pretextual.plugins.hookspecs import hookimpl


def split_heads(model: ExportedModel
                ) -> tuple[dict[str, dict[str, str]], dict[str, dict[str, torch.Tensor]]]:
    """(head -> its keys' Hugging Face names, for heads that have them), (the other heads'
    tensors)."""
    mapped, own = {}, {}
    for name, tensors in sorted(model.heads.items()):
        keys = hf_counterpart(name, tensors, model.config)
        if keys:
            mapped[name] = keys
        else:
            own[name] = tensors
    return mapped, own


def export_safetensors(model: ExportedModel, out_dir: Path, options: ExportOptions) -> ExportSummary:
    """Write model.safetensors (and pretextual_heads.safetensors), then load them
    back and check the encoder gives the same hidden states."""
    encoder_state = {k: v.detach().contiguous() for k, v in model.encoder.state_dict().items()}
    metadata = {"format": "pt", **model.metadata}  # "heads" is set per file: the heads it holds
    files, lines = [MODEL_FILE], []
    mapped, own = split_heads(model) if options.with_heads else ({}, {})
    if not options.with_heads:
        tensors = encoder_state
    else:
        prefix = layout(model.config).prefix
        tensors = {prefix + k: v for k, v in encoder_state.items()}
        for name, keys in mapped.items():
            tensors.update({keys[k]: v.contiguous() for k, v in model.heads[name].items()})
        lines += [f"head {name} -> {_names(keys.values())}" for name, keys in mapped.items()]
    if own:
        save_file({f"{name}.{k}": v.contiguous() for name, t in own.items() for k, v in t.items()},
                  str(out_dir / HEADS_FILE), metadata={**metadata, "heads": ",".join(own)})
        files.append(HEADS_FILE)
        lines += [f"head {name} -> {HEADS_FILE} ({name}.*, no Hugging Face counterpart)"
                  for name in own]
    save_file(tensors, str(out_dir / MODEL_FILE), metadata={**metadata, "heads": ",".join(mapped)})

    diff = _reload_diff(model, out_dir, options.with_heads)
    size = (out_dir / MODEL_FILE).stat().st_size
    lines.insert(0, f"{MODEL_FILE}: {len(tensors)} tensors, {size / 1e6:.1f} MB; reloaded: "
                    f"hidden-state max abs diff {diff:.1e}")
    return ExportSummary(files=files, metrics={"tensors": len(tensors), "bytes": size,
                                               "reload_max_abs_diff": diff}, lines=lines)


def _names(keys) -> str:
    """``cls.predictions.*`` for keys that share a prefix, else the keys themselves."""
    keys = sorted(keys)
    common = os.path.commonprefix(keys)
    common = common[:common.rfind(".") + 1]
    return f"{common}*" if common else ", ".join(keys)


def _reload_diff(model: ExportedModel, out_dir: Path, with_heads: bool) -> float:
    """Load the files back as pretextual does and compare outputs and head tensors."""
    loaded = from_pretrained(out_dir)
    heads = model.heads if with_heads else {}
    same_heads = loaded.heads.keys() == heads.keys() and all(
        loaded.heads[n].keys() == t.keys() and all(torch.equal(loaded.heads[n][k], v) for k, v in t.items())
        for n, t in heads.items())
    if not same_heads:
        raise PretextualError(f"safetensors: {out_dir}: the heads read back differ from the model's")
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(model.config.vocab_size, (2, 9), generator=generator)
    with torch.no_grad():
        expected = model.encoder(input_ids).last_hidden_state
        got = loaded.encoder(input_ids).last_hidden_state
    diff = float((expected - got).abs().max())
    if diff != 0.0:
        raise PretextualError(f"safetensors: {out_dir / MODEL_FILE}: reloaded encoder differs "
                              f"(max abs diff {diff:.3e})")
    return diff


@hookimpl
def pretextual_register_exporters(register):
    register(ExporterSpec(name="safetensors", export=export_safetensors, heads=True,
                          description="model.safetensors with Hugging Face names (BERT's, "
                                      "ModernBERT's; AutoModel.from_pretrained loads it)"))
