"""What `radharmony verify` checks: that each output still holds what its recorded key claims
(table checksums, PNG chunk checksums and pixel digests, packed-array rows, export shards
against their shard indexes), spread over the stages' executor in chunks of bounded size."""

from __future__ import annotations

import hashlib
import io
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from radharmony_pipeline.processing.corpus.exports import (
    HUGGINGFACE_FOLDER,
    HUGGINGFACE_SPLITS,
    WEBDATASET_FOLDER,
    WEBDATASET_INDEX_NAME,
    huggingface_index_name,
    read_shard_index,
    shard_problem,
)
from radharmony_pipeline.processing.execution.cluster import Executor, map_per_image
from radharmony_pipeline.processing.execution.parallel import Progress
from radharmony_pipeline.processing.imaging.image_files import (
    ImageFileError,
    read_grayscale_png,
)
from radharmony_pipeline.processing.imaging.perceptual_hash import pixels_sha256
from radharmony_pipeline.processing.imaging.tagged_png import leading_text_tags, png_problem
from radharmony_pipeline.processing.storage.output_layout import (
    packed_images,
    packed_keys,
    table_file,
)
from radharmony_pipeline.processing.storage.packed_rows import (
    DEFAULT_WINDOW_BYTES,
    PackedArrayError,
    PackedLayout,
    PackedRowReader,
    read_layout,
)
from radharmony_pipeline.processing.storage.retry_policy import ObjectStoreError
from radharmony_pipeline.processing.storage.store import (
    OutputPath,
    exists,
    read_bytes,
    remove,
)
from radharmony_pipeline.processing.tables.table_schemas import PARTITION_TABLES
from radharmony_pipeline.vocabulary import STATUS_OK

# The per-partition tables are table_schemas.PARTITION_TABLES. PNGs below the output root are
# named by the images table (`image_path`, `mask_path`: the resized image and union mask) and
# the masks table (`mask_path`: the native-resolution masks).
# The images table's column, and the resized PNG's tag, holding the SHA-256 of its pixels.
PIXEL_DIGEST = "pixels_sha256"
# The columns verify reads beyond the checksums, per table.
COLUMNS_USED = {
    "images": ("image_path", "mask_path", PIXEL_DIGEST, "tensor_index", "status"),
    "masks": ("mask_path", "status"),
}
# PNGs per chunk where no packed rows set the chunk's size (the masks table's, or images
# without a readable array): about a second of work, so that progress moves and the pool's
# per-chunk cost stays small.
PNGS_PER_CHUNK = 256
# Damaged rows named in a packed array's mismatch before "…".
ROWS_NAMED = 10


@dataclass(frozen=True)
class Mismatch:
    path: str
    problem: str

    def __str__(self) -> str:
        return f"{self.path}: {self.problem}"


@dataclass(frozen=True)
class PngEntry:
    """A PNG a table names, relative to the output root, with `pixel_digest` for a resized
    image (None for masks)."""

    relative: str
    pixel_digest: str | None = None


@dataclass(frozen=True)
class Findings:
    """What one check found: mismatches of single files, damaged packed rows (gathered into
    one mismatch per array), damaged export shards (removed by the caller)."""

    mismatches: tuple[Mismatch, ...] = ()
    damaged_rows: tuple[int, ...] = ()
    damaged_shards: tuple[tuple[OutputPath, str], ...] = ()


