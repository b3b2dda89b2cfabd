"""Per-image work of the `images` stage: decode, resize through a recorded geometry, write.

Each job writes the resized image (and its resized union mask) as PNGs tagged with a key of
their inputs, and its pixels into row `row` of the partition's packed array. A job whose
outputs carry the current key re-uses them: it reads the small resized PNG instead of
decoding the source again.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd
from PIL import Image

from .atomic import temporary_sibling, write_atomically
from .decode import DecodeError, decode_grayscale
from .fingerprint import file_sha256
from .geometry import ResizeGeometry, resize_image, resize_mask
from .image_files import confined
from .masks import mask_input_key, read_mask_png, write_mask_png
from .parallel import Progress, map_in_chunks
from .perceptual_hash import perceptual_hash, pixels_sha256
from .supervised import TimeLimit
from .tagged_png import INPUT_KEY_TAG, read_png_tags, stored_input_key, write_tagged_png

# Bumped when decoding or resizing changes, so every image is redone once.
IMAGE_CODE_VERSION = "2"  # 2: perceptual hash and pixel digest (issue 11)
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
    perceptual_hash: str | None = None
    pixels_sha256: str | None = None
    status: str = "ok"
    error: str | None = None
    decoded: bool = False


@dataclass(frozen=True)
class ImageJob:
    image_id: str
    source_file: Path
    union_mask_file: Path | None
    output_root: Path
    image_relative: str
    mask_relative: str | None
    size: int
    geometry_of: GeometryFunction
    packed_file: Path
    row: int
    # The folder the source must stay inside (resolved), and the raw_index error of an image
    # whose metadata entry is unusable: then nothing is read and the row carries that error.
    source_root: Path | None = None
    index_error: str | None = None

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

    def reuse(self) -> ImageRow | None:
        """The row from existing outputs that carry the current input key (their pixels are
        packed), else None. Cheap: a stat, a PNG header and a small PNG decode."""
        if self.index_error is not None:
            return None
        try:
            return self._reuse(self.input_key())
        except (OSError, ValueError):  # ValueError: a NUL byte in the path
            return None

    def current_row(self, key: str) -> ImageRow | None:
        """The row from the outputs' headers when they carry `key` (pixels untouched)."""
        tags = read_png_tags(self.output_root / self.image_relative)
        if tags.get(INPUT_KEY_TAG) != key or not self._mask_is_current(key):
            return None
        return self._row(tags, decoded=False)

    def process(self) -> ImageRow:
        """Decode the source, resize, write the PNGs and pack the pixels; errors become rows."""
        if self.index_error is not None:
            return self._error_row(self.index_error)
        try:
            return self._process(self.input_key())
        except (DecodeError, OSError, ValueError) as exc:
            return self._error_row(str(exc))

    def _mask_is_current(self, key: str) -> bool:
        return self.mask_relative is None or (
            stored_input_key(self.output_root / self.mask_relative) == key
        )

    def _process(self, key: str) -> ImageRow:
        source = confined(self.source_file, self.source_root)
        decoded = decode_grayscale(source, target_size=self.size)
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
            **content_fingerprints(pixels, geometry),
        }
        write_tagged_png(
            self.output_root / self.image_relative, lambda: Image.fromarray(pixels), key, tags
        )
        self._pack(pixels)
        return self._row(tags, decoded=True)

    def _reuse(self, key: str) -> ImageRow | None:
        """The row from the existing outputs when they carry `key`, else None."""
        try:
            with Image.open(self.output_root / self.image_relative, formats=["PNG"]) as image:
                tags = {k: v for k, v in image.info.items() if isinstance(v, str)}
                if tags.get(INPUT_KEY_TAG) != key or not self._mask_is_current(key):
                    return None
                self._pack(np.asarray(image))
        except (OSError, SyntaxError):
            return None
        return self._row(tags, decoded=False)

    def _pack(self, pixels: np.ndarray) -> None:
        _packed_array(self.packed_file)[self.row] = pixels

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
            perceptual_hash=tags.get("perceptual_hash"),
            pixels_sha256=tags.get("pixels_sha256"),
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


