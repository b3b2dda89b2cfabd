"""Fingerprints of a parent dataset's images, computed exactly as the `images` stage computes
its own (same decode, resize and hashes), each re-used while its file and settings hold."""

from __future__ import annotations

import hashlib
import posixpath
from collections.abc import Mapping
from dataclasses import dataclass

import pandas as pd

from radharmony_pipeline.processing.execution.parallel import Progress, map_in_chunks
from radharmony_pipeline.processing.imaging.decode import DecodeError, decode_grayscale
from radharmony_pipeline.processing.imaging.geometry import GEOMETRIES, resize_image
from radharmony_pipeline.processing.imaging.image_files import confined_source
from radharmony_pipeline.processing.jobs.image_jobs import (
    IMAGE_CODE_VERSION,
    content_fingerprints,
    read_source,
)
from radharmony_pipeline.processing.storage.source_store import FileState, SourcePath
from radharmony_pipeline.processing.tables.table_schemas import NIH_FINGERPRINTS, pandas_dtype
from radharmony_pipeline.vocabulary import STATUS_ERROR, STATUS_OK

# Bumped when what is fingerprinted changes, so every parent image is redone once.
PARENT_FINGERPRINT_VERSION = "1"
FINGERPRINT_COLUMNS: tuple[str, ...] = tuple(NIH_FINGERPRINTS.names)


@dataclass(frozen=True)
class ParentImageJob:
    parent_image_id: str
    image_path: str  # relative to the parent's root
    root: SourcePath  # the parent's root: nothing is read from outside it
    source_file: SourcePath
    state: FileState
    size: int
    resize: str

    def input_key(self) -> str:
        """What the fingerprint depends on: the file's state, the decoder and the settings."""
        size, version = self.state
        return (
            f"{PARENT_FINGERPRINT_VERSION}:{IMAGE_CODE_VERSION}:{size}:{version}:"
            f"{self.size}:{self.resize}"
        )

    def row(self, **values: object) -> dict[str, object]:
        """The image's row: what the job knows, `values`, and null for every other column."""
        return {
            **dict.fromkeys(FINGERPRINT_COLUMNS),
            "parent_image_id": self.parent_image_id,
            "image_path": self.image_path,
            "input_key": self.input_key(),
            "size": self.size,
            "resize": self.resize,
            "status": STATUS_OK,
            **values,
        }


def fingerprint_parent_image(job: ParentImageJob) -> dict[str, object]:
    """Top-level (picklable): the row of one image, or its error row."""
    try:
        with confined_source(job.source_file, job.root, job.state) as source:
            content = read_source(source)
        decoded = decode_grayscale(job.source_file, target_size=job.size, content=content)
        geometry = GEOMETRIES[job.resize](decoded.source_height, decoded.source_width, job.size)
        pixels = resize_image(decoded.pixels, geometry)
        return job.row(
            source_sha256=hashlib.sha256(content).hexdigest(),
            **content_fingerprints(pixels, geometry),
        )
    except (DecodeError, OSError, ValueError) as exc:
        return job.row(status=STATUS_ERROR, error=str(exc))


def parent_image_jobs(
    root: SourcePath, states: Mapping[str, FileState], size: int, resize: str
) -> list[ParentImageJob]:
    """One job per image file; the id is the file name (NIH's Image Index)."""
    return [
        ParentImageJob(
            posixpath.basename(relative), relative, root, root / relative, state, size, resize
        )
        for relative, state in sorted(states.items())
    ]


def fingerprint_parent_images(
    jobs: list[ParentImageJob],
    previous: pd.DataFrame | None,
    workers: int,
    on_progress: Progress | None = None,
) -> tuple[pd.DataFrame, int]:
    """The fingerprint table (re-using every previous ok row whose input key still holds) and
    how many images were decoded. Two files with one id: the second is an error row."""
    reusable: dict[str, dict] = {}
    if previous is not None and len(previous):
        ok = previous[previous["status"] == STATUS_OK]
        reusable = {
            str(row["image_path"]): row
            for row in ok.astype(object).where(ok.notna(), None).to_dict("records")
        }
    rows: list[dict | None] = []
    pending: list[tuple[int, ParentImageJob]] = []
    seen: dict[str, str] = {}
    for job in jobs:
        if job.parent_image_id in seen:
            rows.append(
                job.row(
                    status=STATUS_ERROR,
                    error=f"{job.source_file}: the same image as {seen[job.parent_image_id]} "
                    "(one Image Index in two folders); remove one copy",
                )
            )
            continue
        seen[job.parent_image_id] = job.image_path
        kept = reusable.get(job.image_path)
        if kept is not None and kept["input_key"] == job.input_key():
            rows.append(kept)
        else:
            pending.append((len(rows), job))
            rows.append(None)
    computed = map_in_chunks(
        fingerprint_parent_image, [job for _, job in pending], workers, on_progress=on_progress
    )
    for (position, _), row in zip(pending, computed, strict=True):
        rows[position] = row
    return fingerprint_table(rows), len(pending)


def fingerprint_table(rows: list) -> pd.DataFrame:
    frame = pd.DataFrame(rows, columns=list(FINGERPRINT_COLUMNS))
    types = {c.name: pandas_dtype(c.type) for c in NIH_FINGERPRINTS.columns}
    return frame.astype(types | {"size": "int64"})  # every row, error rows too, has a size