@dataclass(frozen=True)
class OutputChunk:
    """A slice of one partition's outputs, checked by one worker in one go: PNGs, and the
    packed rows [first_row, first_row + len(row_digests)) against their pixel digests (None:
    a row without an image). The rows are at most one window of the array."""

    root: OutputPath
    pngs: tuple[PngEntry, ...] = ()
    packed: PackedLayout | None = None
    first_row: int = 0
    row_digests: tuple[str | None, ...] = ()

    def outputs(self) -> int:
        """Files and rows this chunk checks (the unit of verify's progress)."""
        return len(self.pngs) + len(self.row_digests)

    def check(self) -> Findings:
        damaged, unreadable = self._damaged_rows()
        mismatches = [unreadable] if unreadable else []
        for entry in self.pngs:
            path = self.root / entry.relative
            problem = png_file_problem(path, entry.pixel_digest)
            if problem:
                mismatches.append(Mismatch(str(path), problem))
        return Findings(tuple(mismatches), tuple(damaged))

    def _damaged_rows(self) -> tuple[list[int], Mismatch | None]:
        """The chunk's rows whose pixels differ from their digests, or why they could not be
        read."""
        if self.packed is None or not self.row_digests:
            return [], None
        stop = self.first_row + len(self.row_digests)
        try:
            with PackedRowReader(self.packed) as reader:
                rows = reader.read(self.first_row, stop)
        except (OSError, PackedArrayError, ObjectStoreError) as error:
            problem = error.problem if isinstance(error, PackedArrayError) else str(error)
            return [], Mismatch(str(self.packed.path), f"unreadable array: {problem}")
        damaged = [
            self.first_row + offset
            for offset, digest in enumerate(self.row_digests)
            if digest is not None and pixels_sha256(rows[offset]) != digest
        ]
        return damaged, None


@dataclass(frozen=True)
class ExportShardCheck:
    """One shard an export's shard index lists, against that entry (size, SHA-256)."""

    folder: OutputPath
    shard: Mapping[str, object]

    def outputs(self) -> int:
        return 1

    def check(self) -> Findings:
        problem = shard_problem(self.folder, self.shard)
        if problem is None:
            return Findings()
        return Findings(damaged_shards=((self.folder / str(self.shard["name"]), problem),))


OutputCheck = OutputChunk | ExportShardCheck


def run_check(check: OutputCheck) -> Findings:
    """Top-level (picklable) entry point for the pool's or Dask's workers."""
    return check.check()


@dataclass
class PartitionFindings:
    """Everything found wrong in one partition's outputs."""

    partition: str
    # Tables, PNGs and the packed array, in that order.
    mismatches: list[Mismatch] = field(default_factory=list)
    # Export shards whose size or digest differs from their index (or missing).
    damaged_shards: list[tuple[OutputPath, str]] = field(default_factory=list)

    def pixels_damaged(self) -> bool:
        """Whether an image, mask or the packed array (not only a table) is damaged."""
        return any(not m.path.endswith(".parquet") for m in self.mismatches)


@dataclass
class _PartitionPlan:
    findings: PartitionFindings
    checks: list[OutputCheck]
    packed: OutputPath | None = None


def verify_partitions(
    root: OutputPath,
    table_checksums: Mapping[str, Mapping[str, str | None]],
    executor: Executor,
    on_progress: Progress | None = None,
    window_bytes: int = DEFAULT_WINDOW_BYTES,
) -> list[PartitionFindings]:
    """Every mismatch under `root` of each partition in `table_checksums` (partition → table
    → the SHA-256 recorded when it was written, or None), computed on `executor`.

    The tables are read here; the PNGs they name, the packed array's rows (in windows of at
    most `window_bytes`, with the PNGs of the same rows) and the export shards are checked
    in chunks on the executor. on_progress(outputs checked, outputs) as chunks finish."""
    plans = [
        _plan(root, partition, sums, window_bytes) for partition, sums in table_checksums.items()
    ]
    checks = [check for plan in plans for check in plan.checks]
    results = map_per_image(
        run_check, checks, executor, _progress_in_outputs(checks, on_progress), 1
    )
    position = 0
    for plan in plans:
        found = results[position : position + len(plan.checks)]
        position += len(plan.checks)
        plan.findings.mismatches += _gathered(found, plan.packed)
        plan.findings.damaged_shards += [d for f in found for d in f.damaged_shards]
    return [plan.findings for plan in plans]


def withdraw_packed_keys(root: OutputPath, partition: str) -> None:
    """Remove the key record of a partition's packed array, so that the next materialize
    checks every image and rebuilds the array instead of trusting them from their headers."""
    packed = root / packed_images(partition)
    remove(packed_keys(packed))


