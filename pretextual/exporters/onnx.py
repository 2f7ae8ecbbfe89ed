"""The ONNX exporter: model.onnx for onnxruntime, checked against torch before it is kept.

Inputs ``input_ids``, ``attention_mask``, ``token_type_ids`` (int64,
``batch_size x sequence_length``, all three required: the exported tokenizer
produces them); outputs ``last_hidden_state`` and ``pooler_output``: the
encoder's features, what onnxruntime serving (embeddings, a task head of one's
own) reads, so the pretraining heads are never in the graph. Opset
pinned to :data:`OPSET`; one file below 2 GB of weights, external data above.

Every export checks itself: ``onnx.checker`` with ``full_check``, then
onnxruntime against pretextual's torch encoder on padded batches whose shapes
differ from the one traced; a difference above :data:`TOLERANCE` fails the
export with the numbers.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

from pretextual.errors import PretextualError
from pretextual.exporters.onnx_form import export_form
from pretextual.exporters.onnx_runtime import ONNX_FILE, cpu_session, quiet, require_onnx
from pretextual.exporters.quantize import quantize_int8
from pretextual.plugins.api import ExportedModel, ExporterSpec, ExportOptions, ExportSummary
from pretextual.plugins.hookspecs import hookimpl

OPSET = 18
TOLERANCE = 1e-4
INPUTS = ("input_ids", "attention_mask", "token_type_ids")
OUTPUTS = ("last_hidden_state", "pooler_output")
ONE_FILE_LIMIT = 2_000_000_000
"""Weight bytes above which the weights go to model.onnx.data (protobuf stops at 2 GiB)."""


class _Exportable(nn.Module):
    """The encoder with the outputs as a tuple, which the exporter names."""

    def __init__(self, encoder: nn.Module):
        super().__init__()
        self.encoder = encoder

    def forward(self, input_ids, attention_mask, token_type_ids):
        out = self.encoder(input_ids, attention_mask, token_type_ids)
        return out.last_hidden_state, out.pooler_output


def export_graph(encoder: nn.Module, path: Path, external_data: bool) -> None:
    """Trace the encoder with dynamic batch and sequence axes and write ``path``."""
    # Traced at 2 x 8: a dimension of size 1 would be frozen into the graph.
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(encoder.config.vocab_size, (2, 8), generator=generator)
    example = (input_ids, torch.ones_like(input_ids), torch.zeros_like(input_ids))
    axes = {0: "batch_size", 1: "sequence_length"}
    with quiet("torch.onnx"):
        torch.onnx.export(_Exportable(export_form(encoder)), example, str(path), input_names=list(INPUTS),
                          output_names=list(OUTPUTS), opset_version=OPSET, dynamo=True,
                          dynamic_shapes={name: axes for name in INPUTS},
                          external_data=external_data, verbose=False)


def check_batches(vocab_size: int, pad_id: int, max_length: int, window: int | None = None
                  ) -> dict[str, dict[str, np.ndarray]]:
    """Padded test batches, by name, of shapes other than the traced 2 x 8, with a
    second segment (token_type_ids 1) in some rows; for a model with a local attention
    ``window``, one batch longer than it too."""
    generator = torch.Generator().manual_seed(1)
    batches = {}
    longer = [[window + 9, window // 2]] if window and window + 9 <= max_length else []
    for rows in ([13, 9, 4], [5], *longer):
        width = min(max(rows), max_length)
        ids = torch.randint(vocab_size, (len(rows), width), generator=generator)
        lengths = torch.tensor([min(n, width) for n in rows])
        mask = (torch.arange(width)[None, :] < lengths[:, None]).long()
        types = ((torch.arange(width)[None, :] >= lengths[:, None] // 2) & mask.bool()).long()
        ids = torch.where(mask.bool(), ids, torch.full_like(ids, pad_id))
        batches[f"{len(rows)}x{width}"] = {"input_ids": ids.numpy(), "attention_mask": mask.numpy(),
                                           "token_type_ids": types.numpy()}
    return batches


def torch_outputs(encoder: nn.Module, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
    """pretextual's own encoder on a feed: [last_hidden_state, pooler_output]."""
    with torch.no_grad():
        out = encoder(**{k: torch.from_numpy(v) for k, v in feed.items()})
    return [out.last_hidden_state.numpy(), out.pooler_output.numpy()]


