"""Content hashes of annotation files and tables, and cheap fingerprints of image trees (data
versions)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq


def file_sha256(path: Path) -> str:
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def entries_fingerprint(entries: Mapping[str, tuple[int, int]]) -> str:
    """Hash of (relative name, size, mtime) of every image: a changed or added image shows.

    Reading pixels would cost hours on 270K images; size + mtime change whenever a file is
    re-downloaded or replaced, which is what a rebuild must notice.
    """
    digest = hashlib.sha256()
    for name in sorted(entries):
        size, mtime_ns = entries[name]
        digest.update(f"{name}\t{size}\t{mtime_ns}".encode())
        digest.update(b"\n")
    return f"{len(entries)}:{digest.hexdigest()}"


def combined_version(parts: Iterable[str]) -> str:
    """One short version string for several fingerprints."""
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part.encode())
        digest.update(b"\0")
    return digest.hexdigest()[:24]


def table_fingerprint(table: pd.DataFrame) -> str:
    """The content of a table given to a stage (columns and values, not its index), as
    arrow_fingerprint hashes it: list columns (arrays after a Parquet read) hash as values."""
    return arrow_fingerprint(pa.Table.from_pandas(table, preserve_index=False))


def arrow_fingerprint(table: pa.Table) -> str:
    """An Arrow table's schema and values, hashed as plain Parquet (no compression,
    dictionaries or statistics: as fast as Arrow's stream format). Unlike that format it
    holds nothing a null hides, so a table and the same table read back from its file (other
    chunks, zeros under its nulls) hash the same."""
    sink = pa.BufferOutputStream()
    pq.write_table(
        table.combine_chunks(),
        sink,
        compression="NONE",
        use_dictionary=False,
        write_statistics=False,
    )
    return hashlib.sha256(sink.getvalue()).hexdigest()
