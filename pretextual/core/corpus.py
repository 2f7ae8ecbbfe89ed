"""Reading corpora into documents: lists of sentences, kept as documents.

Formats: text files as Google's BERT reads them (one sentence or paragraph per
line, a blank line between documents), ``.jsonl`` with a text field (one
document per line), or a directory or glob of these. ``embedded`` is a corpus
made of text that ships with every Python install, so training works offline.
"""

from __future__ import annotations

import ast
import glob
import hashlib
import json
import os
import re
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from pretextual.errors import DataError

EMBEDDED = "embedded"
TEXT_SUFFIXES = (".txt", ".text", ".jsonl")

# A sentence ends at . ! or ? (with closing quotes/brackets), followed by
# whitespace and an upper-case letter, a digit or an opening quote.
_BOUNDARY = re.compile(r"(?<=[.!?])[\"')\]]*\s+(?=[\"'(\[]?[A-Z0-9])")
_ABBREVIATIONS = frozenset(
    "e.g i.e etc vs cf mr mrs ms dr prof st no fig eq al approx ca jr sr inc ltd co".split())


def split_sentences(paragraph: str) -> list[str]:
    """Split a paragraph into sentences with a small rule-based splitter.

    Boundaries are sentence punctuation followed by a capitalised word; a
    boundary is ignored after a known abbreviation ("e.g.", "Dr.") or a single
    initial ("J. Smith"). No model, no download.
    """
    sentences, start = [], 0
    for match in _BOUNDARY.finditer(paragraph):
        before = paragraph[start:match.start()].rstrip(".!?\"')]").split()
        last = before[-1].lower() if before else ""
        if last in _ABBREVIATIONS or (len(last) == 1 and last.isalpha()):
            continue
        sentences.append(paragraph[start:match.start()].strip())
        start = match.end()
    sentences.append(paragraph[start:].strip())
    return [s for s in sentences if s]


@dataclass
class Document:
    """One document: its sentences in order, and where it came from (for messages)."""

    sentences: list[str]
    source: str


def _paragraphs_to_sentences(lines: list[str]) -> list[str]:
    return [s for line in lines for s in split_sentences(" ".join(line.split()))]


def _read_text(path: Path) -> str:
    try:
        data = path.read_bytes()
    except PermissionError:
        raise DataError(f"{path}: permission denied") from None
    except IsADirectoryError:
        raise DataError(f"{path}: is a directory") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(f"{path}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset "
                        f"{exc.start})") from None


def _read_txt(path: Path) -> list[Document]:
    docs, lines = [], []
    for line in _read_text(path).splitlines() + [""]:
        if line.strip():
            lines.append(line)
        elif lines:
            docs.append(Document(_paragraphs_to_sentences(lines), str(path)))
            lines = []
    return docs


def _read_jsonl(path: Path, text_field: str) -> list[Document]:
    docs = []
    for number, line in enumerate(_read_text(path).splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            text = record[text_field]
        except json.JSONDecodeError as exc:
            raise DataError(f"{path}:{number}: not valid JSON ({exc.msg})") from None
        except (KeyError, TypeError):
            raise DataError(f"{path}:{number}: no {text_field!r} field (set data.text_field)") from None
        paragraphs = [p for p in str(text).splitlines() if p.strip()]
        if paragraphs:
            docs.append(Document(_paragraphs_to_sentences(paragraphs), f"{path}:{number}"))
    return docs


def corpus_files(spec: str) -> list[Path]:
    """The files a corpus spec names: a file, a directory (recursively) or a glob."""
    path = Path(spec).expanduser()
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in TEXT_SUFFIXES)
        if not files:
            raise DataError(f"data.corpus: {spec} holds no {'/'.join(TEXT_SUFFIXES)} files")
        return files
    if path.exists():
        return [path]
    if any(ch in spec for ch in "*?["):
        files = sorted(Path(p) for p in glob.glob(os.path.expanduser(spec), recursive=True)
                       if Path(p).is_file())
        if files:
            return files
        raise DataError(f"data.corpus: the pattern {spec} matches no file")
    raise DataError(f"data.corpus: no such file or directory: {spec}")


def read_corpus(spec: str, text_field: str = "text") -> list[Document]:
    """Read every document of a corpus spec (see the module docstring)."""
    if spec == EMBEDDED:
        return embedded_corpus()
    docs: list[Document] = []
    for path in corpus_files(spec):
        if path.suffix == ".jsonl":
            docs.extend(_read_jsonl(path, text_field))
        else:
            docs.extend(_read_txt(path))
    docs = [d for d in docs if d.sentences]
    if not docs:
        raise DataError(f"data.corpus: {spec} holds no text")
    return docs


def corpus_fingerprint(spec: str) -> str:
    """A key that changes when the corpus changes (path, size, mtime of each file)."""
    h = hashlib.sha256()
    if spec == EMBEDDED:
        h.update(f"embedded:{sys.version}".encode())
    else:
        for path in corpus_files(spec):
            stat = path.stat()
            h.update(f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}\n".encode())
    return h.hexdigest()[:16]


def _prose(block: str) -> bool:
    letters = sum(ch.isalpha() or ch.isspace() for ch in block)
    return len(block) > 20 and letters / len(block) > 0.85


def _blocks(text: str) -> list[str]:
    """Paragraphs of a docstring-like text (blank-line separated), prose only."""
    blocks = [" ".join(b.split()) for b in re.split(r"\n\s*\n", text)]
    return [b for b in blocks if _prose(b)]


def embedded_corpus() -> list[Document]:
    """Documents from text that ships with Python: the pydoc help topics and
    the docstrings of the standard library's top-level modules (read with ast,
    never imported). The same on every install of one Python version."""
    docs = []
    try:
        from pydoc_data.topics import topics
    except ImportError:  # some distributions strip pydoc_data
        topics = {}
    for name in sorted(topics):
        sentences = [s for b in _blocks(topics[name]) for s in split_sentences(b)]
        if sentences:
            docs.append(Document(sentences, f"pydoc topic {name}"))
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(stdlib.glob("*.py")):
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, OSError):
            continue
        paragraphs = []
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc:
                    paragraphs.extend(_blocks(doc))
        sentences = [s for p in paragraphs for s in split_sentences(p)]
        if len(sentences) >= 2:
            docs.append(Document(sentences, str(path)))
    if not docs:
        raise DataError("data.corpus: the embedded corpus is empty on this Python install; "
                        "set data.corpus to a file")
    return docs
