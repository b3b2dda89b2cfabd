"""Decode a JPEG, PNG or DICOM radiograph into a 2-D uint8 grayscale array, bone bright."""

from __future__ import annotations

import io
import math
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import cv2
import numpy as np
from PIL import Image

from radharmony_pipeline.processing.imaging.geometry import (
    reduce_by_area,
    reduce_with_partial_blocks,
)
from radharmony_pipeline.processing.imaging.heap import keep_freed_image_buffers
from radharmony_pipeline.processing.imaging.image_files import ImageFileError, read_grayscale_png
from radharmony_pipeline.processing.storage.source_store import (
    NotARegularFile,
    SourcePath,
    as_source_path,
    readable,
)
from radharmony_pipeline.vocabulary import FORMAT_BY_SUFFIX, suffixes_of

# Pillow imports its common format plugins on the first open (~6 ms). Done here, at import,
# it happens once in the pool's fork server instead of in every worker it starts.
Image.preinit()
# Likewise once per process tree: freed pixel buffers stay mapped for the next image.
keep_freed_image_buffers()
# The pool's processes are the parallelism, one per core: OpenCV's own threads on top only
# contend for the same cores, and cost CPU to hand out and join work on small images.
cv2.setNumThreads(1)

JPEG_SUFFIXES = suffixes_of("jpg")
PNG_SUFFIXES = suffixes_of("png")

GREY_MAX = 255

# A reduced-DCT JPEG keeps at least this many pixels per target pixel on the long side, so
# the caller's area resize still averages >= 2x2 decoded pixels into each output pixel and
# smooths out the scaled IDCT's block artefacts. Measured on 2300x2800 and 2021x2022
# radiograph-like JPEGs (quality 90, resized to 224): mean |difference| from a full decode
# is 0.1-0.7 grey levels at margin 2 against 0.4-0.8 at margin 1. Margin 4 gains ~0.1 more
# but holds 4x the pixels; decode time barely differs, as entropy decoding (which no DCT
# scale skips) dominates, so the saving is mostly in memory and in the resize.
DCT_MARGIN = 2

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


def decode_grayscale(
    path: SourcePath, target_size: int | None = None, content: bytes | None = None
) -> DecodedImage:
    """Decode a .jpg/.jpeg, .png or .dcm file (by extension) to 2-D uint8, bone bright.

    `target_size` is the long side the caller will resize to; a JPEG much larger than that
    is decoded at a reduced DCT scale, keeping at least DCT_MARGIN x target_size pixels, and
    a PNG or DICOM is reduced by a whole factor (see REDUCTION_MARGIN) before windowing.
    `content` is the file's bytes when the caller already read them (an object on a store);
    otherwise the file is opened here. Every problem with the file raises DecodeError.
    """
    path = as_source_path(path)
    if target_size is not None and target_size < 1:
        raise ValueError(f"target_size must be a positive number of pixels, got {target_size}")
    _require_known_extension(path)
    try:
        # A local file is opened by its path; an object is read once, in full.
        source = readable(path, content)
    except FileNotFoundError as error:
        raise DecodeError(path, "file not found") from error
    except NotARegularFile as error:  # a FIFO, socket or device: never opened
        raise DecodeError(path, error.reason) from error
    except OSError as error:  # e.g. access denied to the object
        raise DecodeError(path, f"cannot read: {error}") from error
    try:
        return _decode_by_extension(path, source, target_size)
    except (DecodeError, MemoryError):
        # Running out of memory says nothing about the file; let the caller see it.
        raise
    except Exception as error:
        # Safety net: Pillow, pydicom and the pylibjpeg plugins raise assorted types on
        # corrupt input, and one bad file must never take the caller down.
        raise DecodeError(path, f"cannot decode: {error!r}") from error


def _require_known_extension(path: SourcePath) -> None:
    suffix = path.suffix.lower()
    if suffix not in FORMAT_BY_SUFFIX:
        raise DecodeError(path, f"unsupported extension {path.suffix!r}")


