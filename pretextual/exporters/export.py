"""Exporting a checkpoint: every selected format into one directory, all or nothing.

The directory is built under a temporary name next to the target and renamed
into place only when every format has been written and has verified itself,
so an existing export is never half-overwritten and a failed export leaves
nothing behind.
"""

from __future__ import annotations

import json
import os
import time
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from safetensors import SafetensorError

from pretextual.core.files import atomic_directory, write_error_reason
from pretextual.core.tokenizer import vocab_of
from pretextual.errors import PluginError, PluginRunError, PretextualError, plugin_call
from pretextual.exporters.hf import architecture, config_json, hf_counterpart, write_tokenizer
from pretextual.exporters.load import CONFIG_FILE
from pretextual.exporters.source import find_checkpoint, load_checkpoint_model
from pretextual.plugins.api import ExportedModel, ExporterSpec, ExportOptions, ExportSummary
from pretextual.plugins.hookspecs import hookimpl

MANIFEST_FILE = "export.json"
DEFAULT_FORMATS = ("safetensors", "onnx")


@dataclass
class ExportReport:
    """What export_checkpoint did: where, from which checkpoint, and each format's summary."""

    out_dir: Path
    checkpoint: Path
    step: int
    objectives: str
    summaries: dict[str, ExportSummary] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)

    def lines(self) -> list[str]:
        """The summary printed to the user."""
        lines = [f"exported step {self.step} of {self.checkpoint} (objectives: {self.objectives}) "
                 f"to {self.out_dir}"]
        for name, summary in self.summaries.items():
            lines.append(f"  {name} ({self.seconds[name]:.1f} s): {', '.join(summary.files)}")
            lines += [f"    {line}" for line in summary.lines]
        return lines


def export_checkpoint(checkpoint: str | Path, out_dir: str | Path,
                      formats: str | Sequence[str] = DEFAULT_FORMATS, *,
                      with_heads: bool | None = None, quantize: str | None = None,
                      force: bool = False, plugins=None,
                      log: Callable[[str], None] = print) -> ExportReport:
    """Export a checkpoint (or a run directory's newest checkpoint) to ``out_dir``
    in each of ``formats`` (names of registered exporters, or one comma-separated string).

    ``out_dir`` gets config.json and the tokenizer files, each format's files and
    export.json (the summary, with every verification number). ``with_heads``: None
    writes the pretraining heads with the formats that can (so transformers' MLM
    classes get the trained head, not a random one), False the encoder alone, True
    the heads or an error when no selected format writes them. An existing
    non-empty ``out_dir`` is replaced only with ``force``, and only once the new
    export is complete. Raises PretextualError (CheckpointError, PluginError)
    with one line for a bad checkpoint, directory, format or option.
    """
    if plugins is None:
        from pretextual.plugins.manager import Plugins
        plugins = Plugins()
    if isinstance(formats, str):
        formats = formats.split(",")
    specs = [plugins.exporter(name) for name in dict.fromkeys(f.strip() for f in formats if f.strip())]
    if not specs:
        raise PretextualError("export: no format selected (e.g. --format safetensors,onnx)")
    _check_options(specs, with_heads, quantize, plugins)
    if with_heads is None:
        with_heads = any(s.heads for s in specs)
    ckpt = find_checkpoint(checkpoint)
    out_dir = Path(out_dir)
    _check_out_dir(out_dir, ckpt.path, force)
    model = load_checkpoint_model(ckpt)
    options = ExportOptions(with_heads=with_heads, quantize=quantize)
    report = ExportReport(out_dir, ckpt.path, ckpt.step, model.metadata["objectives"])

    try:
        _write_export(out_dir, model, specs, options, with_heads, report, ckpt)
    except (OSError, SafetensorError, PluginRunError) as exc:
        # a full disk, in pretextual's code or under an exporter: the export directory is as it was
        cause = exc.__cause__ if isinstance(exc, PluginRunError) else exc
        if not isinstance(cause, (OSError, SafetensorError)):
            raise
        raise PretextualError(f"{out_dir}: cannot write the export ({write_error_reason(cause)}); "
                              f"nothing there was replaced") from None
    for line in report.lines():
        log(line)
    return report


