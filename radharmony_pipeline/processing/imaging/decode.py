"""Decode a JPEG, PNG or DICOM radiograph into a 2-D uint8 grayscale array, bone bright."""

from __future__ import annotations

import io
import math
from pathlib import Path
from typing import BinaryIO

import cv2
import numpy as np
from PIL import Image

from radharmony_pipeline.processing.imaging.heap import keep_freed_image_buffers
from radharmony_pipeline.processing.imaging.image_files import ImageFileError, read_grayscale_png
from radharmony_pipeline.processing.imaging.pixels import (
    GREY_MAX,
    DecodedImage,
    DecodeError,
    reduce_stored_values,
)
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

# A reduced-DCT JPEG keeps at least this many pixels per target pixel on the long side, so
# the caller's area resize still averages >= 2x2 decoded pixels into each output pixel and
# smooths out the scaled IDCT's block artefacts. Measured on 2300x2800 and 2021x2022
# radiograph-like JPEGs (quality 90, resized to 224): mean |difference| from a full decode
# is 0.1-0.7 grey levels at margin 2 against 0.4-0.8 at margin 1. Margin 4 gains ~0.1 more
# but holds 4x the pixels; decode time barely differs, as entropy decoding (which no DCT
# scale skips) dominates, so the saving is mostly in memory and in the resize.
DCT_MARGIN = 2


def decode_grayscale(
    path: SourcePath, target_size: int | None = None, content: bytes | None = None
) -> DecodedImage:
    """Decode a .jpg/.jpeg, .png or .dcm file (by extension) to 2-D uint8, bone bright.

    `target_size` is the long side the caller will resize to; a JPEG much larger than that
    is decoded at a reduced DCT scale, keeping at least DCT_MARGIN x target_size pixels, and
    a PNG or DICOM is reduced by a whole factor (see pixels.REDUCTION_MARGIN) before windowing.
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
    # definitions (CLI, webserver, steps without DICOM) would otherwise pay. Not a cycle:
    # dicom_decode takes what it shares with this module from pixels.py.
    from radharmony_pipeline.processing.imaging.dicom_decode import decode_dicom

    return decode_dicom(path, source, target_size)


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
