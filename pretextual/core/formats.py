"""Corpus files that are not plain UTF-8 text: compressed text and JSON lines (gzip,
bzip2, xz, zstd), Parquet and Arrow files, and the folders Hugging Face datasets'
``save_to_disk`` writes. A file is told by its first bytes, whatever its name.

Everything is streamed: a compressed file is decompressed as it is read (never to
disk), a Parquet file is read one row group at a time and an Arrow file one record
batch at a time, so memory holds a batch of documents, never the file. Parquet and
Arrow need pyarrow (the ``arrow`` extra), zstd needs zstandard (the ``zstd`` extra).
"""

from __future__ import annotations

import bz2
import gzip
import io
import json
import lzma
import re
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from pretextual.errors import DataError


@dataclass(frozen=True)
class Format:
    """A kind of corpus file: what it is called, and the extra that reads it ('' for none)."""

    name: str
    what: str
    extra: str = ""


TEXT = Format("text", "UTF-8 text")
GZIP = Format("gzip", "a gzip-compressed file")
BZIP2 = Format("bzip2", "a bzip2-compressed file")
XZ = Format("xz", "an xz-compressed file")
ZSTD = Format("zstd", "a zstd-compressed file", "zstd")
PARQUET = Format("parquet", "a Parquet file", "arrow")
ARROW_FILE = Format("arrow-file", "an Arrow file", "arrow")
ARROW_STREAM = Format("arrow-stream", "an Arrow stream (a Hugging Face datasets file)", "arrow")
ZIP = Format("zip", "a zip archive")

_MAGIC = (
    (re.compile(rb"PAR1"), PARQUET),
    (re.compile(rb"ARROW1"), ARROW_FILE),
    (re.compile(rb"\xff\xff\xff\xff"), ARROW_STREAM),  # the IPC stream's continuation marker
    (re.compile(rb"\x1f\x8b"), GZIP),
    (re.compile(rb"BZh[1-9]1AY&SY"), BZIP2),
    (re.compile(rb"\xfd7zXZ\x00"), XZ),
    (re.compile(rb"\x28\xb5\x2f\xfd"), ZSTD),
    (re.compile(rb"PK\x03\x04"), ZIP),
)
COMPRESSED = (GZIP, BZIP2, XZ, ZSTD)
TABLES = (PARQUET, ARROW_FILE, ARROW_STREAM)
COMPRESSED_SUFFIXES = (".gz", ".bz2", ".xz", ".zst")
TABLE_SUFFIXES = (".parquet", ".arrow")
TABLE_BATCH_ROWS = 1024
"""Rows read at a time from a Parquet or Arrow file."""


def file_format(path: Path) -> Format:
    """The format of a corpus file by its first bytes (TEXT for anything else; reading
    it then says whether it is text)."""
    try:
        with open(path, "rb") as f:
            head = f.read(16)
    except OSError:
        return TEXT  # reading it says why
    return next((fmt for magic, fmt in _MAGIC if magic.match(head)), TEXT)


def read_in_directory(path: Path, text_suffixes: tuple[str, ...]) -> bool:
    """Whether a corpus directory's file is read: text and JSON lines (compressed or not),
    Parquet and Arrow files, by suffix (corpus.txt.gz, part-0.parquet)."""
    suffix = path.suffix
    if suffix in COMPRESSED_SUFFIXES:
        inner = Path(path.stem).suffix
        return inner in text_suffixes or inner == ""
    return suffix in text_suffixes or suffix in TABLE_SUFFIXES


def is_jsonl(path: Path) -> bool:
    """A .jsonl file, or a compressed one (corpus.jsonl.gz)."""
    if path.suffix in COMPRESSED_SUFFIXES:
        return Path(path.stem).suffix == ".jsonl"
    return path.suffix == ".jsonl"


def _missing_extra(path: Path, fmt: Format, module: str) -> DataError:
    return DataError(f"{path}: {fmt.what}: reading it needs {module}: "
                     f"pip install 'pretextual[{fmt.extra}]'")


