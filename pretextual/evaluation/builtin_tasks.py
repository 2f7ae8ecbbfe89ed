"""Built-in downstream tasks, registered through the same hook a third-party plugin uses.

``python-packages``: which standard-library package a docstring sentence comes from
(asyncio, email, importlib, logging, tkinter, unittest, urllib/http or xml), grouped by
source file. It is made from text that ships with every Python, and from files the
embedded pretraining corpus does not read (that corpus takes the top-level modules
only), less any sentence that corpus holds all the same, so the main job can show
downstream quality on held-out text with nothing downloaded.

``word-order``: whether one of those sentences is as written or has had adjacent words
swapped, an acceptability judgement in the manner of GLUE's CoLA. Each swapped sentence keeps
its words, so a bag of words cannot tell the classes apart: what separates them is the word
order a pretrained encoder has learned.
"""

from __future__ import annotations

import ast
import functools
import random
import sysconfig
from pathlib import Path

import pretextual
from pretextual.core.corpus import embedded_corpus, prose_blocks, split_sentences
from pretextual.errors import EvaluationError
from pretextual.plugins.api import TaskData, TaskSpec

PACKAGES = {"asyncio": ("asyncio",), "email": ("email",), "importlib": ("importlib",),
            "logging": ("logging",), "tkinter": ("tkinter",), "unittest": ("unittest",),
            "web": ("urllib", "http"), "xml": ("xml",)}
"""Label -> the stdlib packages its sentences come from (present in Python 3.10 to 3.13)."""
PER_CLASS = 250
"""Sentences per label at most, drawn evenly over its files (balanced classes)."""
MIN_WORDS = 5
SWAPS = 2
"""Pairs of adjacent words a swapped sentence of word-order has exchanged, at most."""


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


@functools.lru_cache(maxsize=1)
def _pretraining_sentences() -> frozenset[str]:
    # Files the embedded corpus skips still share docstrings with the ones it reads
    # (asyncio.Queue with queue.Queue): those sentences are left out of the tasks too.
    return frozenset(s for document in embedded_corpus() for s in document.sentences)


def python_packages() -> TaskData:
    """The python-packages task: the same examples on every install of one Python version."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    data = TaskData(text=[], label=[], group=[])
    seen = set(_pretraining_sentences())
    rng = random.Random(0)
    for label, packages in PACKAGES.items():
        files = sorted(p for package in packages for p in (stdlib / package).rglob("*.py")
                       if "test" not in p.relative_to(stdlib).parts[1:] and "tests" not in p.parts)
        by_file = [(f, [s for s in _sentences(f) if s not in seen]) for f in files]
        by_file = [(f, s) for f, s in by_file if s]
        for f, sentences in by_file:
            rng.shuffle(sentences)
        # Round-robin over files, so one large module does not make the whole class; a
        # sentence two files share is taken once, so it cannot sit on both sides of a fold.
        picked = []
        while len(picked) < PER_CLASS and any(s for _, s in by_file):
            for f, sentences in by_file:
                while sentences and sentences[-1] in seen:
                    sentences.pop()
                if sentences and len(picked) < PER_CLASS:
                    picked.append((f, sentences.pop()))
                    seen.add(picked[-1][1])
        for f, sentence in picked:
            data.text.append(sentence)
            data.label.append(label)
            data.group.append(str(f.relative_to(stdlib)))
    if len(set(data.label)) < 2:
        raise EvaluationError("task 'python-packages': this Python install ships too few "
                              "standard-library sources (stripped of .py files?)")
    return data


def _swap_adjacent(words: list[str], rng: random.Random) -> list[str] | None:
    """``words`` with up to :data:`SWAPS` non-overlapping pairs of adjacent, different words
    exchanged, the first and last word left in place (a capital and a full stop would
    otherwise give the swap away); None when no pair can be swapped."""
    pairs = [i for i in range(1, len(words) - 2) if words[i] != words[i + 1]]
    rng.shuffle(pairs)
    taken: list[int] = []
    for i in pairs:
        if len(taken) < SWAPS and all(abs(i - j) > 1 for j in taken):
            taken.append(i)
    if not taken:
        return None
    words = list(words)
    for i in taken:
        words[i], words[i + 1] = words[i + 1], words[i]
    return words


def word_order() -> TaskData:
    """The word-order task: python-packages' sentences, half of them (a seeded draw) with
    adjacent words swapped, labelled ``original`` or ``swapped``, grouped by source file (a
    drawn sentence with no two different words to swap stays ``original``)."""
    source = python_packages()
    rng = random.Random(0)
    chosen = set(rng.sample(range(len(source.text)), len(source.text) // 2))
    data = TaskData(text=[], label=[], group=list(source.group))
    for i, sentence in enumerate(source.text):
        swapped = _swap_adjacent(sentence.split(), rng) if i in chosen else None
        data.text.append(sentence if swapped is None else " ".join(swapped))
        data.label.append("original" if swapped is None else "swapped")
    return data


@pretextual.hookimpl
def pretextual_register_tasks(register):
    register(TaskSpec("python-packages", python_packages,
                      "which standard-library package a docstring sentence comes from "
                      "(8 classes, grouped by source file; ships with Python)"))
    register(TaskSpec("word-order", word_order,
                      "whether a python-packages sentence is as written or has adjacent words "
                      "swapped (2 classes, grouped by source file; ships with Python)"))
