"""Binary masks from COCO RLEs (CheXlocalize) and pixel polygons (ChestX-Det), and mask PNGs."""

from __future__ import annotations

import hashlib
import io
from collections.abc import Mapping, Sequence
from pathlib import Path

import cv2
import numpy as np
from PIL import Image
from pycocotools import mask as coco_mask

from radharmony_pipeline.processing.annotations.rle_text import validate_rle
from radharmony_pipeline.processing.imaging.tagged_png import (
    mask_png,
    tagged_png_bytes,
    write_tagged_png,
)
from radharmony_pipeline.processing.storage.store import open_for_reading

INPUT_KEY_HEX_DIGITS = 16  # 64 bits: collisions are negligible for a per-mask change check
MASK_FOREGROUND = 255


class MaskSizeError(ValueError):
    """An RLE's size does not match the image it is supposed to cover."""


# --- COCO RLE ------------------------------------------------------------------------------


def _coco_rle(rle: Mapping) -> dict:
    """The RLE as pycocotools expects it: integer size, bytes counts (JSON gives str).

    Validated first: pycocotools loops forever on some malformed text (see rle_text).
    """
    height, width = validate_rle(rle)
    counts = rle["counts"]
    if isinstance(counts, str):
        counts = counts.encode("ascii")
    return {"size": [height, width], "counts": counts}


def _rle_size(rle: Mapping) -> tuple[int, int]:
    height, width = rle["size"]
    return int(height), int(width)


def decode_rle(rle: Mapping) -> np.ndarray:
    """One compressed COCO RLE as a uint8 0/1 array of shape (h, w).

    The array is Fortran-ordered, as pycocotools decodes it; copying to C order would cost as
    much as the decode itself, so callers that need C order use np.ascontiguousarray.
    """
    return coco_mask.decode(_coco_rle(rle))


def rle_area(rle: Mapping) -> int:
    """Foreground pixel count, computed from the run lengths without decoding."""
    return int(coco_mask.area(_coco_rle(rle)))


def _check_sizes(rles: Sequence[dict], height: int, width: int) -> None:
    for index, rle in enumerate(rles):
        size = _rle_size(rle)
        if size != (height, width):
            raise MaskSizeError(
                f"RLE {index} has size {size} but the image is {(height, width)} (height, width)"
            )


def union_rle_masks(rles: Sequence[Mapping], height: int, width: int) -> np.ndarray:
    """The union of RLEs of one image as a uint8 0/1 (height, width) array.

    Merging in run-length space and decoding once is about 10x faster than decoding every
    mask. pycocotools silently returns an empty RLE for mismatched sizes, hence the check.
    """
    coco_rles = [_coco_rle(rle) for rle in rles]
    _check_sizes(coco_rles, height, width)
    if not coco_rles:
        return np.zeros((height, width), dtype=np.uint8)
    return coco_mask.decode(coco_mask.merge(coco_rles, intersect=0))


# --- polygons ------------------------------------------------------------------------------


def polygon_problem(polygon: object, height: int, width: int) -> str | None:
    """Why a polygon cannot be rasterized in a height × width frame; None if it can."""
    try:
        _polygon_vertices(polygon, 0, height, width)
    except ValueError as error:
        return str(error).removeprefix("polygon 0 ")
    return None


def _polygon_vertices(
    polygon: Sequence[Sequence[int | float]], index: int, height: int, width: int
) -> np.ndarray:
    """The vertices as an (n, 2) int32 array of (x, y), rounded to the nearest pixel.

    Checked in float space before the integer cast: a coordinate beyond int32 would wrap
    around, and OpenCV's fixed-point filling wraps far sooner, drawing a wrong mask.
    """
    try:
        vertices = np.asarray(polygon, dtype=np.float64)
    except (TypeError, ValueError) as error:
        raise ValueError(f"polygon {index} is not a list of (x, y) points: {error}") from error
    if vertices.ndim != 2 or vertices.shape[1] != 2:
        raise ValueError(f"polygon {index} is not a list of (x, y) points: shape {vertices.shape}")
    if len(vertices) < 3:
        raise ValueError(f"polygon {index} has {len(vertices)} points; a polygon needs at least 3")
    if not np.isfinite(vertices).all():
        raise ValueError(f"polygon {index} has a non-finite coordinate")
    # Up to one frame beyond each edge is an annotation reaching past the image (clipped by
    # the fill); farther is a corrupt coordinate.
    limits = np.array([width, height], dtype=np.float64)
    far = (vertices < -limits) | (vertices > 2 * limits)
    if far.any():
        vertex = int(np.flatnonzero(far.any(axis=1))[0])
        raise ValueError(
            f"polygon {index} vertex {vertex} {vertices[vertex].tolist()} lies far outside "
            f"the {width}x{height} frame"
        )
    return np.rint(vertices).astype(np.int32)


