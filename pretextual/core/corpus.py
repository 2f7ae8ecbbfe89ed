"""Reading corpora into documents: lists of sentences, kept as documents.

Formats: text files as Google's BERT reads them (one sentence or paragraph per
line, a blank line between documents), ``.jsonl`` with a text field (one
document per line), either compressed (gzip, bzip2, xz, zstd), Parquet and Arrow
files (one document per row of the text column) and datasets' save_to_disk folders
(see formats.py); a directory (its files of those kinds; others are skipped with a
warning) or a glob (every file it matches). ``embedded`` is a corpus made of text
that ships with every Python install, so training works offline.

Files are read a line (or a record batch) at a time (``iter_documents``), whole or,
plain text, in the byte ranges ``document_boundary`` cuts for ``pretextual prepare``'s
workers, so memory holds a document, never a file; ``read_corpus`` collects every
document of a corpus that fits in memory.
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
from typing import Iterator

from pretextual.core import formats
from pretextual.errors import DataError

EMBEDDED = "embedded"
TEXT_SUFFIXES = (".txt", ".text", ".jsonl")
"""The text files of a corpus directory that are read (also compressed, as .txt.gz, next to
.parquet and .arrow files); a file or glob is read whatever its suffix."""
_warned: set = set()  # the skipped-files warnings and notes printed by this process

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


# Bounds that keep reading flat in memory whatever the file: a line is read in pieces
# of at most LINE_PIECE_BYTES (cut at whitespace), and a document is cut once it holds
# MAX_DOCUMENT_BYTES of text (BookCorpus-sized books stay whole; a 100 MB line does not).
LINE_PIECE_BYTES = 1 << 20
MAX_DOCUMENT_BYTES = 4 << 20
# How far past a split point prepare looks for a blank line to split a file at.
BOUNDARY_SEARCH_BYTES = 4 << 20
_WHITESPACE = b" \t\r\f\v\n"
_BLANK_LINE = re.compile(rb"\n[ \t\r\f\v]*\n")


def _open(path: Path):
    try:
        return open(path, "rb")
    except PermissionError:
        raise DataError(f"{path}: permission denied") from None
    except IsADirectoryError:
        raise DataError(f"{path}: is a directory") from None
    except OSError as exc:
        raise DataError(f"{path}: cannot read ({exc.strerror})") from None


def _decode(raw: bytes, path: Path, offset: int) -> str:
    """UTF-8 text of the bytes read at ``offset``, without the byte-order mark some
    editors write at the start of a file; binary or mis-encoded bytes are a DataError."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(f"{path}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset "
                        f"{offset + exc.start})") from None
    nul = raw.find(0)
    if nul >= 0:  # valid UTF-8, but text never holds NUL: a binary file or UTF-16 text
        raise DataError(f"{path}: a binary file, not text (NUL byte at offset {offset + nul}; "
                        f"UTF-16 text must be converted to UTF-8)")
    return text[1:] if offset == 0 and text.startswith("\ufeff") else text


def _complete_utf8(raw: bytes) -> int:
    """Length of ``raw`` without a trailing, incomplete UTF-8 character."""
    lead = len(raw) - 1
    while lead > 0 and len(raw) - lead < 4 and raw[lead] & 0xC0 == 0x80:
        lead -= 1
    byte = raw[lead]
    size = 4 if byte >= 0xF0 else 3 if byte >= 0xE0 else 2 if byte >= 0xC0 else 1
    return lead if lead + size > len(raw) else len(raw)


def _cut_piece(raw: bytes) -> bytes:
    """A piece of an over-long line, cut after its last whitespace (or at a character boundary)."""
    cut = max(raw.rfind(byte) for byte in _WHITESPACE)
    return raw[:cut + 1] if cut > 0 else raw[:_complete_utf8(raw) or len(raw)]


def _text_pieces(f, path: Path, start: int, end: int | None) -> Iterator[str]:
    """Each line between byte offsets ``start`` and ``end``, a line longer than
    LINE_PIECE_BYTES in several pieces, so no line is ever held whole. The bytes after a
    piece's cut start the next piece: never a seek back, which a decompressing stream
    cannot make (or makes by decompressing again from the start)."""
    pos, carry = start, b""
    if start:
        f.seek(start)
    while end is None or pos < end:
        limit = LINE_PIECE_BYTES if end is None else min(LINE_PIECE_BYTES, end - pos)
        raw = carry + f.readline(limit - len(carry))
        if not raw:
            return
        carry = b""
        if len(raw) == LINE_PIECE_BYTES and not raw.endswith(b"\n"):
            piece = _cut_piece(raw)
            raw, carry = piece, raw[len(piece):]
        yield _decode(raw, path, pos)
        pos += len(raw)


