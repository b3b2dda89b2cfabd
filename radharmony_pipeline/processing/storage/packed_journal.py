"""Rows of a partition's packed array replaced in place under a redo journal, so that a
re-run after a few changed images writes those rows only, never a copy of the whole array,
and no reader ever takes a half-patched array for a finished one.

The protocol, in this order (each step atomic or idempotent):

1. the journal is published beside the array: the rows to replace, their new pixels, and
   every row's input key once patched;
2. the key record (`<name>.keys.json`) is removed: from here on the array is not complete
   (`is_complete` says so, and a rebuild never trusts an array without its record);
3. the rows are written in place and the file is flushed to disk;
4. the key record is published with the journal's keys: the array is complete again;
5. the journal is removed.

A run killed anywhere leaves either no journal (steps 1–2 not done: the array and its record
are the old, consistent ones) or a whole journal, which the next run replays from step 2 on
(`replay_interrupted_patch`): writing the same rows twice gives the same bytes.

The same holds through a power cut: each step is on disk before the next begins. The journal
and the key record are published durably (their bytes synced before the rename, their folder
after it, `packed_rows.publish_durably`), the rows are synced before the key record is
published. The removals need no sync: a key record that comes back beside a journal is
not trusted (`is_complete`, and the replay withdraws it first), and a journal that comes back
after its key record is replayed again, to the same bytes.

Only a local array is patched: an object store has no in-place write, so there the caller
assembles and uploads the whole array instead.
"""

from __future__ import annotations

import io
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from radharmony_pipeline.processing.storage.output_layout import packed_keys
from radharmony_pipeline.processing.storage.packed_rows import (
    PackedArrayError,
    PackedRowWriter,
    publish_durably,
    read_layout,
)
from radharmony_pipeline.processing.storage.store import (
    exists,
    read_bytes,
    remove,
)


def patch_journal(packed: Any) -> Any:
    """The journal of a patch of `packed` in progress (present only while one is)."""
    return packed.with_name(packed.name + ".patch.npz")


@dataclass(frozen=True)
class RowPatch:
    """New pixels for some rows of a packed array, and the record it gets once they are in.

    `rows[i]` receives `pixels[i]`; `keys` holds every row's input key (None: none), as the
    key record stores it."""

    rows: np.ndarray  # int64, ascending
    pixels: np.ndarray  # uint8, len(rows) × S × S
    keys: Sequence[str | None]

    def __post_init__(self) -> None:
        if self.pixels.ndim != 3 or len(self.pixels) != len(self.rows):
            raise ValueError(f"{len(self.rows)} rows but pixels of shape {self.pixels.shape}")


def write_keys(packed: Any, keys: Sequence[str | None]) -> None:
    """Publish the key record of `packed`: one input key per row, the array complete (on a
    local file system on disk on return, see publish_durably)."""
    publish_durably(
        packed_keys(packed), lambda handle: handle.write(json.dumps(list(keys)).encode())
    )


def is_complete(packed: Any) -> bool:
    """Whether `packed` is a finished array: its key record is there and no patch is in
    progress (a reader must not take a half-patched array for a finished one)."""
    return exists(packed_keys(packed)) and not exists(patch_journal(packed))


def patch_rows(packed: Path, patch: RowPatch) -> None:
    """Replace `patch.rows` of the local array `packed` in place under the journal (see the
    module's docstring); on return the array and its key record are complete."""
    journal = patch_journal(packed)
    # On disk before the array is touched: a power cut must not lose it.
    publish_durably(journal, lambda handle: _write_journal(handle, patch))
    _apply(packed, patch)
    remove(journal)


def replay_interrupted_patch(packed: Any) -> int:
    """Finish the patch a killed run left (its journal is there): the rows written again,
    the key record published, the journal removed. The number of rows replayed (0: none).
    A journal whose array is gone or no whole array is dropped: without its key record the
    array is assembled anew anyway."""
    journal = patch_journal(packed)
    try:
        content = read_bytes(journal)
    except FileNotFoundError:
        return 0
    if not _is_whole_array(packed):
        remove(packed_keys(packed))
        remove(journal)
        return 0
    patch = _read_journal(content)
    _apply(packed, patch)
    remove(journal)
    return len(patch.rows)


def _is_whole_array(packed: Any) -> bool:
    """Whether `packed` exists and holds every row its header announces."""
    try:
        read_layout(packed)
    except (FileNotFoundError, PackedArrayError):
        return False
    return True


def _apply(packed: Path, patch: RowPatch) -> None:
    remove(packed_keys(packed))
    with PackedRowWriter(packed) as writer:
        shape = writer.layout.shape
        if (
            writer.layout.dtype != np.uint8
            or len(shape) != 3
            or patch.pixels.shape[1:] != tuple(shape[1:])
            or (len(patch.rows) and not 0 <= patch.rows.min() <= patch.rows.max() < shape[0])
        ):
            raise ValueError(
                f"{packed}: a patch of {patch.pixels.shape} at rows {patch.rows.min()}–"
                f"{patch.rows.max()} does not fit the array's {shape} {writer.layout.dtype}; "
                f"remove {patch_journal(packed).name} and the array to rebuild it"
            )
        write_rows(writer, patch)
        writer.sync()
    write_keys(packed, patch.keys)


def write_rows(writer: PackedRowWriter, patch: RowPatch) -> None:
    """Each patched row at its place in the open array."""
    for row, pixels in zip(patch.rows.tolist(), patch.pixels, strict=True):
        writer.write(row, pixels)


def _write_journal(handle: Any, patch: RowPatch) -> None:
    keys = np.frombuffer(json.dumps(list(patch.keys)).encode(), dtype=np.uint8)
    np.savez(handle, rows=np.asarray(patch.rows, np.int64), pixels=patch.pixels, keys=keys)


def _read_journal(content: bytes) -> RowPatch:
    with np.load(io.BytesIO(content), allow_pickle=False) as journal:
        return RowPatch(
            rows=journal["rows"],
            pixels=journal["pixels"],
            keys=json.loads(journal["keys"].tobytes().decode()),
        )
