"""The floors hold: the plugin surface imports nothing of the core, and the core
satisfies the surface's protocols."""

from __future__ import annotations

import ast
import dataclasses
import json
import subprocess
import sys
import typing
from pathlib import Path

import pytest
import torch

import pretextual
from pretextual.core.config import WeightSchedule
from pretextual.architectures import architecture, sized_config
from pretextual.plugins import api

PACKAGE = Path(pretextual.__file__).resolve().parent
ABOVE_THE_SURFACE = ("pretextual.core", "pretextual.analysis", "pretextual.exporters",
                     "pretextual.evaluation", "pretextual.objectives", "pretextual.loggers")
SURFACE_MAY_IMPORT = {"torch", "numpy", "pluggy", "pretextual.errors", "pretextual.plugins"}


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)


def imports_of(path: Path) -> set[str]:
    """Every module ``path`` imports, at the top or inside a function; ``from a import b``
    counts as importing ``a.b`` too when that is a module of pretextual."""
    package = module_name(path).rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            found.add(base)
            for alias in node.names:
                candidate = PACKAGE.parent / Path(*f"{base}.{alias.name}".split("."))
                if candidate.with_suffix(".py").is_file() or candidate.is_dir():
                    found.add(f"{base}.{alias.name}")
    return found


def allowed_on_the_surface(module: str) -> bool:
    top = module.split(".")[0]
    return (top in sys.stdlib_module_names or top in SURFACE_MAY_IMPORT
            or any(module == m or module.startswith(m + ".") for m in SURFACE_MAY_IMPORT))


def test_importing_the_api_loads_nothing_above_it():
    code = ("import json, sys; import pretextual.plugins.api; "
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith('pretextual'))))")
    loaded = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True,
                                       text=True, check=True).stdout)
    assert "pretextual.plugins.api" in loaded
    assert [m for m in loaded if m.startswith(ABOVE_THE_SURFACE)] == []


def test_the_surface_imports_only_the_standard_library_torch_numpy_and_itself():
    for path in (PACKAGE / "plugins" / "api.py", PACKAGE / "plugins" / "hookspecs.py"):
        outside = sorted(m for m in imports_of(path) if not allowed_on_the_surface(m))
        assert outside == [], f"{path.name} imports {outside}"


def test_the_onnx_exporter_and_its_quantization_do_not_import_each_other():
    exporters = {module_name(p): imports_of(p) for p in (PACKAGE / "exporters").glob("*.py")}
    onnx, quantize = "pretextual.exporters.onnx", "pretextual.exporters.quantize"

    def reaches(start: str, goal: str) -> bool:
        seen, todo = set(), [start]
        while todo:
            module = todo.pop()
            for imported in exporters.get(module, ()):
                if imported == goal:
                    return True
                if imported in exporters and imported not in seen:
                    seen.add(imported)
                    todo.append(imported)
        return False

    assert not (reaches(onnx, quantize) and reaches(quantize, onnx))
    assert not reaches(quantize, onnx)  # the quantization builds on what the exporter shares


def test_the_schedule_keys_are_those_the_core_reads():
    assert api.SCHEDULE_KEYS == {f.name for f in dataclasses.fields(WeightSchedule)}


def protocol_members(protocol: type) -> set[str]:
    """The attributes and methods a protocol declares."""
    return {name for name in {*typing.get_type_hints(protocol), *vars(protocol)}
            if not name.startswith("_")}


@pytest.mark.parametrize("name", ["bert", "modernbert"])
def test_each_built_in_encoder_is_what_the_surface_promises(name):
    spec = architecture(name)
    config = sized_config(spec, "tiny", {"hidden_size": 8, "num_attention_heads": 2}, {},
                          vocab_size=50)
    model = spec.model(config)
    fields = {f.name for f in dataclasses.fields(spec.config)} | {"architecture"}
    assert protocol_members(api.EncoderConfigLike) <= fields | {"to_dict", "num_parameters"}
    assert config.architecture == name
    assert config.num_parameters() == sum(p.numel() for p in model.parameters())
    assert protocol_members(api.Encoder) <= set(dir(model))
    assert isinstance(model.get_input_embeddings(), torch.nn.Embedding)
    assert model.get_input_embeddings().weight.shape == (50, 8)
    assert isinstance(model.new_prediction_head()(torch.zeros(1, 8)), torch.Tensor)
    ids = torch.ones(2, 3, dtype=torch.long)
    out = model(ids, torch.ones_like(ids), torch.zeros_like(ids))
    assert protocol_members(api.EncoderOutputLike) <= set(dir(out))
    assert out.pooler_output.shape == (2, 8)


def test_the_core_imports_neither_analysis_nor_exporters():
    """The final export and the plot are plugins on pretextual_on_train_end, not core code."""
    for path in sorted((PACKAGE / "core").glob("*.py")):
        above = sorted(m for m in imports_of(path)
                       if m.startswith(("pretextual.analysis", "pretextual.exporters")))
        assert above == [], f"core/{path.name} imports {above}"


def test_no_module_imports_numba_or_llvmlite():
    """The plain core needs no JIT compiler: masking draws from torch generators, and no
    hand-written CPU kernel is kept (docs/benchmarks.md measured none faster than torch)."""
    for path in sorted(PACKAGE.rglob("*.py")):
        kernels = sorted(m for m in imports_of(path) if m.split(".")[0] in ("numba", "llvmlite"))
        assert kernels == [], f"{path.relative_to(PACKAGE)} imports {kernels}"