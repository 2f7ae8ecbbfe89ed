"""The evaluation's table for people and its JSON for tools."""

from __future__ import annotations

import json
from pathlib import Path

from pretextual.core.files import atomic_write_text
from pretextual.errors import EvaluationError

SIGNIFICANT = 2.0
"""A difference counts as beyond the noise past this many standard errors (about 95%)."""


def _cell(entry: dict | None) -> str:
    if entry is None:
        return "-"
    return f"{entry['mean']:.4f} +/- {entry['std']:.4f}"


def _versus(entry: dict | None) -> str:
    if entry is None or "vs_untrained" not in entry:
        return ""
    d = entry["vs_untrained"]
    return f"{d['difference']:+.4f} (se {d['se']:.4f})"


def verdict(difference: float, se: float) -> str:
    """In words: whether a difference exceeds its noise."""
    if se == 0:
        return "no noise estimate" if difference == 0 else "exact"
    ratio = abs(difference) / se
    if ratio < SIGNIFICANT:
        return f"{ratio:.1f} se: within the noise"
    return f"{ratio:.1f} se: {'better' if difference > 0 else 'worse'}, beyond the noise"


def format_tables(document: dict) -> str:
    """One table per task: mean +/- sd over seeds of every model and baseline under each
    protocol, and each model's difference to the untrained encoder with its standard
    error (and whether it exceeds the noise)."""
    lines = []
    protocols = document.get("settings", {}).get("protocols", ["probe"])
    for name, task in document["tasks"].items():
        seeds = document.get("settings", {}).get("seeds")
        lines.append(f"{name}: {task['metric']}, n={task['n']}"
                     + (f", {seeds} seed(s)" if seeds else ""))
        rows = [("model", *protocols, *(f"{p} - untrained" for p in protocols))]
        for model, entry in task["models"].items():
            rows.append((model, *(_cell(entry.get(p)) for p in protocols),
                         *(_versus(entry.get(p)) for p in protocols)))
        for baseline, entry in task["baselines"].items():
            if baseline.startswith("untrained"):
                rows.append((f"[{baseline}]", *(_cell(entry.get(p)) for p in protocols),
                             *("" for _ in protocols)))
            else:  # majority and tfidf have no protocol
                rows.append((f"[{baseline}]", *(_cell(entry) for _ in protocols[:1]),
                             *("" for _ in protocols[1:]), *("" for _ in protocols)))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines += ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
        for model, entry in task["models"].items():
            for p in protocols:
                d = (entry.get(p) or {}).get("vs_untrained")
                if d is not None:
                    lines.append(f"  {model} {p} vs untrained: "
                                 f"{verdict(d['difference'], d['se'])}")
        for pair in task.get("pairs", []):
            lines.append(f"  {pair['a']} - {pair['b']} ({pair['protocol']}): "
                         f"{pair['difference']:+.4f} (se {pair['se']:.4f}), "
                         f"{verdict(pair['difference'], pair['se'])}")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def write_json(document: dict, path: str | Path) -> None:
    """The document as JSON, written atomically (a failed write leaves no half file)."""
    path = Path(path)
    if path.parent and not path.parent.is_dir():
        raise EvaluationError(f"--json {path}: no such directory {path.parent}")
    try:
        atomic_write_text(path, json.dumps(document, indent=2) + "\n")
    except OSError as exc:
        raise EvaluationError(f"--json {path}: cannot write it ({exc.strerror})") from None
