"""Rows of a packed N×S×S `.npy` array read in bounded windows, from a local file (seek and
read) or an object (range requests), so that no reader ever holds the whole array; and
written in place into a local file, a row per system call.

The header is parsed once (numpy.lib.format); row r then starts at `data_offset + r *
row_bytes`. Reading with plain reads rather than a memory map keeps the pages out of the
reader's resident set: a mapped 12 GB array counts in full against `/usr/bin/time -f %M`
once every row has been touched.
"""

from __future__ import annotations

import io
import math
import os
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import numpy as np

from radharmony_pipeline.processing.storage.atomic import (
    TEMP_MARKER,
    write_atomically,
    writer_is_gone,
)
from radharmony_pipeline.processing.storage.retry_policy import is_local, with_retries
from radharmony_pipeline.processing.storage.store import (
    OutputPath,
    as_local_path,
    file_size,
    output_write_errors,
    publish_bytes,
)

# The .npy prefix: magic string (6 bytes), version (2), header length (2 bytes in version 1,
# 4 bytes in versions 2 and 3).
_MAGIC_BYTES = 8
_PREFIX_BYTES = _MAGIC_BYTES + 4
# One range request on an object store reads at most this much: a window is assembled from
# several, so a cut connection costs one request again and the reader holds at most the
# window plus one request's body.
REQUEST_BYTES = 8 << 20
# Rows read at once by default: small enough for any machine, large enough that a read's
# fixed cost (a request, a system call) is negligible.
DEFAULT_WINDOW_BYTES = 16 << 20