def png_file_problem(path: OutputPath, pixel_digest: str | None) -> str | None:
    """Why the PNG at `path` is not what was written (missing, a chunk checksum, pixels
    against `pixel_digest`), or None.

    The chunk checksums cover every byte after the signature, so once they hold, a PNG that
    carries `pixel_digest` as the tag it was written with (images stage) still holds those
    pixels, and is not decoded: that keeps verify near the cost of reading the files. A PNG
    without that tag, or with another digest, is decoded and its pixels hashed."""
    try:
        content = read_bytes(path)
    except FileNotFoundError:
        return "missing"
    problem = png_problem(content)
    if (
        problem
        or pixel_digest is None
        or leading_text_tags(content).get(PIXEL_DIGEST) == pixel_digest
    ):
        return problem
    try:
        pixels, _mode = read_grayscale_png(path, content)
    except ImageFileError as error:
        return error.reason
    if pixels_sha256(pixels) != pixel_digest:
        return f"pixels differ from their recorded digest ({pixel_digest})"
    return None


def _plan(
    root: OutputPath, partition: str, checksums: Mapping[str, str | None], window_bytes: int
) -> _PartitionPlan:
    """The partition's tables read and checked; the chunks left to check on the executor."""
    plan = _PartitionPlan(PartitionFindings(partition), [])
    tables = {}
    for name in PARTITION_TABLES:
        path = table_file(root, name, partition)
        if not exists(path):
            continue
        table, problem = _read_table(path, checksums.get(name), COLUMNS_USED.get(name, ()))
        if problem:
            plan.findings.mismatches.append(Mismatch(str(path), problem))
        if table is not None:
            tables[name] = table
    if "images" in tables:
        plan.packed = root / packed_images(partition)
        layout, problem = _packed_layout(plan.packed, tables["images"])
        if problem:
            plan.findings.mismatches.append(problem)
        plan.checks += _image_chunks(root, tables["images"], layout, window_bytes)
    if "masks" in tables:
        entries = [PngEntry(path) for path in _named_pngs(tables["masks"], "mask_path")]
        plan.checks += [
            OutputChunk(root, tuple(entries[start : start + PNGS_PER_CHUNK]))
            for start in range(0, len(entries), PNGS_PER_CHUNK)
        ]
    plan.checks += _export_shard_checks(root, partition)
    return plan


def _read_table(
    path: OutputPath, recorded: str | None, columns: Sequence[str]
) -> tuple[pd.DataFrame | None, str | None]:
    """The table's `columns` that it has (None when no column is wanted), after its SHA-256
    against `recorded` and every page's checksum are checked, one batch of rows at a time
    (a table's other columns, report texts among them, are never held whole)."""
    content = read_bytes(path)
    problem = None
    if recorded is not None and hashlib.sha256(content).hexdigest() != recorded:
        problem = f"SHA-256 differs from the one recorded when it was written ({recorded})"
    try:
        parquet = pq.ParquetFile(io.BytesIO(content), page_checksum_verification=True)
        for _batch in parquet.iter_batches():
            pass
        present = [column for column in columns if column in parquet.schema_arrow.names]
        table = parquet.read(columns=present).to_pandas() if columns else None
    except (OSError, ValueError) as error:  # ArrowInvalid is a ValueError
        return None, f"unreadable Parquet: {error}"
    return table, problem


def _ok_rows(table: pd.DataFrame) -> pd.DataFrame:
    return table[table["status"] == STATUS_OK] if "status" in table else table


def _named_pngs(table: pd.DataFrame, column: str) -> list[str]:
    ok = _ok_rows(table)
    if column not in ok:
        return []
    return [value for value in ok[column] if isinstance(value, str) and value]


def _packed_layout(
    packed: OutputPath, images: pd.DataFrame
) -> tuple[PackedLayout | None, Mismatch | None]:
    """The array's layout when it is whole and N×S×S with one row per image, else why not."""
    try:
        layout = read_layout(packed)
    except FileNotFoundError:
        return None, (Mismatch(str(packed), "missing") if len(images) else None)
    except (OSError, PackedArrayError, ObjectStoreError) as error:
        problem = error.problem if isinstance(error, PackedArrayError) else str(error)
        return None, Mismatch(str(packed), f"unreadable array (truncated?): {problem}")
    if len(layout.shape) != 3 or layout.rows != len(images):
        return None, Mismatch(str(packed), f"shape {layout.shape}, {len(images)} rows expected")
    if layout.dtype != np.uint8:
        return None, Mismatch(str(packed), f"dtype {layout.dtype}, uint8 expected")
    return layout, None