def _text_documents(f, path: Path, start: int, end: int | None) -> Iterator[Document]:
    sentences: list[str] = []
    size = 0
    for piece in _text_pieces(f, path, start, end):
        for line in piece.splitlines() or [""]:
            if line.strip():
                sentences.extend(split_sentences(" ".join(line.split())))
                size += len(line)
                if size < MAX_DOCUMENT_BYTES:
                    continue
            if sentences:  # a blank line, or a document grown past MAX_DOCUMENT_BYTES
                yield Document(sentences, str(path))
            sentences, size = [], 0
    if sentences:
        yield Document(sentences, str(path))


def _line_number(path: Path, offset: int) -> int:
    """1-based number of the line holding byte ``offset`` (read only when a message needs it)."""
    count = 1
    with open(path, "rb") as f:
        while offset > 0:
            block = f.read(min(offset, 1 << 20))
            if not block:
                break
            count += block.count(b"\n")
            offset -= len(block)
    return count


def _jsonl_documents(f, path: Path, text_field: str, start: int, end: int | None
                     ) -> Iterator[Document]:
    """One document per JSON line (a record is parsed whole, so a line is read whole)."""
    pos, lines = start, 0
    if start:
        f.seek(start)
    while end is None or pos < end:
        raw = f.readline()
        if not raw:
            return
        line = _decode(raw, path, pos)
        offset, pos, lines = pos, pos + len(raw), lines + 1
        if not line.strip():
            continue
        try:
            text = json.loads(line)[text_field]
        except json.JSONDecodeError as exc:
            raise DataError(f"{path}:{_line_at(path, start, lines)}: not valid JSON ({exc.msg})") from None
        except (KeyError, TypeError):
            raise DataError(f"{path}:{_line_at(path, start, lines)}: no {text_field!r} field "
                            f"(set data.text_field)") from None
        document = _record_document(text, text_field, f"{path}@{offset}")
        if isinstance(document, str):
            raise DataError(f"{path}:{_line_at(path, start, lines)}: {document}")
        if document is not None:
            yield document


def _line_at(path: Path, start: int, lines: int) -> int:
    """The number of the ``lines``-th line read from byte ``start`` (counted only when a
    message needs it; a compressed file is always read from its start)."""
    return lines if start == 0 else _line_number(path, start) - 1 + lines


def _record_document(text, text_field: str, source: str) -> Document | str | None:
    """The document of one record's text (a JSON line's field, a table's cell): None for
    no text, a message for a value that is not a string."""
    if text is None:  # a record without text, like an empty one
        return None
    if not isinstance(text, str):
        return f"field {text_field!r} is {type(text).__name__}, not a string (set data.text_field)"
    sentences = [s for p in text.splitlines() if p.strip()
                 for s in split_sentences(" ".join(p.split()))]
    return Document(sentences, source) if sentences else None


def documents_of(items, text_field: str = "text") -> list[Document]:
    """Documents from Python objects (pretextual.train's documents): a Hugging Face
    datasets.Dataset (its ``text_field`` column), or an iterable of strings or of dicts
    holding ``text_field``; each item one document. DataError for an item of another kind."""
    if hasattr(items, "column_names"):  # a datasets.Dataset: read the one column
        if text_field not in items.column_names:
            raise DataError(f"documents: the dataset has no {text_field!r} column (columns: "
                            f"{', '.join(items.column_names)}); set data.text_field")
        items = items[text_field] if len(items) < 1 << 16 else (row[text_field] for row in items)
    documents = []
    for i, item in enumerate(items):
        if isinstance(item, dict):
            if text_field not in item:
                raise DataError(f"documents[{i}]: no {text_field!r} key (set data.text_field)")
            text = item[text_field]
        elif isinstance(item, str):
            text = item
        else:
            raise DataError(f"documents[{i}]: {type(item).__name__}, not a string or a dict "
                            f"holding {text_field!r}")
        document = _record_document(text, text_field, f"documents[{i}]")
        if isinstance(document, str):
            raise DataError(f"documents[{i}]: {document}")
        if document is not None:
            documents.append(document)
    if not documents:
        raise DataError("documents: holds no text")
    return documents


