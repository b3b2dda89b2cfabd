"""Per-image mask work: one job per image, run in a process pool, returning table rows.

A job writes the image's per-class masks and its union (`any`) as 0/255 PNGs at native
resolution and returns one row per written mask. Two kinds exist because the datasets
annotate differently: COCO RLEs (CheXlocalize) and polygons (ChestX-Det).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from radharmony_pipeline.processing.annotations.masks import (
    MaskSizeError,
    area_fraction,
    decode_rle,
    mask_input_key,
    rasterize_polygons,
    rle_area,
    union_rle_masks,
    write_mask_png,
)
from radharmony_pipeline.processing.imaging.image_files import (
    ImageFileError,
    confined,
    header_image_size,
    read_grayscale_png,
)
from radharmony_pipeline.processing.storage.store import remove_orphaned_temporaries
from radharmony_pipeline.processing.tables.table_schemas import (
    MASKS,
    WorkingField,
    row_type,
    rows_frame,
)
from radharmony_pipeline.vocabulary import STATUS_ERROR, UNION_CLASS

# Bumped when the way masks are computed changes, so every mask is rewritten once.
MASK_CODE_VERSION = "1"


# `written`: whether the PNG was (re)written, else already current, for the step's metadata.
MaskRow = row_type(MASKS, "MaskRow", __name__, (WorkingField("written", bool, False),))


@dataclass(frozen=True)
class MaskTarget:
    """Where one image's masks go: `<output_root>/<folder>/<class>.png` (folder is relative).
    `listed`: the file names a listing of the partition's masks, taken by the caller on an
    object store, found in `folder`; a mask not among them is written without being read
    first (on a store, a 404 per mask on a first build). None: look at each file."""

    output_root: Path
    folder: str
    listed: frozenset[str] | None = None

    def relative_path(self, mask_class: str) -> str:
        return f"{self.folder}/{mask_class}.png"

    def write(self, mask_class: str, mask: np.ndarray, key: str) -> bool:
        absent = self.listed is not None and f"{mask_class}.png" not in self.listed
        path = self.output_root / self.relative_path(mask_class)
        return write_mask_png(path, mask, key, absent=absent)


@dataclass(frozen=True)
class RleMaskJob:
    """CheXlocalize: class → COCO RLE; the RLE sizes must match the JPEG's header size."""

    image_id: str
    image_file: Path
    target: MaskTarget
    rles: Mapping[str, Mapping] = field(default_factory=dict)
    # The folder the image must stay inside (resolved), and why the annotation is unusable
    # (file, entry, field) when the reader found it malformed: then nothing is read.
    image_root: Path | None = None
    problem: str | None = None

    def run(self) -> list[MaskRow]:
        if self.problem is not None:
            return [_error_row(self.image_id, self.problem)]
        try:
            height, width = header_image_size(confined(self.image_file, self.image_root))
            present = {name: rle for name, rle in self.rles.items() if rle_area(rle) > 0}
            union = union_rle_masks(list(self.rles.values()), height, width)
        except (ImageFileError, MaskSizeError) as exc:
            return [_error_row(self.image_id, f"{self.image_file}: {exc}")]
        except ValueError as exc:  # RLE text the reader did not catch (see rle_text)
            return [_error_row(self.image_id, f"{self.image_file}: annotation: {exc}")]
        rows = []
        for name, rle in sorted(present.items()):
            mask = decode_rle(rle)
            key = mask_input_key(MASK_CODE_VERSION, json.dumps(rle, sort_keys=True))
            rows.append(_mask_row(self, name, mask, key, "rle"))
        union_key = mask_input_key(
            MASK_CODE_VERSION, f"{height}x{width}", json.dumps(self.rles, sort_keys=True)
        )
        rows.append(_mask_row(self, UNION_CLASS, union, union_key, "rle" if self.rles else "empty"))
        return rows


@dataclass(frozen=True)
class PolygonMaskJob:
    """ChestX-Det: class → polygon instances in a fixed frame; the PNG is read to confirm it."""

    image_id: str
    image_file: Path
    target: MaskTarget
    frame: tuple[int, int]
    polygons: Mapping[str, Sequence[Sequence[Sequence[float]]]] = field(default_factory=dict)
    image_root: Path | None = None
    problem: str | None = None

    def run(self) -> list[MaskRow]:
        if self.problem is not None:
            return [_error_row(self.image_id, self.problem)]
        try:
            # Decoded, not only its header read: a truncated file or a colour RGBA image is
            # this image's error row here too, not a mask beside an unusable image.
            pixels, _mode = read_grayscale_png(confined(self.image_file, self.image_root))
            shape = pixels.shape
        except ImageFileError as exc:
            return [_error_row(self.image_id, str(exc))]
        if shape != self.frame:
            return [
                _error_row(
                    self.image_id,
                    f"{self.image_file}: image is {shape[0]}x{shape[1]}, "
                    f"annotations are in a {self.frame[0]}x{self.frame[1]} frame",
                )
            ]
        height, width = self.frame
        union = np.zeros(self.frame, dtype=np.uint8)
        rows = []
        for name, instances in sorted(self.polygons.items()):
            mask = rasterize_polygons(instances, height, width)
            union |= mask
            key = mask_input_key(MASK_CODE_VERSION, json.dumps(instances))
            rows.append(_mask_row(self, name, mask, key, "polygon"))
        union_key = mask_input_key(
            MASK_CODE_VERSION, f"{height}x{width}", json.dumps(self.polygons, sort_keys=True)
        )
        source = "polygon" if self.polygons else "empty"
        rows.append(_mask_row(self, UNION_CLASS, union, union_key, source))
        return rows


MaskJob = RleMaskJob | PolygonMaskJob


def run_mask_job(job: MaskJob) -> list[MaskRow]:
    """Top-level (picklable) entry point for the process pool."""
    return job.run()


def mask_job_stopped(job: MaskJob, reason: str) -> list[MaskRow]:
    """The rows of a job whose worker was stopped (time limit) or died, once the temporary
    files that worker may have left in the image's mask folder are removed (on the worker's
    host, the only place that can tell the writer is gone)."""
    with contextlib.suppress(OSError):  # best effort; the step's own clean-up comes later
        remove_orphaned_temporaries(job.target.output_root / job.target.folder)
    return [_error_row(job.image_id, f"{job.image_file}: {reason}")]


def carried_index_errors(index_errors: pd.DataFrame) -> list[MaskRow]:
    """An error row per image whose raw_index row is an error: nothing was read for it."""
    return [
        _error_row(image_id, f"raw_index: {error}")
        for image_id, error in zip(index_errors["image_id"], index_errors["error"], strict=True)
    ]


def mask_table(rows: Sequence[MaskRow]) -> pd.DataFrame:
    """The `masks` table (declared in table_schemas.py), typed even when empty."""
    return rows_frame(rows, MaskRow, MASKS)


def _mask_row(job, mask_class: str, mask: np.ndarray, key: str, source: str) -> MaskRow:
    written = job.target.write(mask_class, mask, key)
    return MaskRow(
        image_id=job.image_id,
        mask_class=mask_class,
        mask_path=job.target.relative_path(mask_class),
        height=int(mask.shape[0]),
        width=int(mask.shape[1]),
        area_fraction=area_fraction(mask),
        source=source,
        written=written,
    )


def _error_row(image_id: str, message: str) -> MaskRow:
    return MaskRow(image_id=image_id, mask_class=UNION_CLASS, status=STATUS_ERROR, error=message)
