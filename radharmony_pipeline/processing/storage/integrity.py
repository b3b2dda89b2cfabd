"""What `radharmony verify` checks: that each output still holds what its recorded key claims
(table checksums, PNG chunk checksums and pixel digests, packed-array rows, export shards
against their shard indexes)."""

from __future__ import annotations

import hashlib
import io
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
from PIL import Image

from radharmony_pipeline.processing.corpus.exports import (
    HUGGINGFACE_FOLDER,
    HUGGINGFACE_SPLITS,
    WEBDATASET_FOLDER,
    WEBDATASET_INDEX_NAME,
    huggingface_index_name,
    read_shard_index,
    shard_problem,
)
from radharmony_pipeline.processing.imaging.perceptual_hash import pixels_sha256
from radharmony_pipeline.processing.imaging.tagged_png import png_problem
from radharmony_pipeline.processing.storage.output_layout import (
    packed_images,
    packed_keys,
    table_file,
)
from radharmony_pipeline.processing.storage.store import (
    OutputPath,
    exists,
    is_local,
    read_bytes,
    remove,
)

# The per-partition tables, and which of their columns name PNGs below the output root.
PARTITION_TABLES = ("raw_index", "labels", "masks", "bboxes", "images")
PNG_COLUMNS = {"masks": ("mask_path",), "images": ("image_path", "mask_path")}


@dataclass(frozen=True)
class Mismatch:
    path: str
    problem: str

    def __str__(self) -> str:
        return f"{self.path}: {self.problem}"


def verify_partition(
    root: OutputPath, partition: str, table_checksums: Mapping[str, str | None]
) -> list[Mismatch]:
    """Every mismatch of one partition's outputs: its tables (against `table_checksums`, the
    SHA-256 recorded per table when it was written, and their page checksums), the PNGs they
    name, and the packed array's rows against the images table's pixel digests."""
    mismatches: list[Mismatch] = []
    tables = {}
    for name in PARTITION_TABLES:
        path = table_file(root, name, partition)
        if not exists(path):
            continue
        table, problem = _read_table(path, table_checksums.get(name))
        if problem:
            mismatches.append(Mismatch(str(path), problem))
        if table is not None:
            tables[name] = table
    for name, columns in PNG_COLUMNS.items():
        if name in tables:
            mismatches += _png_mismatches(root, tables[name], columns)
    if "images" in tables:
        mismatches += _packed_mismatches(root / packed_images(partition), tables["images"])
    return mismatches


def damaged_export_shards(root: OutputPath, partition: str) -> list[tuple[OutputPath, str]]:
    """(shard, problem) for every shard of the partition's exports (WebDataset, Hugging Face
    Parquet) whose size or SHA-256 differs from its shard index's entry, or that is missing."""
    dataset, _, split = partition.partition(".")
    indexes = [root / WEBDATASET_FOLDER / partition / WEBDATASET_INDEX_NAME]
    if split in HUGGINGFACE_SPLITS:
        indexes.append(root / HUGGINGFACE_FOLDER / dataset / huggingface_index_name(split))
    damaged = []
    for index_path in indexes:
        index = read_shard_index(index_path)
        for shard in (index or {}).get("shards", []):
            problem = shard_problem(index_path.parent, shard)
            if problem:
                damaged.append((index_path.parent / shard["name"], problem))
    return damaged


def withdraw_packed_keys(root: OutputPath, partition: str) -> None:
    """Remove the key record of a partition's packed array, so that the next materialize
    checks every image and rebuilds the array instead of trusting them from their headers."""
    packed = root / packed_images(partition)
    remove(packed_keys(packed))


def _read_table(path: OutputPath, recorded: str | None) -> tuple[pd.DataFrame | None, str | None]:
    content = read_bytes(path)
    problem = None
    if recorded is not None and hashlib.sha256(content).hexdigest() != recorded:
        problem = f"SHA-256 differs from the one recorded when it was written ({recorded})"
    try:
        table = pq.read_table(io.BytesIO(content), page_checksum_verification=True).to_pandas()
    except (OSError, ValueError) as error:  # ArrowInvalid is a ValueError
        return None, f"unreadable Parquet: {error}"
    return table, problem


def _png_mismatches(root: OutputPath, table: pd.DataFrame, columns: tuple[str, ...]) -> list:
    mismatches = []
    ok = table[table["status"] == "ok"] if "status" in table else table
    digests = ok["pixels_sha256"] if "pixels_sha256" in ok else pd.Series(None, index=ok.index)
    for column in columns:
        if column not in ok:
            continue
        for relative, digest in zip(ok[column], digests, strict=True):
            if isinstance(relative, str) and relative:
                expected = digest if column == "image_path" and isinstance(digest, str) else None
                problem = _png_file_problem(root / relative, expected)
                if problem:
                    mismatches.append(Mismatch(str(root / relative), problem))
    return mismatches


def _png_file_problem(path: OutputPath, pixel_digest: str | None) -> str | None:
    try:
        content = read_bytes(path)
    except FileNotFoundError:
        return "missing"
    problem = png_problem(content)
    if problem or pixel_digest is None:
        return problem
    with Image.open(io.BytesIO(content), formats=["PNG"]) as image:
        if pixels_sha256(np.asarray(image)) != pixel_digest:
            return f"pixels differ from their recorded digest ({pixel_digest})"
    return None


def _packed_mismatches(packed: OutputPath, images: pd.DataFrame) -> list[Mismatch]:
    ok = images[images["status"] == "ok"]
    if not exists(packed):
        return [Mismatch(str(packed), "missing")] if len(images) else []
    try:
        if is_local(packed):  # mapped, not read into memory
            array = np.load(Path(packed), mmap_mode="r", allow_pickle=False)
        else:
            array = np.load(io.BytesIO(read_bytes(packed)), allow_pickle=False)
    except (OSError, ValueError, EOFError) as error:
        return [Mismatch(str(packed), f"unreadable array (truncated?): {error}")]
    if array.ndim != 3 or len(array) != len(images):
        return [Mismatch(str(packed), f"shape {array.shape}, {len(images)} rows expected")]
    bad = [
        int(row)
        for row, digest in zip(ok["tensor_index"], ok["pixels_sha256"], strict=True)
        if isinstance(digest, str) and pixels_sha256(array[int(row)]) != digest
    ]
    if bad:
        rows = ", ".join(map(str, bad[:10])) + (" …" if len(bad) > 10 else "")
        return [Mismatch(str(packed), f"{len(bad)} rows differ from their PNGs' digests: {rows}")]
    return []
