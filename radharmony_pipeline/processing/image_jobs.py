"""Per-image work of the `images` stage: decode, resize through a recorded geometry, write.

Each job writes the resized image (and its resized union mask) as PNGs tagged with a key of
their inputs, and its pixels into row `row` of the partition's packed array. A job whose
outputs carry the current key re-uses them: it reads the small resized PNG instead of
decoding the source again.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from PIL import Image

from .decode import DecodeError, decode_grayscale
from .fingerprint import file_sha256
from .geometry import ResizeGeometry, resize_image, resize_mask
from .masks import mask_input_key, read_mask_png, write_mask_png
from .tagged_png import INPUT_KEY_TAG, read_png_tags, stored_input_key, write_tagged_png

# Bumped when decoding or resizing changes, so every image is redone once.
IMAGE_CODE_VERSION = "1"
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
    union_mask_file: Path | None
    output_root: Path
    image_relative: str
    mask_relative: str | None
    size: int
    geometry_of: GeometryFunction
    packed_file: Path
    row: int

    @property
    def resize_mode(self) -> str:
        return self.geometry_of.__name__.removesuffix("_geometry")

    def input_key(self) -> str:
        """Source fingerprint (size + mtime), union-mask key and parameters."""
        stat = os.stat(self.source_file)
        mask_key = stored_input_key(self.union_mask_file) if self.union_mask_file else ""
        return mask_input_key(
            IMAGE_CODE_VERSION, f"{stat.st_size}:{stat.st_mtime_ns}", mask_key or "",
            str(self.size), self.geometry_of.__name__,
        )

    def run(self) -> ImageRow:
        try:
            key = self.input_key()
            tags = read_png_tags(self.output_root / self.image_relative)
            reusable = tags.get(INPUT_KEY_TAG) == key and self._mask_is_current(key)
            row = self._reuse(tags) if reusable else self._process(key)
        except (DecodeError, OSError, ValueError) as exc:
            return self._error_row(str(exc))
        return row

    def _mask_is_current(self, key: str) -> bool:
        return self.mask_relative is None or (
            stored_input_key(self.output_root / self.mask_relative) == key
        )

    def _process(self, key: str) -> ImageRow:
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
        write_tagged_png(self.output_root / self.image_relative, Image.fromarray(pixels), key,
                         tags)
        self._pack(pixels)
        return self._row(tags, decoded=True)

    def _reuse(self, tags: dict[str, str]) -> ImageRow:
        with Image.open(self.output_root / self.image_relative) as image:
            self._pack(np.asarray(image))
        return self._row(tags, decoded=False)

    def _pack(self, pixels: np.ndarray) -> None:
        packed = np.load(self.packed_file, mmap_mode="r+")
        packed[self.row] = pixels
        packed.flush()
        del packed

    def _row(self, tags: dict[str, str], decoded: bool) -> ImageRow:
        return ImageRow(
            image_id=self.image_id, image_path=self.image_relative,
            mask_path=self.mask_relative, size=self.size,
            orig_height=int(tags["orig_height"]), orig_width=int(tags["orig_width"]),
            scale=float(tags["scale"]), pad_top=int(tags["pad_top"]),
            pad_left=int(tags["pad_left"]), tensor_index=self.row,
            source_sha256=tags["source_sha256"], resize=self.resize_mode, decoded=decoded,
        )

    def _error_row(self, message: str) -> ImageRow:
        return ImageRow(
            image_id=self.image_id, image_path=None, mask_path=None, size=self.size,
            orig_height=None, orig_width=None, scale=None, pad_top=None, pad_left=None,
            tensor_index=self.row, source_sha256=None, resize=self.resize_mode, status="error",
            error=message,
        )


def run_image_job(job: ImageJob) -> ImageRow:
    """Top-level (picklable) entry point for the process pool."""
    return job.run()


IMAGE_COLUMNS = ("image_id", "image_path", "mask_path", "size", "orig_height", "orig_width",
                 "scale", "pad_top", "pad_left", "tensor_index", "source_sha256", "resize",
                 "status", "error", "decoded")


def image_table(rows: Sequence[ImageRow]) -> pd.DataFrame:
    """The `images` table (DESIGN §4; `decoded` says whether the source was decoded)."""
    frame = pd.DataFrame([asdict(row) for row in rows], columns=list(IMAGE_COLUMNS))
    return frame.astype({
        "image_id": "string", "image_path": "string", "mask_path": "string", "size": "int64",
        "orig_height": "Int64", "orig_width": "Int64", "scale": "float64", "pad_top": "Int64",
        "pad_left": "Int64", "tensor_index": "int64", "source_sha256": "string", "resize": "string",
        "status": "string", "error": "string", "decoded": "bool",
    })