def open_decompressed(path: Path, fmt: Format):
    """A binary file object that decompresses ``path`` as it is read."""
    if fmt is GZIP:
        return gzip.open(path, "rb")
    if fmt is BZIP2:
        return bz2.open(path, "rb")
    if fmt is XZ:
        return lzma.open(path, "rb")
    try:
        import zstandard
    except ImportError:
        raise _missing_extra(path, fmt, "zstandard") from None
    # buffered: the reader has read() and readinto() but no readline()
    return io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(
        open(path, "rb"), closefd=True, read_across_frames=True))


def corrupt_errors() -> tuple[type[BaseException], ...]:
    """What a decompressor or pyarrow raises on a damaged file (bzip2 and pyarrow raise a
    plain OSError: the file has been opened by then, so that is its content)."""
    errors: list[type[BaseException]] = [EOFError, OSError, zlib.error, lzma.LZMAError]
    try:
        import zstandard
        errors.append(zstandard.ZstdError)
    except ImportError:
        pass
    try:
        import pyarrow
        errors.append(pyarrow.ArrowException)
    except ImportError:
        pass
    return tuple(errors)


def table_texts(path: Path, fmt: Format, text_field: str) -> Iterator[tuple[int, str | None]]:
    """(row, text) of each row of a Parquet or Arrow file's ``text_field`` column, a
    record batch at a time; DataError naming the file for a missing or non-string column."""
    try:
        import pyarrow as pa
        import pyarrow.ipc
        import pyarrow.parquet
    except ImportError:
        raise _missing_extra(path, fmt, "pyarrow") from None
    if fmt is PARQUET:
        reader = pyarrow.parquet.ParquetFile(path)
        schema = reader.schema_arrow
    else:
        source = pa.memory_map(str(path))  # mapped: pages are read as batches are, then dropped
        reader = (pyarrow.ipc.open_file(source) if fmt is ARROW_FILE
                  else pyarrow.ipc.open_stream(source))
        schema = reader.schema
    if text_field not in schema.names:
        shown = ", ".join(schema.names[:6]) + (", ..." if len(schema.names) > 6 else "")
        raise DataError(f"{path}: no {text_field!r} column (columns: {shown}); set data.text_field")
    kind = schema.field(text_field).type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)
            or pa.types.is_string_view(kind)):
        raise DataError(f"{path}: column {text_field!r} is {kind}, not a string; "
                        f"set data.text_field")
    if fmt is PARQUET:
        batches = reader.iter_batches(batch_size=TABLE_BATCH_ROWS, columns=[text_field])
    elif fmt is ARROW_FILE:
        batches = (reader.get_batch(i) for i in range(reader.num_record_batches))
    else:
        batches = iter(reader)
    row = 0
    for batch in batches:
        for text in batch.column(batch.schema.get_field_index(text_field)).to_pylist():
            yield row, text
            row += 1


def datasets_files(folder: Path, log: Callable[[str], None]) -> list[Path] | None:
    """The Arrow files of a folder datasets' ``save_to_disk`` wrote, in order (None for any
    other folder). Of a DatasetDict, the train split (the others said in a note), or every
    split when there is no train split."""
    if (folder / "dataset_dict.json").is_file():
        try:
            splits = json.loads((folder / "dataset_dict.json").read_text())["splits"]
        except (OSError, ValueError, KeyError, TypeError):
            raise DataError(f"{folder / 'dataset_dict.json'}: not a datasets split list") from None
        chosen = ["train"] if "train" in splits else list(splits)
        others = [s for s in splits if s not in chosen]
        if others:
            log(f"note: data.corpus: {folder}: reading its train split, not "
                f"{', '.join(others)} (point data.corpus at {folder / others[0]} for that one)")
        return [file for split in chosen for file in _split_files(folder / split)]
    if (folder / "state.json").is_file() and (folder / "dataset_info.json").is_file():
        return _split_files(folder)
    return None


def _split_files(folder: Path) -> list[Path]:
    state = folder / "state.json"
    try:
        names = [entry["filename"] for entry in json.loads(state.read_text())["_data_files"]]
    except (OSError, ValueError, KeyError, TypeError):
        raise DataError(f"{state}: not a datasets state file (no _data_files list)") from None
    missing = [n for n in names if not (folder / n).is_file()]
    if missing:
        raise DataError(f"{folder}: state.json lists {missing[0]}, which is missing")
    return [folder / n for n in names]