def _table_documents(path: Path, fmt: formats.Format, text_field: str) -> Iterator[Document]:
    """One document per row of a Parquet or Arrow file's text column."""
    for row, text in formats.table_texts(path, fmt, text_field):
        document = _record_document(text, text_field, f"{path}@row{row}")
        if document is not None:
            yield document


def iter_documents(path: str | Path, text_field: str = "text", start: int = 0,
                   end: int | None = None) -> Iterator[Document]:
    """The documents of one corpus file, or of its bytes ``[start, end)`` (a range that
    ``document_boundary`` chose), read a line at a time: memory holds one document,
    never the file. A text document ends at a blank line or once it reaches
    MAX_DOCUMENT_BYTES; a ``.jsonl`` line is one document."""
    path = Path(path)
    _open(path).close()  # permission denied, a directory: said before the format is told
    fmt = formats.file_format(path)
    if fmt is formats.TEXT:
        with _open(path) as f:
            if path.suffix == ".jsonl":
                yield from _jsonl_documents(f, path, text_field, start, end)
            else:
                yield from _text_documents(f, path, start, end)
        return
    if fmt is formats.ZIP:
        raise DataError(f"{path}: a zip archive, which is not read: extract it first "
                        f"(unzip {path})")
    if start != 0:  # prepare plans these whole (formats.splittable)
        raise ValueError(f"{path}: {fmt.what} is read whole, not from byte {start}")
    try:
        if fmt in formats.TABLES:
            yield from _table_documents(path, fmt, text_field)
            return
        with formats.open_decompressed(path, fmt) as f:
            if formats.is_jsonl(path):
                yield from _jsonl_documents(f, path, text_field, 0, None)
            else:
                yield from _text_documents(f, path, 0, None)
    except formats.corrupt_errors() as exc:
        reason = " ".join(str(exc).split())  # pyarrow's messages end in a newline
        raise DataError(f"{path}: {fmt.what} that is damaged or cut short "
                        f"({type(exc).__name__}: {reason})") from None


def document_boundary(path: str | Path, offset: int) -> int:
    """A byte offset at or after ``offset`` where a range of the file may begin: just
    after a blank line (after a newline in ``.jsonl``) when one comes within
    BOUNDARY_SEARCH_BYTES, else after a newline or whitespace (cutting a document
    that is longer than that anyway); the file size when the file ends first."""
    path = Path(path)
    with _open(path) as f:
        f.seek(offset)
        if path.suffix == ".jsonl":  # a record cannot be split: search as far as it takes
            pos = offset
            while block := f.read(1 << 20):
                newline = block.find(b"\n")
                if newline >= 0:
                    return pos + newline + 1
                pos += len(block)
            return pos
        window = f.read(BOUNDARY_SEARCH_BYTES)
    if len(window) < BOUNDARY_SEARCH_BYTES:
        found = _BLANK_LINE.search(window)
        return offset + (found.end() if found else len(window))
    found = _BLANK_LINE.search(window)
    if found:
        return offset + found.end()
    for byte in _WHITESPACE[::-1]:  # a newline first, then other whitespace
        at = window.find(byte)
        if at >= 0:
            return offset + at + 1
    return offset + (_complete_utf8(window) or len(window))


