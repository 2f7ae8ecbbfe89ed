"""Downstream tasks: labelled text read from a user's file or registered by a plugin, checked.

A task file is ``.csv``, ``.tsv`` (GLUE's layout: tab-separated, a header line, no
quoting) or ``.jsonl`` (one JSON object per line), with a ``text`` column, optionally
``text_pair``, a ``label`` and a group column (the names can be changed). Labels are
class names or integer ids (classification) or numbers with a fraction (regression).
Every problem is one :class:`~pretextual.errors.EvaluationError` naming the file, the
line and the column.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pretextual.errors import EvaluationError, PretextualError
from pretextual.plugins.api import TaskData

CLASSIFICATION, REGRESSION = "classification", "regression"
FORMATS = (".csv", ".tsv", ".jsonl")


@dataclass(frozen=True)
class Columns:
    """Which columns of a task file hold what (``--text-column`` and the like)."""

    text: str = "text"
    pair: str | None = None
    """The second text of a pair task; None reads ``text_pair`` when the file has one."""
    label: str = "label"
    group: str | None = None


@dataclass
class Task:
    """A checked task: texts, labels as numbers, and where the evaluation examples are."""

    name: str
    kind: str
    """CLASSIFICATION or REGRESSION."""
    text: list[str]
    text_pair: list[str] | None
    y: np.ndarray
    """Class indices into ``classes`` (int64), or the regression targets (float64)."""
    classes: list[str]
    """Class names in index order (empty for regression)."""
    groups: np.ndarray | None
    """A group id per example, or None."""
    eval_start: int | None
    """Examples from this index on are the separate evaluation split; None cross-validates."""

    @property
    def metric(self) -> str:
        return "accuracy" if self.kind == CLASSIFICATION else "pearson"

    def __len__(self) -> int:
        return len(self.text)


def _rows(path: Path, needed: list[str]) -> list[tuple[int, dict[str, Any]]]:
    """(line number, row) of a task file; EvaluationError for a file that cannot be read
    or lacks a needed column."""
    suffix = path.suffix.lower()
    if suffix not in FORMATS:
        raise EvaluationError(f"{path}: not a task file (expected {', '.join(FORMATS)})")
    try:
        text = path.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise EvaluationError(f"{path}: no such task file") from None
    except UnicodeDecodeError:
        raise EvaluationError(f"{path}: not UTF-8 text") from None
    except OSError as exc:
        raise EvaluationError(f"{path}: cannot read it ({exc.strerror})") from None
    if suffix == ".jsonl":
        rows = []
        for number, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as exc:
                raise EvaluationError(f"{path}:{number}: not a JSON object ({exc})") from None
            if not isinstance(row, dict):
                raise EvaluationError(f"{path}:{number}: not a JSON object")
            missing = [c for c in needed if c not in row]
            if missing:
                raise EvaluationError(f"{path}:{number}: no column {missing[0]!r} "
                                      f"(has: {', '.join(row)})")
            rows.append((number, row))
        return rows
    # GLUE's TSVs are not quoted (a sentence may hold a lone "); CSV files are.
    dialect = dict(delimiter="\t", quoting=csv.QUOTE_NONE) if suffix == ".tsv" else {}
    reader = csv.reader(text.splitlines(), **dialect)
    header = next(reader, None)
    if header is None:
        raise EvaluationError(f"{path}: empty (expected a header line)")
    missing = [c for c in needed if c not in header]
    if missing:
        raise EvaluationError(f"{path}: no column {missing[0]!r} in its header "
                              f"(has: {', '.join(header)})")
    rows = []
    for number, values in enumerate(reader, 2):
        if not any(v.strip() for v in values):
            continue
        if len(values) != len(header):
            raise EvaluationError(f"{path}:{number}: {len(values)} fields, the header has "
                                  f"{len(header)}")
        rows.append((number, dict(zip(header, values))))
    return rows


def _header(path: Path) -> list[str]:
    """The column names of a task file (its header, or its first JSON object's keys)."""
    rows = _rows(path, [])
    if path.suffix.lower() == ".jsonl":
        return list(rows[0][1]) if rows else []
    with open(path, encoding="utf-8-sig") as f:
        line = f.readline().rstrip("\r\n")
    return line.split("\t") if path.suffix.lower() == ".tsv" else next(csv.reader([line]), [])


def read_task_file(path: str | Path, columns: Columns = Columns()) -> TaskData:
    """The examples of a task file, texts checked non-empty; labels as written."""
    path = Path(path)
    pair = columns.pair
    if pair is None and "text_pair" in _header(path):
        pair = "text_pair"
    needed = [columns.text, columns.label] + [c for c in (pair, columns.group) if c]
    rows = _rows(path, needed)
    if not rows:
        raise EvaluationError(f"{path}: holds no examples")
    data = TaskData(text=[], label=[], text_pair=[] if pair else None,
                    group=[] if columns.group else None)
    for number, row in rows:
        for column, target in ((columns.text, data.text), (pair, data.text_pair)):
            if column is None:
                continue
            value = row[column]
            if not isinstance(value, str) or not value.strip():
                raise EvaluationError(f"{path}:{number}: column {column!r} is "
                                      f"{'empty' if isinstance(value, str) or value is None else f'not text ({value!r})'}")
            target.append(value)
        data.label.append(_label(row[columns.label], f"{path}:{number}: column {columns.label!r}"))
        if columns.group:
            data.group.append(row[columns.group])
    return data


def _label(value: Any, where: str) -> str | int | float:
    """A label as written: a class name, an integer id or a number."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise EvaluationError(f"{where}: label {value} is neither a class nor a finite number")
        return value
    if isinstance(value, str) and value.strip():
        text = value.strip()
        try:
            return int(text)
        except ValueError:
            pass
        try:
            number = float(text)
        except ValueError:
            return text
        if not math.isfinite(number):
            raise EvaluationError(f"{where}: label {text!r} is neither a class nor a finite number")
        return number
    raise EvaluationError(f"{where}: label {value!r} is neither a class nor a number")


def _kind(labels: list[Any], source: str) -> str:
    """Regression when every label is a number and one has a fraction; else classification
    (class names, or integer ids)."""
    numbers = [isinstance(v, (int, float)) for v in labels]
    if all(numbers) and any(isinstance(v, float) for v in labels):
        return REGRESSION
    if any(numbers) and not all(numbers) and source.endswith(".jsonl"):
        first = next(v for v in labels if isinstance(v, (int, float)))
        raise EvaluationError(f"{source}: labels mix class names and numbers ({first!r}); "
                              f"write every label as a name, or every label as a number")
    return CLASSIFICATION


def build_task(name: str, train: TaskData, evaluation: TaskData | None = None) -> Task:
    """The checked task of ``train`` (and a separate evaluation split): labels numbered,
    one class only refused, groups and pairs present on both sides or neither."""
    parts = [train] + ([evaluation] if evaluation is not None else [])
    for part, side in zip(parts, ("", " (evaluation split)")):
        n = len(part.text)
        if n == 0:
            raise EvaluationError(f"{name}{side}: holds no examples")
        for field_name in ("label", "text_pair", "group"):
            values = getattr(part, field_name)
            if values is not None and len(values) != n:
                raise EvaluationError(f"{name}{side}: {len(values)} {field_name} values for {n} texts")
        if any(not isinstance(t, str) or not t.strip() for t in part.text):
            raise EvaluationError(f"{name}{side}: an empty text")
    if evaluation is not None and (evaluation.text_pair is None) != (train.text_pair is None):
        raise EvaluationError(f"{name}: the training and evaluation files differ in having a "
                              f"text_pair column")
    labels = train.label + (evaluation.label if evaluation is not None else [])
    kind = _kind(labels, name)
    if kind == REGRESSION:
        y = np.asarray(labels, dtype=np.float64)
        classes: list[str] = []
        if np.ptp(y[:len(train.label)]) == 0:
            raise EvaluationError(f"{name}: every training label is {y[0]:g}; nothing to learn")
    else:
        names = [str(v) for v in labels]
        classes = sorted(set(names[:len(train.label)]), key=_class_order)
        if len(classes) < 2:
            raise EvaluationError(f"{name}: one class only ({classes[0]!r}); a classification "
                                  f"task needs two or more")
        index = {c: i for i, c in enumerate(classes)}
        unseen = [c for c in names[len(train.label):] if c not in index]
        if unseen:
            raise EvaluationError(f"{name}: the evaluation split has class {unseen[0]!r}, which "
                                  f"the training split lacks")
        y = np.array([index[c] for c in names], dtype=np.int64)
    groups = None  # only cross-validation reads them
    if train.group is not None and evaluation is None:
        _, groups = np.unique(np.array([str(g) for g in train.group]), return_inverse=True)
    pair = None
    if train.text_pair is not None:
        pair = train.text_pair + (evaluation.text_pair if evaluation is not None else [])
    return Task(name=name, kind=kind, text=train.text + (evaluation.text if evaluation is not None else []),
                text_pair=pair, y=y, classes=classes, groups=groups,
                eval_start=len(train.text) if evaluation is not None else None)


def _class_order(name: str) -> tuple:
    """Integer ids in numeric order, then names alphabetically."""
    try:
        return (0, int(name), "")
    except ValueError:
        return (1, 0, name)


def load_task(source: str, plugins, columns: Columns = Columns(),
              eval_file: str | None = None) -> Task:
    """The task ``source`` names: a task file, or a task a plugin registers by name."""
    path = Path(source)
    if path.suffix.lower() in FORMATS or path.exists():
        train = read_task_file(path, columns)
        evaluation = read_task_file(eval_file, columns) if eval_file else None
        return build_task(str(source), train, evaluation)
    spec = plugins.task(source)
    if eval_file:
        raise EvaluationError(f"--eval-file: task {source!r} is registered by a plugin, which "
                              f"brings its own evaluation split; --eval-file is for task files")
    try:
        train = spec.load()
        evaluation = spec.load_eval() if spec.load_eval is not None else None
    except PretextualError:
        raise
    except Exception as exc:
        raise EvaluationError(f"task {source!r} (registered by "
                              f"{plugins.owner('task', source).label()}) failed to load: "
                              f"{type(exc).__name__}: {exc}") from None
    return build_task(source, train, evaluation)
