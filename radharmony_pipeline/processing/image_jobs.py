"""Per-image work of the `images` stage: decode, resize through a recorded geometry, write.

Each job writes the resized image (and its resized union mask) as PNGs tagged with a key of
their inputs and returns its pixels. A job whose outputs carry the current key re-uses them:
it reads the small resized PNG instead of decoding the source again. Jobs run in chunks
(local process pool or Dask cluster); each chunk writes its pixels as one shard, and the
partition's packed array is assembled from the shards and published once, so no memory map
is shared between machines.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from PIL import Image

from .atomic import TEMP_MARKER
from .cluster import map_per_image
from .decode import DecodeError, decode_grayscale
from .fingerprint import file_sha256
from .geometry import ResizeGeometry, resize_image, resize_mask
from .masks import mask_input_key, read_mask_png, write_mask_png
from .parallel import Progress, default_chunk_size
from .storage import is_local, local_scratch_file, publish, publish_file
from .tagged_png import INPUT_KEY_TAG, read_png_tags, stored_input_key, write_tagged_png

# Bumped when decoding or resizing changes, so every image is redone once.
IMAGE_CODE_VERSION = "1"
# At most this many images per chunk (one shard of ~12 MB at S=224), so that a large
# partition (ReXGradient train: 238,968 images) is shared by many workers.
MAX_IMAGES_PER_CHUNK = 256
GeometryFunction = Callable[[int, int, int], ResizeGeometry]


@dataclass
class ImageRow:
    image_id: str
    image_path: str | None
    mask_path: str | None
    size: int
    orig_height: int | None
    orig_width: int | None
    scale: float | None
    pad_top: int | None
    pad_left: int | None
    tensor_index: int
    source_sha256: str | None
    resize: str
    status: str = "ok"
    error: str | None = None
    decoded: bool = False


@dataclass(frozen=True)
class ImageJob:
    image_id: str
    source_file: Path
    union_mask_file: Any | None  # on the output root: a Path or a UPath
    output_root: Any
    image_relative: str
    mask_relative: str | None
    size: int
    geometry_of: GeometryFunction
    row: int

    @property
    def resize_mode(self) -> str:
        return self.geometry_of.__name__.removesuffix("_geometry")

    def input_key(self) -> str:
        """Source fingerprint (size + mtime), union-mask key and parameters."""
        stat = os.stat(self.source_file)
        mask_key = stored_input_key(self.union_mask_file) if self.union_mask_file else ""
        return mask_input_key(
            IMAGE_CODE_VERSION,
            f"{stat.st_size}:{stat.st_mtime_ns}",
            mask_key or "",
            str(self.size),
            self.geometry_of.__name__,
        )

    def reuse(self) -> tuple[ImageRow, np.ndarray] | None:
        """The row and pixels from existing outputs that carry the current input key, else
        None. Cheap: a stat, a PNG header and a small PNG decode."""
        try:
            return self._reuse(self.input_key())
        except OSError:
            return None

    def current_row(self, key: str) -> ImageRow | None:
        """The row from the outputs' headers when they carry `key` (pixels untouched)."""
        tags = read_png_tags(self.output_root / self.image_relative)
        if tags.get(INPUT_KEY_TAG) != key or not self._mask_is_current(key):
            return None
        return self._row(tags, decoded=False)

    def process(self) -> tuple[ImageRow, np.ndarray | None]:
        """Decode the source, resize and write the PNGs; the row and the pixels to pack.
        Errors become rows (without pixels)."""
        try:
            return self._process(self.input_key())
        except (DecodeError, OSError, ValueError) as exc:
            return self._error_row(str(exc)), None

    def _mask_is_current(self, key: str) -> bool:
        return self.mask_relative is None or (
            stored_input_key(self.output_root / self.mask_relative) == key
        )

    def _process(self, key: str) -> tuple[ImageRow, np.ndarray]:
        decoded = decode_grayscale(self.source_file, target_size=self.size)
        geometry = self.geometry_of(decoded.source_height, decoded.source_width, self.size)
        pixels = resize_image(decoded.pixels, geometry)
        if self.mask_relative is not None:
            mask = resize_mask(read_mask_png(self.union_mask_file), geometry)
            write_mask_png(self.output_root / self.mask_relative, mask, key)
        tags = {
            "orig_height": str(decoded.source_height),
            "orig_width": str(decoded.source_width),
            "scale": repr(geometry.scale_x),
            "pad_top": str(geometry.pad_top),
            "pad_left": str(geometry.pad_left),
            "source_sha256": file_sha256(self.source_file),
        }
        write_tagged_png(
            self.output_root / self.image_relative, lambda: Image.fromarray(pixels), key, tags
        )
        return self._row(tags, decoded=True), pixels

    def _reuse(self, key: str) -> tuple[ImageRow, np.ndarray] | None:
        """The row and pixels from the existing outputs when they carry `key`, else None."""
        try:
            with (
                (self.output_root / self.image_relative).open("rb") as handle,
                Image.open(handle, formats=["PNG"]) as image,
            ):
                tags = {k: v for k, v in image.info.items() if isinstance(v, str)}
                if tags.get(INPUT_KEY_TAG) != key or not self._mask_is_current(key):
                    return None
                pixels = np.asarray(image)
        except (OSError, SyntaxError):
            return None
        return self._row(tags, decoded=False), pixels

    def _row(self, tags: dict[str, str], decoded: bool) -> ImageRow:
        return ImageRow(
            image_id=self.image_id,
            image_path=self.image_relative,
            mask_path=self.mask_relative,
            size=self.size,
            orig_height=int(tags["orig_height"]),
            orig_width=int(tags["orig_width"]),
            scale=float(tags["scale"]),
            pad_top=int(tags["pad_top"]),
            pad_left=int(tags["pad_left"]),
            tensor_index=self.row,
            source_sha256=tags["source_sha256"],
            resize=self.resize_mode,
            decoded=decoded,
        )

    def _error_row(self, message: str) -> ImageRow:
        return ImageRow(
            image_id=self.image_id,
            image_path=None,
            mask_path=None,
            size=self.size,
            orig_height=None,
            orig_width=None,
            scale=None,
            pad_top=None,
            pad_left=None,
            tensor_index=self.row,
            source_sha256=None,
            resize=self.resize_mode,
            status="error",
            error=message,
        )


