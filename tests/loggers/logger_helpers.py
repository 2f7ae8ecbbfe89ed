"""Helpers of the logger tests: metrics.jsonl read back independently of pretextual, and the
records of a W&B run file (``run-<id>.wandb``) read with W&B's own protobuf schema."""

from __future__ import annotations

import json
import struct
import time
import zlib
from pathlib import Path

WANDB_BLOCK = 32768
"""The .wandb file is a LevelDB-style log: a 7-byte header (':W&B', magic, version), then
32 KiB blocks of chunks, each a 7-byte header (CRC-32 of type and data, length, type) and
data; a record is one FULL chunk or FIRST, MIDDLE..., LAST."""
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def read_lines(run_dir: Path) -> list[dict]:
    """metrics.jsonl read back independently of pretextual.analysis."""
    return [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]


def wandb_records(path: Path) -> list:
    """Every complete record of a .wandb file as a ``wandb_internal_pb2.Record``, each
    chunk's checksum verified."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B run file"
    records, position, pending = [], 7, b""
    while position + 7 <= len(data):
        left = WANDB_BLOCK - position % WANDB_BLOCK
        if left < 7:  # a block's last bytes are padding when no chunk header fits
            position += left
            continue
        checksum, length, kind = struct.unpack("<IHB", data[position:position + 7])
        if (checksum, length, kind) == (0, 0, 0):
            break  # the zeros after the last chunk
        if position + 7 + length > len(data):
            break  # a chunk still being written
        chunk = data[position + 7:position + 7 + length]
        assert zlib.crc32(bytes([kind]) + chunk) == checksum, f"{path}: bad chunk at {position}"
        position += 7 + length
        pending += chunk
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def wandb_history(path: Path) -> list[dict]:
    """The history rows of a .wandb file: ``{"_step": 1, "loss": 2.3, ...}`` in order."""
    rows = []
    for record in wandb_records(path):
        if record.WhichOneof("record_type") == "history":
            rows.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                         for item in record.history.item})
    return rows


def wandb_run_file(run_dir: Path, index: int = -1, timeout: float = 60.0) -> Path:
    """The run file of the ``index``-th offline W&B run in ``run_dir`` (by start time), once
    it holds the run's exit record: wandb-core writes it in its own process, and may still
    be writing when ``finish()`` has returned."""
    runs = sorted((run_dir / "wandb").glob("offline-run-*"))
    (file,) = runs[index].glob("run-*.wandb")
    deadline = time.monotonic() + timeout
    while not any(r.WhichOneof("record_type") == "exit" for r in wandb_records(file)):
        assert time.monotonic() < deadline, f"{file}: no exit record after {timeout:.0f} s"
        time.sleep(0.2)
    return file
