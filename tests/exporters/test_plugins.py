"""Exporters are plugins: the built-ins register through the same hook a third party uses,
and a third-party exporter takes part in an export like a built-in one."""

from __future__ import annotations

import json
import sys
import types

import pytest

from pretextual.errors import PluginError, PretextualError
from pretextual.exporters.export import export_checkpoint
from pretextual.plugins.api import ExporterSpec, ExportSummary
from pretextual.plugins.hookspecs import hookimpl
from pretextual.plugins.manager import Plugins


@pytest.fixture
def plugin_module(monkeypatch):
    """plugin_module(export) -> Plugins with an in-test plugin registering exporter "sizes"."""
    def make(export, name="sizes"):
        module = types.ModuleType("exporter_under_test")

        @hookimpl
        def pretextual_register_exporters(register):
            register(ExporterSpec(name=name, export=export, description="test exporter"))

        module.pretextual_register_exporters = pretextual_register_exporters
        monkeypatch.setitem(sys.modules, module.__name__, module)
        return Plugins(extra_modules=(module.__name__,))
    return make


def test_builtins_register_through_the_hook():
    plugins = Plugins()
    for name in ("safetensors", "onnx"):
        owner = plugins.owner("exporter", name)
        assert owner.name == name and owner.exporters == [name]
        assert "pretextual_register_exporters" in owner.hooks
    assert plugins.exporters["onnx"].quantize == ("int8",) and plugins.exporters["safetensors"].heads


def test_third_party_exporter_takes_part(mlm_run, tmp_path, plugin_module):
    def export(model, out_dir, options):
        (out_dir / "sizes.json").write_text(json.dumps({"hidden": model.config.hidden_size,
                                                        "step": model.metadata["step"]}))
        return ExportSummary(files=["sizes.json"], metrics={"hidden": model.config.hidden_size},
                             lines=["sizes.json: the encoder's sizes"])

    out = tmp_path / "out"
    report = export_checkpoint(mlm_run, out, "safetensors, sizes", plugins=plugin_module(export),
                               log=lambda *a: None)
    assert json.loads((out / "sizes.json").read_text()) == {"hidden": 128, "step": "3"}
    assert (out / "model.safetensors").is_file() and (out / "config.json").is_file()
    assert "    sizes.json: the encoder's sizes" in report.lines()
    assert json.loads((out / "export.json").read_text())["formats"]["sizes"]["metrics"] == {"hidden": 128}


def test_the_default_writes_heads_only_where_a_selected_format_can(mlm_run, tmp_path, plugin_module):
    def export(model, out_dir, options):
        (out_dir / "heads.txt").write_text(str(options.with_heads))
        return ExportSummary(files=["heads.txt"])

    plugins = plugin_module(export)  # "sizes" is registered with heads=False
    out = tmp_path / "out"
    export_checkpoint(mlm_run, out, ["sizes"], plugins=plugins, log=lambda *a: None)
    assert (out / "heads.txt").read_text() == "False"
    assert json.loads((out / "config.json").read_text())["architectures"] == ["BertModel"]
    with pytest.raises(PretextualError, match=r"^with_heads=True: none of the selected formats "
                                              r"\(sizes\) writes heads \(formats that do: safetensors\)$"):
        export_checkpoint(mlm_run, tmp_path / "other", ["sizes"], with_heads=True, plugins=plugins,
                          log=lambda *a: None)
    export_checkpoint(mlm_run, out, ["safetensors", "sizes"], force=True, plugins=plugins,
                      log=lambda *a: None)
    assert (out / "heads.txt").read_text() == "True"
    assert json.loads((out / "config.json").read_text())["architectures"] == ["BertForMaskedLM"]


def test_a_failing_exporter_leaves_the_old_export_whole(mlm_run, tmp_path, plugin_module):
    out = tmp_path / "out"
    export_checkpoint(mlm_run, out, ["safetensors"], log=lambda *a: None)
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def export(model, out_dir, options):
        (out_dir / "partial.bin").write_bytes(b"half")
        raise PretextualError("sizes: disk full")

    with pytest.raises(PretextualError, match="disk full"):
        export_checkpoint(mlm_run, out, ["safetensors", "sizes"], force=True,
                          plugins=plugin_module(export), log=lambda *a: None)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_an_exporter_overwriting_another_format_is_refused(mlm_run, tmp_path, plugin_module):
    def export(model, out_dir, options):
        (out_dir / "model.safetensors").write_bytes(b"mine")
        return ExportSummary(files=["model.safetensors"])

    with pytest.raises(PluginError, match="exporter 'sizes' wrote model.safetensors"):
        export_checkpoint(mlm_run, tmp_path / "out", ["safetensors", "sizes"],
                          plugins=plugin_module(export), log=lambda *a: None)
    assert not (tmp_path / "out").exists()


def lists_a_file_it_did_not_write(model, out_dir, options):
    return ExportSummary(files=["nothere.npy"])


def returns_nothing(model, out_dir, options):
    (out_dir / "a.bin").write_bytes(b"x")


def raises(model, out_dir, options):
    raise ValueError("unsupported head")


@pytest.mark.parametrize("export, message", [
    (lists_a_file_it_did_not_write, r"^exporter 'sizes' lists nothere\.npy, which it did not write$"),
    (returns_nothing, r"^exporter 'sizes': export\(\) must return a pretextual\.ExportSummary, got NoneType$"),
    (raises, r"^exporter 'sizes': export\(\) raised ValueError: unsupported head \(at test_plugins\.py:\d+\)$"),
])
def test_an_exporter_that_misbehaves_is_one_line_and_leaves_nothing(mlm_run, tmp_path, plugin_module,
                                                                    export, message):
    with pytest.raises(PluginError, match=message):
        export_checkpoint(mlm_run, tmp_path / "out", ["safetensors", "sizes"],
                          plugins=plugin_module(export), log=lambda *a: None)
    assert [p.name for p in tmp_path.iterdir()] == []