def _decode_by_extension(
    path: SourcePath, source: Path | BinaryIO, target_size: int | None
) -> DecodedImage:
    """`path` names the file (extension, errors); `source` is what the parsers read."""
    suffix = path.suffix.lower()
    if suffix in JPEG_SUFFIXES:
        return _decode_jpeg(path, source, target_size)
    if suffix in PNG_SUFFIXES:
        return _decode_png(path, source, target_size)
    # Imported here: pydicom takes ~0.3 s to import, which every process loading the
    # definitions (CLI, webserver, steps without DICOM) would otherwise pay.
    from radharmony_pipeline.processing.imaging.dicom_decode import decode_dicom

    return decode_dicom(path, source, target_size)


# --- shared ---------------------------------------------------------------------------------


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


# --- JPEG -----------------------------------------------------------------------------------


def _draft_request(width: int, height: int, target_size: int | None) -> tuple[int, int]:
    """The size to ask Image.draft for: it picks the largest DCT scale staying at least this."""
    if target_size is None:
        return width, height
    shrink = min(1.0, DCT_MARGIN * target_size / max(width, height))
    return math.ceil(width * shrink), math.ceil(height * shrink)


def _decode_jpeg(
    path: SourcePath, source: Path | BinaryIO, target_size: int | None
) -> DecodedImage:
    try:
        with Image.open(source, formats=["JPEG"]) as image:
            if isinstance(source, io.BytesIO):
                # Pillow feeds libjpeg 64 KiB at a time, and each refill suspends the decoder
                # and copies the unread tail; bytes already in memory go in as one block
                # (same pixels, less copying).
                image.decodermaxblock = source.getbuffer().nbytes
            width, height = image.size
            # Asking for "L" lets libjpeg emit the luma channel directly for colour JPEGs.
            drafted = image.draft("L", _draft_request(width, height, target_size))
            # draft's box is the full image in reduced pixels: width / box width = scale.
            dct_scale = 1 if drafted is None else round(width / drafted[1][2])
            image.load()
            grey = image if image.mode == "L" else image.convert("L")
            pixels = np.array(grey, dtype=np.uint8)  # a writable copy
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as error:
        raise DecodeError(path, f"cannot decode JPEG: {error}") from error
    return DecodedImage(pixels, height, width, reduction=dct_scale)


# --- PNG ------------------------------------------------------------------------------------


def _decode_png(path: SourcePath, source: Path | BinaryIO, target_size: int | None) -> DecodedImage:
    try:
        pixels, _mode = read_grayscale_png(path, _bytes_of(source))
    except ImageFileError as error:
        raise DecodeError(path, error.reason) from error
    height, width = pixels.shape
    if pixels.dtype == np.uint8:
        # Not reduced: a mean rounded to 8 bits, then resized and rounded again, strays up
        # to 3 grey levels from one area resize (the outputs' ±1 contract), and there is no
        # window to save.
        return DecodedImage(pixels, height, width)
    # The image's own range, not 0-65535: ReXGradient 16-bit PNGs may use only 12 bits and a
    # fixed shift would leave them nearly black. Taken at full size, before any reduction.
    low, high, _, _ = cv2.minMaxLoc(pixels)
    reduced, factor = reduce_stored_values(pixels, target_size)
    if not high > low:
        return DecodedImage(np.zeros(reduced.shape, np.uint8), height, width, factor)
    # A linear stretch that never leaves 0-255: one SIMD pass, several times cheaper than a
    # lookup table, equal to stretch_to_uint8 but for ties in rounding.
    scale = GREY_MAX / (high - low)
    stretched = cv2.convertScaleAbs(reduced, alpha=scale, beta=-low * scale)
    return DecodedImage(stretched, height, width, factor)


def _bytes_of(source: Path | BinaryIO) -> bytes | None:
    """The in-memory content of an object, None for a local file (read by its path)."""
    return source.getvalue() if isinstance(source, io.BytesIO) else None
