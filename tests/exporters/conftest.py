"""Fixtures of the exporter tests: tiny runs trained once per session and their exports."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from export_helpers import train_run
from pretextual.exporters.export import export_checkpoint


@pytest.fixture(autouse=True, scope="session")
def one_torch_thread():
    """Tiny models gain nothing from more threads, and on a shared machine extra ones spin."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def mlm_run(tmp_path_factory, corpus_file, cache_dir) -> Path:
    """A "roberta" (MLM only) run."""
    return train_run(tmp_path_factory.mktemp("mlm"), corpus_file, cache_dir, "roberta")


@pytest.fixture(scope="session")
def nsp_run(tmp_path_factory, corpus_file, cache_dir) -> Path:
    """A "bert" (MLM + NSP) run."""
    return train_run(tmp_path_factory.mktemp("nsp"), corpus_file, cache_dir, "bert")


@pytest.fixture(scope="session")
def sop_run(tmp_path_factory, corpus_file, cache_dir) -> Path:
    """An "albert" (whole-word MLM + SOP) run."""
    return train_run(tmp_path_factory.mktemp("sop"), corpus_file, cache_dir, "albert")


@pytest.fixture(scope="session")
def full_export(mlm_run, tmp_path_factory):
    """(directory, report) of the MLM run exported in both formats (heads by default) and int8."""
    out = tmp_path_factory.mktemp("full") / "export"
    report = export_checkpoint(mlm_run, out, ["safetensors", "onnx"], quantize="int8",
                               log=lambda *a: None)
    return out, report


@pytest.fixture(scope="session")
def encoder_export(mlm_run, tmp_path_factory) -> Path:
    """The MLM run exported as an encoder only (safetensors, no heads)."""
    out = tmp_path_factory.mktemp("encoder") / "export"
    export_checkpoint(mlm_run, out, ["safetensors"], with_heads=False, log=lambda *a: None)
    return out