def rasterize_polygons(
    polygons: Sequence[Sequence[Sequence[int | float]]], height: int, width: int
) -> np.ndarray:
    """The union of filled polygons as a uint8 0/1 (height, width) array.

    Pixel convention (ChestX-Det's integer pixel coordinates): a vertex at (x, y) covers the
    pixel in column x, row y, and the boundary is inside the mask, so the rectangle with
    corners (x0, y0) and (x1, y1) covers columns x0..x1 and rows y0..y1 inclusive.
    Non-integer coordinates are rounded to the nearest pixel; parts outside the frame are
    clipped.
    """
    vertices = [
        _polygon_vertices(polygon, index, height, width) for index, polygon in enumerate(polygons)
    ]
    mask = np.zeros((height, width), dtype=np.uint8)
    for polygon in vertices:
        # One fillPoly per polygon: a single call with several polygons fills by the even-odd
        # rule, which would punch a hole wherever two instances of a class overlap.
        cv2.fillPoly(mask, [polygon], 1)
    return mask


def area_fraction(mask: np.ndarray) -> float:
    """Foreground pixels over all pixels."""
    if mask.size == 0:
        raise ValueError("an empty mask has no area fraction")
    return np.count_nonzero(mask) / mask.size


# --- mask PNGs -----------------------------------------------------------------------------


def mask_input_key(*parts: str | bytes) -> str:
    """A short sha256 hex digest of everything a mask is computed from."""
    digest = hashlib.sha256()
    for part in parts:
        data = part.encode("utf-8") if isinstance(part, str) else bytes(part)
        # Length-prefix each part so ("ab", "c") and ("a", "bc") give different keys.
        digest.update(len(data).to_bytes(8, "big"))
        digest.update(data)
    return digest.hexdigest()[:INPUT_KEY_HEX_DIGITS]


def _mask_pixels(mask: np.ndarray) -> np.ndarray:
    if mask.ndim != 2:
        raise ValueError(f"a mask is 2-D, got shape {mask.shape}")
    if mask.dtype != np.bool_:
        invalid = np.count_nonzero((mask != 0) & (mask != 1))
        if invalid:
            raise ValueError(f"a mask holds 0 and 1 only; {invalid:,} pixels hold other values")
    foreground = np.ascontiguousarray(mask != 0)
    return foreground.view(np.uint8) * np.uint8(MASK_FOREGROUND)


def write_mask_png(path: Path, mask: np.ndarray, input_key: str, absent: bool = False) -> bool:
    """Write the mask as a 0/255 grayscale PNG tagged with `input_key`; False if skipped.

    A file already tagged with the same key is left untouched (its mtime too), so masks
    whose inputs did not change are never rewritten. `absent`: the caller knows there is no
    file yet (write_tagged_png), so none is read to compare keys.
    """
    return write_tagged_png(
        path, lambda: _mask_pixels(mask), input_key, encode=mask_png, absent=absent
    )


def mask_png_bytes(mask: np.ndarray, input_key: str) -> bytes:
    """The bytes write_mask_png writes for `mask` and `input_key`."""
    return tagged_png_bytes(_mask_pixels(mask), input_key, encode=mask_png)


def read_mask_png(path: Path, content: bytes | None = None) -> np.ndarray:
    """A mask PNG written by write_mask_png as a uint8 0/1 array. `content`: the file's
    bytes when the caller has read them already (for its key too), so it is not read again;
    `path` then only names it in errors."""
    opened = open_for_reading(path) if content is None else io.BytesIO(content)
    with opened as handle, Image.open(handle, formats=["PNG"]) as image:
        if image.mode != "L":
            raise ValueError(f"{path}: a mask PNG is mode L, got {image.mode}")
        pixels = np.asarray(image)
    invalid = np.count_nonzero((pixels != 0) & (pixels != MASK_FOREGROUND))
    if invalid:
        raise ValueError(f"{path}: {invalid:,} pixels are neither 0 nor {MASK_FOREGROUND}")
    return (pixels == MASK_FOREGROUND).astype(np.uint8)