def corpus_files(spec: str) -> list[Path]:
    """The files a corpus spec names: a file, a directory's text, JSON-lines (compressed or
    not), Parquet and Arrow files (recursively, following links), the Arrow files of a
    folder datasets' save_to_disk wrote, or every file a glob matches; each real file once.

    A directory's other files are skipped with a warning on stderr that counts and names
    them, and a directory with none to read is an error; an unreadable directory inside a
    corpus directory is an error, not skipped."""
    path = Path(spec).expanduser()
    if path.is_dir():
        saved = formats.datasets_files(path, _note_once)
        if saved is not None:
            return saved
        found = _once(sorted(_walk(path)))
        files = [p for p in found if formats.read_in_directory(p, TEXT_SUFFIXES)]
        skipped = _skipped_note(path, [p for p in found if p not in files])
        kind = "text, .jsonl, Parquet or Arrow file"
        if not files:
            raise DataError(f"data.corpus: {spec} holds no {kind}{skipped}")
        if skipped and (path, skipped) not in _warned:  # once, though a command lists a corpus often
            _warned.add((path, skipped))
            print(f"pretextual: warning: data.corpus: {spec}: read {_count(files, 'file')}{skipped}",
                  file=sys.stderr)
        return files
    if path.is_file():
        return [path]
    if path.exists():  # a FIFO or device would block the read forever
        raise DataError(f"data.corpus: {spec} is not a regular file or a directory")
    if any(ch in spec for ch in "*?["):
        files = _once(sorted(Path(p) for p in glob.glob(os.path.expanduser(spec), recursive=True)
                             if Path(p).is_file()))
        if files:
            return files
        raise DataError(f"data.corpus: the pattern {spec} matches no file")
    raise DataError(f"data.corpus: no such file or directory: {spec}")


def _note_once(line: str) -> None:
    """A note on stderr, once per process (a command lists a corpus more than once)."""
    if line not in _warned:
        _warned.add(line)
        print(f"pretextual: {line}", file=sys.stderr)


def _once(files: list[Path]) -> list[Path]:
    """``files`` with each real file once (links to one file are one file), in order."""
    seen, unique = set(), []
    for file in files:
        stat = file.stat()
        if (stat.st_dev, stat.st_ino) not in seen:
            seen.add((stat.st_dev, stat.st_ino))
            unique.append(file)
    return unique


def _count(items: list, noun: str) -> str:
    return f"{len(items)} {noun}{'s' if len(items) != 1 else ''}"


def _skipped_note(directory: Path, skipped: list[Path]) -> str:
    """What is said of the files a corpus directory holds that are not read
    (WikiExtractor's wiki_00, a README.md): how many, which, and how to read them."""
    if not skipped:
        return ""
    names = ", ".join([str(p.relative_to(directory)) for p in skipped[:3]]
                      + (["..."] if len(skipped) > 3 else []))
    return (f"; skipped {_count(skipped, 'other file')} ({names}); a glob such as "
            f"'{directory / '**'}' reads every file it matches, whatever its suffix")


def _walk(directory: Path) -> Iterator[Path]:
    """Every regular file under ``directory``, following links; a link back to a
    directory already read (a loop) is skipped with a warning."""
    def fail(exc: OSError):
        reason = "permission denied" if isinstance(exc, PermissionError) else exc.strerror
        raise DataError(f"data.corpus: cannot list {exc.filename}: {reason}")

    def identity(path: Path) -> tuple[int, int]:
        stat = path.stat()
        return stat.st_dev, stat.st_ino

    seen_dirs, loops = {identity(directory)}, []
    for root, dirs, names in os.walk(directory, onerror=fail, followlinks=True):
        kept = []
        for name in dirs:
            key = identity(Path(root) / name)
            if key in seen_dirs:
                loops.append(Path(root) / name)
            else:
                seen_dirs.add(key)
                kept.append(name)
        dirs[:] = kept  # os.walk descends only into these
        for name in names:
            file = Path(root) / name
            if file.is_file():
                yield file
    if loops and (directory, "loops") not in _warned:
        _warned.add((directory, "loops"))
        shown = ", ".join(str(p.relative_to(directory)) for p in loops[:3])
        print(f"pretextual: warning: data.corpus: {directory}: skipped {_count(loops, 'link')} "
              f"to a directory already read ({shown}); each file is read once", file=sys.stderr)


def read_corpus(spec: str, text_field: str = "text") -> list[Document]:
    """Read every document of a corpus spec (see the module docstring)."""
    if spec == EMBEDDED:
        return embedded_corpus()
    docs = [d for path in corpus_files(spec) for d in iter_documents(path, text_field)]
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


def prose_blocks(text: str) -> list[str]:
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
        sentences = [s for b in prose_blocks(topics[name]) for s in split_sentences(b)]
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
                    paragraphs.extend(prose_blocks(doc))
        sentences = [s for p in paragraphs for s in split_sentences(p)]
        if len(sentences) >= 2:
            docs.append(Document(sentences, str(path)))
    if not docs:
        raise DataError("data.corpus: the embedded corpus is empty on this Python install; "
                        "set data.corpus to a file")
    return docs