@dataclass(frozen=True)
class ImageChunk:
    """Consecutive jobs of one partition and the shard their pixels go to."""

    jobs: tuple[ImageJob, ...]
    shard: Any  # a temporary file or object beside the packed array
    size: int


def process_image_chunk(chunk: ImageChunk) -> list[ImageRow]:
    """Top-level (picklable) entry point for a pool or Dask worker: every job of the chunk
    (re-used or processed), its pixels saved as one shard; rows in job order."""
    pixels = np.zeros((len(chunk.jobs), chunk.size, chunk.size), dtype=np.uint8)
    rows = []
    for position, job in enumerate(chunk.jobs):
        row, image = job.reuse() or job.process()
        if image is not None:
            pixels[position] = image
        rows.append(row)
    with chunk.shard.open("wb") as handle:
        np.save(handle, pixels, allow_pickle=False)
    return rows


def build_packed_images(
    jobs: Sequence[ImageJob],
    packed: Any,
    size: int,
    workers: int,
    on_progress: Progress | None = None,
) -> list[ImageRow]:
    """Rows of the partition's images and its packed N×S×S array at `packed` (a local
    Path or a UPath on object storage).

    When the array exists and every image's input key equals the one recorded beside it
    (`<name>.keys.json`) and in its PNG, nothing is read beyond file headers. Otherwise the
    jobs run in chunks (current PNGs re-used, the rest decoded), each chunk's pixels come
    back as a shard, and the array is assembled locally and published once; then its keys
    are recorded.
    """
    keys_file = packed.with_name(packed.name + ".keys.json")
    keys = _input_keys(jobs, packed, workers)
    if packed.exists() and _recorded_keys(keys_file) == keys:
        rows = _current_rows(jobs, keys, packed, workers)
        if all(row is not None for row in rows):
            return rows
    chunks = _chunks(jobs, packed, size, workers)
    try:
        rows = run_image_chunks(chunks, workers, len(jobs), on_progress)
        with local_scratch_file(packed, suffix=".npy") as scratch:
            _assemble(chunks, scratch, len(jobs), size)
            publish_file(packed, scratch)
    finally:
        for chunk in chunks:
            _remove_quietly(chunk.shard)
    publish(keys_file, lambda handle: handle.write(json.dumps(keys).encode()))
    return rows


