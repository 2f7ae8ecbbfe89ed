"""Helpers of the analysis tests: metrics files written by hand, read back independently,
and a PNG header reader."""

from __future__ import annotations

import json
import struct
from pathlib import Path


def read_lines(run_dir: Path) -> list[dict]:
    """metrics.jsonl read back independently of pretextual.analysis."""
    return [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]


def write_metrics(run_dir: Path, lines: list[dict]) -> Path:
    """A run directory holding just these metrics lines."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(l) + "\n" for l in lines))
    return run_dir


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) from a PNG's IHDR chunk; fails unless the file is a PNG."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    assert data[12:16] == b"IHDR"
    assert data[-8:-4] == b"IEND", f"{path} is truncated"
    return struct.unpack(">II", data[16:24])


def _step(step, loss, tokens, tokens_per_s):
    return {"step": step, "loss": loss, "loss/mlm": loss, "weight/mlm": 1.0, "lr": 1e-3,
            "tokens": tokens, "tokens_per_s": tokens_per_s}


# Every step logged. Tokens 100+120+80+100 = 400 in 2+2+2+4 = 10 s: 40 tokens/s.
# eval/loss is best at its last evaluation, eval/mlm/accuracy at its first.
RUN_A = [_step(1, 4.0, 100, 50.0), _step(2, 3.0, 120, 60.0),
         {"step": 2, "eval/loss": 3.5, "eval/mlm/accuracy": 0.25},
         _step(3, 2.5, 80, 40.0), _step(4, 2.0, 100, 25.0),
         {"step": 4, "eval/loss": 3.0, "eval/mlm/accuracy": 0.125}]

# Every second step logged (trainer.log_every=2): a line's tokens stand for both steps, so
# 2*50 + 2*60 = 220 tokens in 100/20 + 120/30 = 9 s. No eval/mlm/accuracy at all.
RUN_B = [_step(2, 5.0, 50, 20.0), _step(4, 4.0, 60, 30.0), {"step": 4, "eval/loss": 4.5}]