def _image_chunks(
    root: OutputPath, images: pd.DataFrame, layout: PackedLayout | None, window_bytes: int
) -> list[OutputChunk]:
    """The images table's rows in windows of the packed array, each window with the PNGs
    (images and union masks) of its rows; without a usable array, the PNGs alone."""
    ok = _ok_rows(images)
    image_paths, mask_paths, digests, rows = (
        _values(ok, column) for column in ("image_path", "mask_path", PIXEL_DIGEST, "tensor_index")
    )
    row_count = layout.rows if layout is not None else 0
    row_digests: list[str | None] = [None] * row_count
    # (position, entry): the packed row an image's PNGs sit beside, else the table's order.
    entries: list[tuple[int, PngEntry]] = []
    for order, (image, mask, digest, row) in enumerate(
        zip(image_paths, mask_paths, digests, rows, strict=True)
    ):
        digest = digest if isinstance(digest, str) else None
        row = int(row) if pd.notna(row) and 0 <= int(row) < row_count else None
        if row is not None:
            row_digests[row] = digest
        if isinstance(image, str) and image:
            entries.append((order if row is None else row, PngEntry(image, digest)))
        if isinstance(mask, str) and mask:
            entries.append((order if row is None else row, PngEntry(mask)))
    if layout is None:
        pngs = [entry for _position, entry in entries]
        return [
            OutputChunk(root, tuple(pngs[start : start + PNGS_PER_CHUNK]))
            for start in range(0, len(pngs), PNGS_PER_CHUNK)
        ]
    per_window = layout.rows_per_window(window_bytes)
    by_window: dict[int, list[PngEntry]] = {}
    for position, entry in entries:
        by_window.setdefault(min(position, row_count - 1) // per_window, []).append(entry)
    return [
        OutputChunk(
            root,
            tuple(by_window.get(first // per_window, ())),
            layout,
            first,
            tuple(row_digests[first : first + per_window]),
        )
        for first in range(0, row_count, per_window)
    ]


def _values(table: pd.DataFrame, column: str) -> list:
    """The column's values, or None for each row when the table has no such column."""
    return table[column].tolist() if column in table else [None] * len(table)


def _export_shard_checks(root: OutputPath, partition: str) -> list[ExportShardCheck]:
    """Every shard of the partition's exports (WebDataset, Hugging Face Parquet) that its
    shard index lists."""
    dataset, _, split = partition.partition(".")
    indexes = [root / WEBDATASET_FOLDER / partition / WEBDATASET_INDEX_NAME]
    if split in HUGGINGFACE_SPLITS:
        indexes.append(root / HUGGINGFACE_FOLDER / dataset / huggingface_index_name(split))
    return [
        ExportShardCheck(index_path.parent, shard)
        for index_path in indexes
        for shard in (read_shard_index(index_path) or {}).get("shards", [])
    ]


def _gathered(found: Sequence[Findings], packed: OutputPath | None) -> list[Mismatch]:
    """The chunks' mismatches in order (each once), then the packed array's damaged rows."""
    mismatches = list(dict.fromkeys(m for f in found for m in f.mismatches))
    bad = sorted(row for f in found for row in f.damaged_rows)
    if bad:
        rows = ", ".join(map(str, bad[:ROWS_NAMED])) + (" …" if len(bad) > ROWS_NAMED else "")
        problem = f"{len(bad)} rows differ from their PNGs' digests: {rows}"
        mismatches.append(Mismatch(str(packed), problem))
    return mismatches


def _progress_in_outputs(
    checks: Sequence[OutputCheck], on_progress: Progress | None
) -> Progress | None:
    """Progress in chunks (as the executor reports it) turned into outputs checked."""
    if on_progress is None:
        return None
    done_outputs = np.cumsum([0, *(check.outputs() for check in checks)])
    total = int(done_outputs[-1])

    def report(done_checks: int, _checks: int) -> None:
        on_progress(int(done_outputs[done_checks]), total)

    return report