def current_row_of(job_and_key: tuple[ImageJob, str | None]) -> ImageRow | None:
    """Top-level (picklable) form of ImageJob.current_row for workers."""
    job, key = job_and_key
    return job.current_row(key) if key is not None else None


def _input_keys(jobs: Sequence[ImageJob], packed: Any, workers: int) -> list[str | None]:
    if is_local(packed) or not any(job.union_mask_file for job in jobs):
        return [_input_key_or_none(job) for job in jobs]
    # A union mask's key is read from its PNG header: one request each on object storage.
    return map_per_image(_input_key_or_none, jobs, workers)


def _current_rows(
    jobs: Sequence[ImageJob], keys: Sequence[str | None], packed: Any, workers: int
) -> list[ImageRow | None]:
    pairs = list(zip(jobs, keys, strict=True))
    if is_local(packed):
        # Local headers cost microseconds; a pool would only add its start-up time.
        return [current_row_of(pair) for pair in pairs]
    # On object storage every header is a request: spread them over the workers.
    return map_per_image(current_row_of, pairs, workers)


def _chunks(jobs: Sequence[ImageJob], packed: Any, size: int, workers: int) -> list[ImageChunk]:
    per_chunk = min(default_chunk_size(len(jobs), workers), MAX_IMAGES_PER_CHUNK)
    run = uuid.uuid4().hex
    return [
        ImageChunk(
            jobs=tuple(jobs[start : start + per_chunk]),
            shard=packed.with_name(f"{TEMP_MARKER}{run}-{start}-{packed.name}"),
            size=size,
        )
        for start in range(0, len(jobs), per_chunk)
    ]


def run_image_chunks(
    chunks: Sequence[ImageChunk], workers: int, images: int, on_progress: Progress | None
) -> list[ImageRow]:
    """Rows of every chunk in order; progress is reported in images, not chunks."""
    sizes = [len(chunk.jobs) for chunk in chunks]

    def chunk_progress(done_chunks: int, _total: int) -> None:
        if on_progress is not None:
            on_progress(min(sum(sizes[:done_chunks]), images), images)

    results = map_per_image(process_image_chunk, chunks, workers, chunk_progress, chunk_size=1)
    return [row for rows in results for row in rows]


def _assemble(chunks: Sequence[ImageChunk], scratch: Path, count: int, size: int) -> None:
    """The packed array from the shards, one shard in memory at a time."""
    packed = np.lib.format.open_memmap(
        scratch, mode="w+", dtype=np.uint8, shape=(count, size, size)
    )
    start = 0
    for chunk in chunks:
        with chunk.shard.open("rb") as handle:
            shard = np.load(handle, allow_pickle=False)
        packed[start : start + len(shard)] = shard
        start += len(shard)
    packed.flush()
    del packed


def _remove_quietly(path: Any) -> None:
    try:
        if isinstance(path, Path):
            path.unlink(missing_ok=True)
        else:
            path.fs.rm(path.path)
    except FileNotFoundError:
        pass


def _input_key_or_none(job: ImageJob) -> str | None:
    try:
        return job.input_key()
    except OSError:
        return None


def _recorded_keys(path: Any) -> list | None:
    try:
        with path.open("rb") as handle:
            return json.loads(handle.read())
    except (OSError, ValueError):
        return None


IMAGE_COLUMNS = (
    "image_id",
    "image_path",
    "mask_path",
    "size",
    "orig_height",
    "orig_width",
    "scale",
    "pad_top",
    "pad_left",
    "tensor_index",
    "source_sha256",
    "resize",
    "status",
    "error",
    "decoded",
)


def image_table(rows: Sequence[ImageRow]) -> pd.DataFrame:
    """The `images` table (DESIGN §4; `decoded` says whether the source was decoded)."""
    frame = pd.DataFrame([asdict(row) for row in rows], columns=list(IMAGE_COLUMNS))
    return frame.astype(
        {
            "image_id": "string",
            "image_path": "string",
            "mask_path": "string",
            "size": "int64",
            "orig_height": "Int64",
            "orig_width": "Int64",
            "scale": "float64",
            "pad_top": "Int64",
            "pad_left": "Int64",
            "tensor_index": "int64",
            "source_sha256": "string",
            "resize": "string",
            "status": "string",
            "error": "string",
            "decoded": "bool",
        }
    )