def _write_export(out_dir: Path, model: ExportedModel, specs: list[ExporterSpec],
                  options: ExportOptions, with_heads: bool, report: ExportReport, ckpt) -> None:
    """Build the export next to ``out_dir`` and rename it there once every format is written."""
    with ExitStack() as stack:
        tmp = _build_directory(out_dir, stack)
        written = set(write_common_files(model, tmp, with_heads))
        for spec in specs:
            start = time.perf_counter()
            summary = plugin_call(f"exporter {spec.name!r}", "export()", spec.export, model, tmp,
                                  options)
            report.seconds[spec.name] = time.perf_counter() - start
            if not isinstance(summary, ExportSummary):
                raise PluginError(f"exporter {spec.name!r}: export() must return a "
                                  f"pretextual.ExportSummary, got {type(summary).__name__}")
            clash = written & set(summary.files)
            if clash:
                raise PluginError(f"exporter {spec.name!r} wrote {', '.join(sorted(clash))}, "
                                  f"which another format already wrote")
            missing = sorted(f for f in summary.files if not (tmp / f).is_file())
            if missing:
                raise PluginError(f"exporter {spec.name!r} lists {', '.join(missing)}, which it did "
                                  f"not write")
            written |= set(summary.files)
            report.summaries[spec.name] = summary
        manifest = {"checkpoint": str(ckpt.path.resolve()), **model.metadata,
                    "options": asdict(options),
                    "formats": {n: {"files": s.files, "metrics": s.metrics}
                                for n, s in report.summaries.items()}}
        (tmp / MANIFEST_FILE).write_text(json.dumps(manifest, indent=1))
        _apply_umask(tmp)


@hookimpl(tryfirst=True)
def pretextual_on_train_end(metrics, trainer):
    """The built-in final export: the last checkpoint in each of trainer.export's formats,
    heads included where the format writes them, to <output_dir>/export (before any other
    plugin's end of training, which may read it)."""
    if trainer.export_formats:
        export_checkpoint(trainer.final_checkpoint, trainer.out / "export", trainer.export_formats,
                          force=True, plugins=trainer.plugins, log=trainer.log)


def write_common_files(model: ExportedModel, out_dir: Path, with_heads: bool) -> list[str]:
    """config.json and the tokenizer files, which every format's consumers read;
    the tokenizer's model_max_length is the trained sequence length."""
    hf_heads = {name for name, t in model.heads.items() if hf_counterpart(name, t, model.config)}
    config = config_json(model.config, architecture(model.config, hf_heads if with_heads else set()),
                         vocab_of(model.tokenizer))
    (out_dir / CONFIG_FILE).write_text(json.dumps(config, indent=2), encoding="utf-8")
    return [CONFIG_FILE, *write_tokenizer(model.tokenizer, model.max_seq_length, out_dir)]


def _check_options(specs: list[ExporterSpec], with_heads: bool | None, quantize: str | None,
                   plugins) -> None:
    names = ", ".join(s.name for s in specs)
    if with_heads and not any(s.heads for s in specs):
        able = sorted(n for n, s in plugins.exporters.items() if s.heads)
        raise PretextualError(f"with_heads=True: none of the selected formats ({names}) writes heads "
                              f"(formats that do: {', '.join(able) or 'none'})")
    if quantize and not any(quantize in s.quantize for s in specs):
        able = sorted(n for n, s in plugins.exporters.items() if quantize in s.quantize)
        raise PretextualError(f"--quantize {quantize}: none of the selected formats ({names}) "
                              f"supports it (formats that do: {', '.join(able) or 'none'})")


def _check_out_dir(out_dir: Path, checkpoint: Path, force: bool) -> None:
    # The nearest part of the path that exists must be a directory to build the export in.
    blocker = next(p for p in (out_dir, *out_dir.parents) if p.exists())
    if not blocker.is_dir():
        where = "" if blocker == out_dir else f"{blocker} "
        raise PretextualError(f"{out_dir}: {where}exists and is not a directory; "
                              f"choose another --out")
    target, source = out_dir.resolve(), checkpoint.resolve()
    if target == source or target in source.parents or source in target.parents:
        raise PretextualError(f"{out_dir}: holds or is inside the checkpoint being exported; "
                              f"choose another --out")
    if out_dir.is_dir() and any(out_dir.iterdir()) and not force:
        raise PretextualError(f"{out_dir}: exists and is not empty; pass --force to replace it")


def _build_directory(out_dir: Path, stack: ExitStack) -> Path:
    """The directory the export is built in, next to ``out_dir`` (making its parents): an
    :func:`atomic_directory` entered on ``stack``, renamed to ``out_dir`` when it closes."""
    try:
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        return stack.enter_context(atomic_directory(out_dir))
    except OSError as exc:  # a read-only or virtual file system, no permission
        raise PretextualError(f"{out_dir}: cannot create the export there ({exc.strerror}); "
                              f"choose another --out") from None


def _apply_umask(directory: Path) -> None:
    # mkdtemp and safetensors create owner-only modes; an export is meant to be shared.
    umask = os.umask(0)
    os.umask(umask)
    for path in [directory, *directory.rglob("*")]:
        path.chmod((0o777 if path.is_dir() else 0o666) & ~umask)