def compare_with_torch(session, encoder: nn.Module) -> dict[str, float]:
    """Max abs difference of every output, per test batch; raises PretextualError
    above TOLERANCE or when a fully masked row gives a non-finite value."""
    config = encoder.config
    batches = check_batches(config.vocab_size, config.pad_token_id, config.max_position_embeddings,
                            getattr(config, "local_attention", None))
    diffs = {}
    for name, feed in batches.items():
        (hidden, pooled), (want_hidden, want_pooled) = session.run(list(OUTPUTS), feed), \
            torch_outputs(encoder, feed)
        real = feed["attention_mask"].astype(bool)  # what a padding position holds is meaningless
        diffs[name] = max(float(np.abs(hidden - want_hidden)[real].max()),
                          float(np.abs(pooled - want_pooled).max()))
    feed = next(iter(batches.values()))
    mask = feed["attention_mask"].copy()
    mask[-1] = 0
    if not all(np.isfinite(o).all() for o in session.run(list(OUTPUTS), {**feed, "attention_mask": mask})):
        raise PretextualError("onnx: a fully masked row gives non-finite outputs")
    worst = max(diffs, key=diffs.get)
    if diffs[worst] > TOLERANCE:
        raise PretextualError(f"onnx: onnxruntime differs from torch: max abs diff "
                              f"{diffs[worst]:.3e} > {TOLERANCE:g} on the {worst} batch "
                              f"({', '.join(f'{k}: {v:.3e}' for k, v in diffs.items())})")
    return diffs


def export_onnx(model: ExportedModel, out_dir: Path, options: ExportOptions) -> ExportSummary:
    """Write model.onnx, check it, compare it with torch; with ``quantize="int8"``
    also model_quantized.onnx with its size, speed and similarity to fp32."""
    onnx, _ = require_onnx()
    path = out_dir / ONNX_FILE
    weight_bytes = sum(t.numel() * t.element_size() for t in model.encoder.state_dict().values())
    external = weight_bytes > ONE_FILE_LIMIT
    export_graph(model.encoder, path, external)
    try:
        onnx.checker.check_model(str(path), full_check=True)
    except onnx.checker.ValidationError as exc:
        raise PretextualError(f"onnx: {path} fails onnx.checker: {exc}") from None
    diffs = compare_with_torch(cpu_session(path), model.encoder)
    files = sorted(p.name for p in out_dir.iterdir() if p.name.startswith(ONNX_FILE))
    size = sum((out_dir / f).stat().st_size for f in files)
    lines = [f"{ONNX_FILE}: opset {OPSET}, {size / 1e6:.1f} MB"
             f"{' + external data' if external else ''}; onnx.checker full_check passed",
             "onnxruntime vs torch: max abs diff "
             + ", ".join(f"{v:.1e} ({k} with padding)" for k, v in diffs.items())
             + f"; limit {TOLERANCE:g}"]
    metrics = {"opset": OPSET, "bytes": size, "max_abs_diff": max(diffs.values()),
               **{f"max_abs_diff_{k}": v for k, v in diffs.items()}}
    if options.quantize == "int8":
        q = quantize_int8(model, path, external)
        files += q.files
        metrics.update(q.metrics)
        lines += q.lines
    return ExportSummary(files=files, metrics=metrics, lines=lines)


@hookimpl
def pretextual_register_exporters(register):
    register(ExporterSpec(name="onnx", export=export_onnx, quantize=("int8",),
                          description=f"model.onnx (opset {OPSET}) for onnxruntime, checked "
                                      f"against torch; --quantize int8"))
