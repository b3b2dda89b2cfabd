"""What each row of a local packed array took from its output PNGs' headers, with the files'
states at that moment, so that an unchanged re-run compares a `stat` per file instead of
reading every header (as git's index trusts a file whose size and times are unchanged).

A cold header read is a random disk read per image; a `stat` of files written one after the
other in a shard folder costs a hundredth of it (benchmarks/README.md). The cache is only
ever a shortcut: a missing, unreadable or foreign record sends the row back to its header.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from radharmony_pipeline.processing.storage.output_layout import packed_headers
from radharmony_pipeline.processing.storage.store import open_for_reading, publish

# The record's own columns; the rest are the header values, one column each.
_OWN_COLUMNS = ("image_path", "input_key", "image_state", "mask_state")


def output_state(path: str | Path) -> str:
    """A local file's size, modification time (ns) and inode: a file published anew (a
    rename) or written over gets another state."""
    found = os.stat(path)
    return f"{found.st_size}:{found.st_mtime_ns}:{found.st_ino}"


@dataclass(frozen=True)
class HeaderRecord:
    """One packed row's outputs as last read or written: the image PNG's path relative to
    the output root, the input key its header (and its mask's) carried, the states of the
    image and mask files, and the row's values read from the header."""

    image_path: str
    input_key: str
    image_state: str
    mask_state: str | None
    values: Mapping[str, Any]

    def holds(self, image_path: str, input_key: str, states: tuple[str, str | None]) -> bool:
        """Whether the record still describes these outputs: the same image and key, and
        files in the same states (image, mask)."""
        # Spelled out, not _own_values: this runs once per image of every re-run.
        own = (self.image_path, self.input_key, self.image_state, self.mask_state)
        return own == (image_path, input_key, *states)


def _own_values(record: HeaderRecord | None) -> tuple[Any, ...]:
    """The record's own columns, in _OWN_COLUMNS order (all None for no record)."""
    return tuple(None if record is None else getattr(record, name) for name in _OWN_COLUMNS)


def read_header_records(
    packed: Path, rows: int, value_names: Sequence[str]
) -> list[HeaderRecord | None]:
    """The records of the `rows` rows of `packed` with their `value_names`, or none at all
    (each None) when the record is missing, unreadable, of another row count or without one
    of those values (written by another version)."""
    try:
        with open_for_reading(packed_headers(packed)) as handle:
            table = pq.read_table(handle)
        columns = table.to_pydict()
        if table.num_rows != rows or not {*_OWN_COLUMNS, *value_names} <= set(columns):
            return [None] * rows
    except (OSError, ValueError, pa.ArrowException):
        return [None] * rows
    own = zip(*(columns[name] for name in _OWN_COLUMNS), strict=True)
    values = zip(*(columns[name] for name in value_names), strict=True)
    return [
        None
        if row_own[0] is None
        else HeaderRecord(*row_own, values=dict(zip(value_names, row_values, strict=True)))
        for row_own, row_values in zip(own, values, strict=True)
    ]


def write_header_records(
    packed: Path, records: Sequence[HeaderRecord | None], value_names: Sequence[str]
) -> None:
    """Publish the records of every row of `packed` (None: a row with nothing to record)."""
    columns: dict[str, list[Any]] = {name: [] for name in (*_OWN_COLUMNS, *value_names)}
    for record in records:
        for name, value in zip(_OWN_COLUMNS, _own_values(record), strict=True):
            columns[name].append(value)
        for name in value_names:
            columns[name].append(None if record is None else record.values[name])
    table = pa.table(columns)
    publish(packed_headers(packed), lambda handle: pq.write_table(table, handle))
