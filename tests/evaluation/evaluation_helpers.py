"""Task files for the evaluation tests: sentences whose topic is in their words."""

from __future__ import annotations

import csv
import json
import random
from pathlib import Path

from run_helpers import TOPICS, VERBS


def topic_rows(groups: int = 36, per_group: int = 5, seed: int = 1) -> list[dict]:
    """Sentences of the training corpus's kind, labelled by topic; each group is one
    "document" of sentences on one topic."""
    rng = random.Random(seed)
    names = sorted(TOPICS)
    rows = []
    for g in range(groups):
        topic = names[g % len(names)]
        words = TOPICS[topic].split()
        for _ in range(per_group):
            n = rng.randint(4, 9)
            text = " ".join(rng.choice(words) if i % 3 else rng.choice(VERBS) for i in range(n))
            rows.append({"text": text.capitalize() + ".", "label": topic, "doc": f"d{g}"})
    return rows


def write_rows(path: Path, rows: list[dict]) -> Path:
    """``rows`` as .jsonl, .csv or .tsv, by the path's suffix."""
    if path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
        return path
    if path.suffix == ".tsv":  # GLUE's layout: no quoting at all
        lines = ["\t".join(rows[0])] + ["\t".join(str(v) for v in r.values()) for r in rows]
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        return path
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


def write_topic_task(path: Path, **kwargs) -> Path:
    return write_rows(path, topic_rows(**kwargs))
