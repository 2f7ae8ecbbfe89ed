"""The benchmark runs: `python -m benchmarks --smoke` (tiny sizes, one round) end to end.

It exists so the benchmark cannot rot; no timing is asserted (the smoke sizes
measure nothing). Needs the benchmark extra (transformers, onnx, onnxruntime).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_smoke_run_writes_every_comparison(tmp_path):
    for module in ("transformers", "onnx", "onnxruntime", "onnxscript"):
        pytest.importorskip(module)
    out = tmp_path / "benchmarks.md"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    result = subprocess.run([sys.executable, "-m", "benchmarks", "--smoke", "--out", str(out)],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    text = out.read_text(encoding="utf-8")
    assert "python -m benchmarks --smoke" in text
    for row in ("training step, fp32, like for like", "training step, bf16, like for like",
                "bf16 autocast on both sides", "given pretextual's allocator setting",
                "the allocator setting's gain",
                "end to end on the embedded corpus",
                "masking, MLM 80/10/10", "masking, whole-word masking",
                "inference latency, batch 1", "ONNX fused, dynamic int8", "model FLOP utilisation",
                "model FLOP utilisation ceiling, bf16: the step's matmuls alone",
                "corpus preparation", "ModernBERT training step, fp32, against transformers' default",
                "ModernBERT training step, fp32, against transformers with sparse_prediction=True",
                "document attention, forward + backward"):
        assert row in text, row
    # The table printed on stdout is the one written to the file.
    assert text.strip() in result.stdout


def test_smoke_never_touches_the_published_table(tmp_path):
    """--smoke without --out writes no file (docs/benchmarks.md holds only full runs)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from benchmarks.run import DEFAULT_OUT, parse_args

    args = parse_args(["--smoke"])
    assert args.smoke and args.out is None
    assert DEFAULT_OUT == ROOT / "docs" / "benchmarks.md"