class PackedArrayError(ValueError):
    """The file is not a readable packed array (bad header, wrong dtype or order, truncated
    or overlong): `problem` says what is wrong, the message also names the file."""

    def __init__(self, path: OutputPath, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path, self.problem = path, problem


@dataclass(frozen=True)
class PackedLayout:
    """Where the rows of a packed array lie in its file."""

    path: OutputPath
    shape: tuple[int, ...]
    dtype: np.dtype
    data_offset: int

    @property
    def rows(self) -> int:
        return self.shape[0] if self.shape else 0

    @property
    def row_shape(self) -> tuple[int, ...]:
        return self.shape[1:]

    @property
    def row_bytes(self) -> int:
        return math.prod(self.row_shape) * self.dtype.itemsize

    def rows_per_window(self, window_bytes: int) -> int:
        """How many whole rows fit in `window_bytes` (at least one)."""
        return max(1, window_bytes // max(self.row_bytes, 1))


def read_layout(path: OutputPath) -> PackedLayout:
    """The layout of the packed array at `path`, from its header (a few hundred bytes read),
    checked against the file's size. FileNotFoundError if absent; PackedArrayError if the
    file is not a whole C-ordered array (a truncated one says so)."""
    if is_local(path):
        with open(path, "rb") as handle:
            header = _parse_header(path, handle)
    else:
        header = _parse_header(path, io.BytesIO(_object_header_bytes(path)))
    shape, fortran_order, dtype, offset = header
    if fortran_order:
        raise PackedArrayError(path, "its rows are stored in Fortran order, C order expected")
    if dtype.hasobject:
        raise PackedArrayError(path, f"it holds Python objects ({dtype}), not pixels")
    layout = PackedLayout(path, shape, dtype, offset)
    expected = offset + layout.rows * layout.row_bytes
    actual = file_size(path)
    if actual < expected:
        raise PackedArrayError(
            path, f"truncated: {actual:,} bytes, its header ({shape}, {dtype}) needs {expected:,}"
        )
    if actual > expected:
        raise PackedArrayError(
            path, f"{actual - expected:,} bytes after its last row (its header: {shape}, {dtype})"
        )
    return layout


@dataclass
class PackedRowReader:
    """Reads rows of one packed array; keeps one open handle for a local file. Counts what it
    read (`reads`: bytes per read call), so callers and tests can see the window it held."""

    layout: PackedLayout
    reads: list[int] = field(default_factory=list)
    _handle: BinaryIO | None = field(default=None, init=False, repr=False)

    def __enter__(self) -> PackedRowReader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None

    def read(self, start: int, stop: int) -> np.ndarray:
        """Rows [start, stop) as a new array."""
        out = np.empty((stop - start, *self.layout.row_shape), dtype=self.layout.dtype)
        return self.read_into(start, out)

    def read_into(self, start: int, out: np.ndarray) -> np.ndarray:
        """Rows [start, start + len(out)) written into `out` (C-contiguous, the array's row
        shape and dtype), which is returned."""
        if not out.flags.c_contiguous:
            raise ValueError("rows are read into a C-contiguous array only")
        stop = start + len(out)
        if not 0 <= start <= stop <= self.layout.rows:
            raise IndexError(
                f"{self.layout.path}: rows [{start}, {stop}) outside its {self.layout.rows}"
            )
        view = memoryview(out.reshape(-1).view(np.uint8))
        begin = self.layout.data_offset + start * self.layout.row_bytes
        if is_local(self.layout.path):
            self._read_local(begin, view)
        else:
            self._read_object(begin, view)
        self.reads.append(len(view))
        return out

    def windows(
        self, window_bytes: int = DEFAULT_WINDOW_BYTES, start: int = 0, stop: int | None = None
    ) -> Iterator[tuple[int, np.ndarray]]:
        """(first row, rows) for consecutive windows of at most `window_bytes` covering
        [start, stop). One buffer is re-used: each window's array is overwritten by the
        next, so the reader holds one window however large the array."""
        stop = self.layout.rows if stop is None else stop
        per_window = min(self.layout.rows_per_window(window_bytes), max(stop - start, 0))
        buffer = np.empty((per_window, *self.layout.row_shape), dtype=self.layout.dtype)
        for first in range(start, stop, max(per_window, 1)):
            count = min(per_window, stop - first)
            yield first, self.read_into(first, buffer[:count])

    def _read_local(self, begin: int, view: memoryview) -> None:
        if self._handle is None:
            self._handle = open(Path(self.layout.path), "rb")  # noqa: SIM115 (closed by close())
        self._handle.seek(begin)
        filled = 0
        while filled < len(view):
            got = self._handle.readinto(view[filled:])
            if not got:
                raise PackedArrayError(
                    self.layout.path, f"ended at byte {begin + filled:,} (shortened while read?)"
                )
            filled += got

    def _read_object(self, begin: int, view: memoryview) -> None:
        path = self.layout.path
        for offset in range(0, len(view), REQUEST_BYTES):
            end = min(offset + REQUEST_BYTES, len(view))
            body = with_retries(
                path,
                "read rows of the array",
                lambda a=begin + offset, b=begin + end: path.fs.cat_file(path.path, start=a, end=b),
            )
            if len(body) != end - offset:
                raise PackedArrayError(
                    path,
                    f"{len(body):,} bytes at byte {begin + offset:,}, {end - offset:,} "
                    "expected (shortened while read?)",
                )
            view[offset:end] = body


class PackedRowWriter:
    """Writes rows of one local packed array in place, each run of rows with one `pwrite`.

    Not through a memory map: a mapped page written for the first time costs a page fault
    and the file system's bookkeeping per 4 KB, several times a `pwrite` of the same bytes
    (benchmarks/README.md), and assembling an array writes every page of it once."""

    def __init__(self, path: Path) -> None:
        self.layout = read_layout(path)
        self._descriptor: int | None = os.open(path, os.O_WRONLY | os.O_CLOEXEC)

    def __enter__(self) -> PackedRowWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        if self._descriptor is not None:
            os.close(self._descriptor)
            self._descriptor = None

    def sync(self) -> None:
        """The rows written so far, on disk (a journal's patch is complete only then)."""
        if self._descriptor is None:
            raise ValueError(f"{self.layout.path}: synced after the writer was closed")
        os.fsync(self._descriptor)

    def write(self, start: int, rows: np.ndarray) -> None:
        """`rows` (the array's row shape, one or more of them) at rows [start, start + n)."""
        layout = self.layout
        if rows.shape[-len(layout.row_shape) :] != layout.row_shape or rows.dtype != layout.dtype:
            raise ValueError(
                f"{layout.path}: rows of {rows.shape} {rows.dtype}, the array's are "
                f"{layout.row_shape} {layout.dtype}"
            )
        block = np.ascontiguousarray(rows).reshape(-1, *layout.row_shape)
        if not 0 <= start <= start + len(block) <= layout.rows:
            raise IndexError(
                f"{layout.path}: rows [{start}, {start + len(block)}) outside its {layout.rows}"
            )
        if self._descriptor is None:
            raise ValueError(f"{layout.path}: written after the writer was closed")
        view = memoryview(block.reshape(-1).view(np.uint8))
        offset = layout.data_offset + start * layout.row_bytes
        while view:
            written = os.pwrite(self._descriptor, view, offset)
            if written == 0:  # never for a regular file; guards the loop
                raise OSError(f"{layout.path}: nothing written at byte {offset:,}")
            view, offset = view[written:], offset + written


def claim_interrupted_build(packed: Path, scratch: Path, shape: tuple[int, ...]) -> bool:
    """Whether the array a killed build of the local `packed` was assembling is now `scratch`:
    a temporary sibling of `packed` whose writer is gone, of `shape` and of bytes, renamed.
    Its rows written before the kill are then looked at instead of decoded again (the
    caller checks each against its PNG's digest); the other leftovers are the clean-up's."""
    packed = Path(packed)
    for orphan in packed.parent.glob(f"{TEMP_MARKER}*-{packed.name}"):
        if orphan == scratch or not writer_is_gone(orphan):
            continue
        try:
            layout = read_layout(orphan)
        except (OSError, PackedArrayError):
            continue
        if layout.shape != shape or layout.dtype != np.uint8:
            continue
        try:
            os.replace(orphan, scratch)
        except FileNotFoundError:  # another run claimed it first
            continue
        return True
    return False


def publish_durably(path: OutputPath, write: Callable[[BinaryIO], object]) -> None:
    """Publish what `write(handle)` writes at `path` as store.publish does (no reader ever
    sees part of it), and on a local file system on disk under its name on return: the bytes
    synced before the rename, the folder after it, so that a power cut leaves the old file or
    the whole new one. On object storage the upload alone: a PUT is atomic, and durable once
    answered."""
    buffer = io.BytesIO()
    write(buffer)
    content = buffer.getvalue()
    if not is_local(path):
        publish_bytes(path, content)
        return
    local = as_local_path(path)
    with output_write_errors(local, len(content)):
        write_atomically(local, lambda temp: _write_synced(temp, content))
        sync_folder(local)


def _write_synced(path: Path, content: bytes) -> None:
    """`content` as the file `path`, on disk on return."""
    with open(path, "wb") as handle:
        handle.write(content)
        handle.flush()
        os.fsync(handle.fileno())


def sync_file(path: Path) -> None:
    """The bytes of the local file `path` on disk (before it is renamed into place: a power
    cut after the rename must not leave the name on rows never written out)."""
    _fsync(path)


def sync_folder(path: OutputPath) -> None:
    """The entries of the local folder holding `path` on disk, after a rename into it (or a
    removal) that must survive a power cut: a rename is durable only once its folder is
    synced. Nothing on object storage, where a PUT is atomic and durable once answered."""
    if is_local(path):
        _fsync(Path(path).parent)


def _fsync(path: Path) -> None:
    """fsync of the file or folder at `path` through a read-only descriptor (Linux syncs a
    file's or a folder's data and metadata whichever way it was opened)."""
    descriptor = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _object_header_bytes(path: OutputPath) -> bytes:
    """The header of an object's array: its prefix, then exactly the header it announces."""

    def read(start: int, end: int) -> bytes:
        return with_retries(
            path,
            "read the array's header",
            lambda: path.fs.cat_file(path.path, start=start, end=end),
        )

    prefix = read(0, _PREFIX_BYTES)
    if len(prefix) < _PREFIX_BYTES:
        return prefix  # too short for any header: the parser names the problem
    major = prefix[6]
    if major == 1:
        (length,) = struct.unpack("<H", prefix[_MAGIC_BYTES : _MAGIC_BYTES + 2])
        total = _MAGIC_BYTES + 2 + length
    else:
        (length,) = struct.unpack("<I", prefix[_MAGIC_BYTES : _MAGIC_BYTES + 4])
        total = _MAGIC_BYTES + 4 + length
    return prefix + read(_PREFIX_BYTES, total) if total > _PREFIX_BYTES else prefix[:total]


def _parse_header(
    path: OutputPath, handle: BinaryIO
) -> tuple[tuple[int, ...], bool, np.dtype, int]:
    """(shape, fortran_order, dtype, data offset) of the .npy at the handle's start."""
    try:
        major, _minor = np.lib.format.read_magic(handle)
        if major == 1:
            shape, fortran_order, dtype = np.lib.format.read_array_header_1_0(handle)
        else:
            # Versions 2 and 3 differ only in the header's length field and text encoding.
            shape, fortran_order, dtype = np.lib.format.read_array_header_2_0(handle)
    except (ValueError, EOFError, OSError) as error:
        raise PackedArrayError(path, f"not a readable .npy header: {error}") from error
    return tuple(int(n) for n in shape), bool(fortran_order), np.dtype(dtype), handle.tell()


@dataclass
class PackedBlockReader:
    """Single rows of one packed array served from blocks of `block_rows` consecutive rows,
    each read whole (one request on object storage) and kept, the least recently used
    dropped beyond `cached_blocks`: training that visits a block's rows close together (see
    loader.BlockShuffleSampler) pays one request per block instead of one per row."""

    rows: PackedRowReader
    block_rows: int
    cached_blocks: int
    _blocks: dict[int, np.ndarray] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.block_rows < 1 or self.cached_blocks < 1:
            raise ValueError(
                f"blocks of at least 1 row, at least 1 kept: got {self.block_rows} rows, "
                f"{self.cached_blocks} kept"
            )

    def row(self, index: int) -> np.ndarray:
        """Row `index` (a view into its cached block)."""
        block = index // self.block_rows
        rows = self._blocks.pop(block, None)  # re-inserted last: the most recently used
        if rows is None:
            start = block * self.block_rows
            stop = min(start + self.block_rows, self.rows.layout.rows)
            if not start <= index < stop:
                raise IndexError(f"{self.rows.layout.path}: row {index} outside its {stop} rows")
            rows = self.rows.read(start, stop)
            while len(self._blocks) >= self.cached_blocks:
                del self._blocks[next(iter(self._blocks))]
        self._blocks[block] = rows
        return rows[index - block * self.block_rows]

    def close(self) -> None:
        self._blocks.clear()
        self.rows.close()