def content_fingerprints(pixels: np.ndarray, geometry: ResizeGeometry) -> dict[str, str]:
    """Perceptual hash of the image without its padding, and a digest of its pixels; kept in
    the PNG header with the input key, so they are recomputed only when the image is."""
    top, left = geometry.pad_top, geometry.pad_left
    content = pixels[top : top + geometry.resized_height, left : left + geometry.resized_width]
    return {"perceptual_hash": perceptual_hash(content), "pixels_sha256": pixels_sha256(pixels)}


@functools.lru_cache(maxsize=2)
def _packed_array(path: Path) -> np.memmap:
    """The partition's packed array, mapped once per worker process.

    Rows are written through the shared mapping without msync: the page cache is shared,
    so the parent sees every row once the workers are done, and renames the file.
    """
    return np.load(path, mmap_mode="r+")


def process_image_job(job: ImageJob) -> ImageRow:
    """Top-level (picklable) entry point for the process pool."""
    return job.process()


def image_job_stopped(job: ImageJob, reason: str) -> ImageRow:
    """The row of a job whose worker was stopped (time limit) or died."""
    return job._error_row(f"{job.source_file}: {reason}")


def build_packed_images(
    jobs: Sequence[ImageJob],
    packed: Path,
    size: int,
    workers: int,
    on_progress: Progress | None = None,
    time_limit: TimeLimit | None = None,
) -> list[ImageRow]:
    """Rows of the partition's images and its packed N×S×S array at `packed`.

    When the array exists and every image's input key equals the one recorded beside it
    (`<name>.keys.json`) and in its PNG, nothing is read beyond file headers. Otherwise the
    array is rebuilt in a temporary file (current PNGs re-used, the rest decoded in the pool)
    and renamed into place, then its keys are recorded.
    """
    keys_file = packed.with_name(packed.name + ".keys.json")
    keys = [_input_key_or_none(job) for job in jobs]
    if packed.exists() and _recorded_keys(keys_file) == keys:
        rows = [job.current_row(key) for job, key in zip(jobs, keys, strict=True)]
        if all(row is not None for row in rows):
            return rows
    temp = temporary_sibling(packed)
    try:
        np.lib.format.open_memmap(
            temp, mode="w+", dtype=np.uint8, shape=(len(jobs), size, size)
        ).flush()
        rows = run_image_jobs(
            [replace(job, packed_file=temp) for job in jobs], workers, on_progress, time_limit
        )
        os.replace(temp, packed)
    finally:
        temp.unlink(missing_ok=True)
    write_atomically(keys_file, lambda path: path.write_text(json.dumps(keys)))
    return rows


def _input_key_or_none(job: ImageJob) -> str | None:
    try:
        return job.input_key()
    except (OSError, ValueError):  # ValueError: a NUL byte in the path
        return None


def _recorded_keys(path: Path) -> list | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def run_image_jobs(
    jobs: Sequence[ImageJob],
    workers: int,
    on_progress: Progress | None = None,
    time_limit: TimeLimit | None = None,
) -> list[ImageRow]:
    """Rows in job order. Verifying unchanged images is cheap and done in this process; only
    the images to decode go to the process pool."""
    reused = [job.reuse() for job in jobs]
    pending = [job for job, row in zip(jobs, reused, strict=True) if row is None]
    processed = iter(
        map_in_chunks(
            process_image_job, pending, workers, on_progress=on_progress, time_limit=time_limit
        )
    )
    return [row if row is not None else next(processed) for row in reused]


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
    "perceptual_hash",
    "pixels_sha256",
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
            "perceptual_hash": "string",
            "pixels_sha256": "string",
            "status": "string",
            "error": "string",
            "decoded": "bool",
        }
    )
