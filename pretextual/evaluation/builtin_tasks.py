"""Built-in downstream tasks, registered through the same hook a third-party plugin uses.

``python-packages``: which standard-library package a docstring sentence comes from
(asyncio, email, importlib, logging, tkinter, unittest, urllib/http or xml), grouped by
source file. It is made from text that ships with every Python, and from files the
embedded pretraining corpus does not read (that corpus takes the top-level modules
only), so the main job can show downstream quality on held-out text with nothing
downloaded.
"""

from __future__ import annotations

import ast
import random
import sysconfig
from pathlib import Path

import pretextual
from pretextual.core.corpus import prose_blocks, split_sentences
from pretextual.errors import EvaluationError
from pretextual.plugins.api import TaskData, TaskSpec

PACKAGES = {"asyncio": ("asyncio",), "email": ("email",), "importlib": ("importlib",),
            "logging": ("logging",), "tkinter": ("tkinter",), "unittest": ("unittest",),
            "web": ("urllib", "http"), "xml": ("xml",)}
"""Label -> the stdlib packages its sentences come from (present in Python 3.10 to 3.13)."""
PER_CLASS = 250
"""Sentences per label at most, drawn evenly over its files (balanced classes)."""
MIN_WORDS = 5


def _sentences(path: Path) -> list[str]:
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (SyntaxError, UnicodeDecodeError, OSError):
        return []
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node)
            for block in prose_blocks(doc) if doc else ():
                found += [s for s in split_sentences(block) if len(s.split()) >= MIN_WORDS]
    return list(dict.fromkeys(found))


def python_packages() -> TaskData:
    """The python-packages task: the same examples on every install of one Python version."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    data = TaskData(text=[], label=[], group=[])
    seen: set[str] = set()
    rng = random.Random(0)
    for label, packages in PACKAGES.items():
        files = sorted(p for package in packages for p in (stdlib / package).rglob("*.py")
                       if "test" not in p.relative_to(stdlib).parts[1:] and "tests" not in p.parts)
        by_file = [(f, [s for s in _sentences(f) if s not in seen]) for f in files]
        by_file = [(f, s) for f, s in by_file if s]
        for f, sentences in by_file:
            rng.shuffle(sentences)
        # Round-robin over files, so one large module does not make the whole class.
        picked = []
        while len(picked) < PER_CLASS and any(s for _, s in by_file):
            for f, sentences in by_file:
                if sentences and len(picked) < PER_CLASS:
                    picked.append((f, sentences.pop()))
        for f, sentence in picked:
            seen.add(sentence)
            data.text.append(sentence)
            data.label.append(label)
            data.group.append(str(f.relative_to(stdlib)))
    if len(set(data.label)) < 2:
        raise EvaluationError("task 'python-packages': this Python install ships too few "
                              "standard-library sources (stripped of .py files?)")
    return data


@pretextual.hookimpl
def pretextual_register_tasks(register):
    register(TaskSpec("python-packages", python_packages,
                      "which standard-library package a docstring sentence comes from "
                      "(8 classes, grouped by source file; ships with Python)"))
