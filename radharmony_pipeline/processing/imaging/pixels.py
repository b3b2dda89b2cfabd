"""What decode.py and dicom_decode.py share: the decoded image and its error, and the pixel
helpers (whole-factor reduction of stored values, lookup tables over a type's values, the
linear stretch to 8 bits)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from radharmony_pipeline.processing.imaging.geometry import (
    reduce_by_area,
    reduce_with_partial_blocks,
)
from radharmony_pipeline.processing.storage.source_store import SourcePath

GREY_MAX = 255

# A 16-bit PNG or a DICOM much larger than the target is first shrunk by a whole factor
# dividing both sides (area mean of stored values, or a JPEG 2000 resolution level), keeping
# at least this many pixels per target pixel on the short side; the caller's resize then
# averages the rest. A whole factor is OpenCV's fast area path and leaves few pixels for the
# window lookup table. Measured on 3056x2544 and 2000x1700 noisy radiographs at 224:
# at >= 2 pixels per target pixel the result is within one grey level of one area resize
# from full size; at 1.5, up to 2; a factor that does not divide the sides shifts the
# content by a fraction of a pixel and differs by up to 7-15 grey levels at edges, so the
# sides must be divisible (else nothing is reduced).
REDUCTION_MARGIN = 2
# Stored values of these types are windowed through a lookup table over every value the type
# holds; others (32-bit, float) take the general path over the whole array.
LOOKUP_DTYPES = {np.dtype(np.uint8): np.uint8, np.dtype(np.uint16): np.uint16,
                 np.dtype(np.int8): np.uint8, np.dtype(np.int16): np.uint16}  # fmt: skip


class DecodeError(ValueError):
    """A radiograph file is missing, truncated, corrupt or stored in a form we cannot decode."""

    def __init__(self, path: SourcePath, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


@dataclass(frozen=True, eq=False)  # eq=False: comparing ndarray fields has no single truth
class DecodedImage:
    """A decoded radiograph and the full-resolution size of the file it came from."""

    pixels: np.ndarray  # 2-D uint8, bone bright
    source_height: int
    source_width: int
    # How many times smaller than the source the pixels are on each side (rounded up): a
    # JPEG's reduced-DCT scale, a JPEG 2000 resolution level's 2**level, or a whole-factor
    # area reduction of PNG and DICOM pixels; 1 at full resolution.
    reduction: int = 1


def stretch_to_uint8(values: np.ndarray, low: float, high: float) -> np.ndarray:
    """Map [low, high] linearly onto 0-255, saturating outside; flat images become 0."""
    if not high > low:
        return np.zeros(values.shape, dtype=np.uint8)
    scaled = (values.astype(np.float32) - np.float32(low)) * np.float32(GREY_MAX / (high - low))
    return np.rint(np.clip(scaled, 0, GREY_MAX)).astype(np.uint8)


def reduction_factor(height: int, width: int, target_size: int | None) -> int:
    """The largest whole factor dividing both sides that still leaves REDUCTION_MARGIN x
    `target_size` pixels on the short side; 1 when there is none (or no target)."""
    if target_size is None:
        return 1
    largest = math.floor(min(height, width) / (REDUCTION_MARGIN * target_size))
    common = math.gcd(height, width)
    return next((k for k in range(largest, 1, -1) if common % k == 0), 1)


def uneven_reduction_factor(height: int, width: int, target_size: int | None) -> int:
    """For sides without a common factor (e.g. 3050 x 2539): the largest power of two within
    the same REDUCTION_MARGIN, with a narrower last block on each side it does not divide; 1
    when none leaves the margin (or no target). Powers of two take OpenCV's halving path,
    where whole blocks of another factor cost several times as much: far more than a second
    side of partial blocks (benchmarks/README.md)."""
    if target_size is None:
        return 1
    largest = math.floor(min(height, width) / (REDUCTION_MARGIN * target_size))
    return 1 << (largest.bit_length() - 1) if largest >= 2 else 1


def reduce_stored_values(pixels: np.ndarray, target_size: int | None) -> tuple[np.ndarray, int]:
    """Stored values (before windowing) shrunk by a whole factor when much larger than
    `target_size`, and that factor: one dividing both sides where there is one, else one
    with a narrower last block on each side it does not divide (a general area resize of the
    full image costs about ten times more)."""
    height, width = pixels.shape
    factor = reduction_factor(height, width, target_size)
    if factor > 1:
        return reduce_by_area(pixels, factor), factor
    factor = uneven_reduction_factor(height, width, target_size)
    return reduce_with_partial_blocks(pixels, factor), factor


def through_lookup(stored: np.ndarray, table: np.ndarray) -> np.ndarray:
    """`table[v]` for every stored value v; signed values index by their bit pattern, so the
    table lists the type's values in that order (see lookup_domain)."""
    return np.take(table, stored.view(LOOKUP_DTYPES[stored.dtype]))


def lookup_domain(dtype: np.dtype) -> np.ndarray:
    """Every value of an 8- or 16-bit integer type, ordered by bit pattern (0, 1, ..., -1)."""
    index_type = LOOKUP_DTYPES[np.dtype(dtype)]
    return np.arange(np.iinfo(index_type).max + 1, dtype=index_type).view(dtype)
