"""Decode a JPEG, PNG or DICOM radiograph into a 2-D uint8 grayscale array, bone bright."""

from __future__ import annotations

import io
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import cv2
import numpy as np
import pydicom
from PIL import Image
from pydicom.dataset import Dataset
from pydicom.encaps import generate_frames
from pydicom.pixels import apply_modality_lut, apply_voi_lut, get_decoder
from pydicom.uid import UID, JPEG2000TransferSyntaxes, JPEGLSTransferSyntaxes

from radharmony_pipeline.processing.geometry import reduce_by_area
from radharmony_pipeline.processing.image_files import ImageFileError, read_grayscale_png
from radharmony_pipeline.processing.source_store import (
    SourcePath,
    as_source_path,
    readable,
)

# Pillow imports its common format plugins on the first open (~6 ms). Done here, at import,
# it happens once in the pool's fork server instead of in every worker it starts.
Image.preinit()

JPEG_SUFFIXES = frozenset({".jpg", ".jpeg"})
PNG_SUFFIX = ".png"
DICOM_SUFFIX = ".dcm"

GREY_MAX = 255

# A reduced-DCT JPEG keeps at least this many pixels per target pixel on the long side, so
# the caller's area resize still averages >= 2x2 decoded pixels into each output pixel and
# smooths out the scaled IDCT's block artefacts. Measured on 2300x2800 and 2021x2022
# radiograph-like JPEGs (quality 90, resized to 224): mean |difference| from a full decode
# is 0.1-0.7 grey levels at margin 2 against 0.4-0.8 at margin 1. Margin 4 gains ~0.1 more
# but holds 4x the pixels; decode time barely differs, as entropy decoding (which no DCT
# scale skips) dominates, so the saving is mostly in memory and in the resize.
DCT_MARGIN = 2

# Without a VOI window, clip this much of each tail before stretching: enough to ignore
# dead or hot detector pixels and burned-in lead markers (~0.5 % of a 3000x2500 image is
# ~37,000 pixels, more than a marker letter), too little to saturate visible anatomy.
ROBUST_PERCENTILES = (0.5, 99.5)
# Percentiles come from a regular subsample of about this many pixels: on a 3000x2500
# image it moves them by well under a stored level. They are read off its histogram, which
# gives np.percentile's exact values without sorting.
PERCENTILE_SAMPLES = 1_000_000

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

GRAYSCALE_PHOTOMETRICS = ("MONOCHROME1", "MONOCHROME2")
# Refuse a DICOM whose header declares more pixel data than this before decoding: a 1 KB
# file may declare 30000x30000 16-bit pixels, which the decoder would allocate (~1.7 GiB)
# before noticing the data is missing. The largest radiographs (~4300x3500 at 16 bits) hold
# ~30 MiB, so 1 GiB leaves room for multi-frame files without letting a bomb through.
MAX_DICOM_PIXEL_BYTES = 1 << 30
# pydicom 3 masks the bits above BitsStored itself except for these syntaxes, whose
# decoders return whatever precision the codestream declares.
UNMASKED_SYNTAXES = frozenset(JPEG2000TransferSyntaxes) | frozenset(JPEGLSTransferSyntaxes)


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
    if suffix not in JPEG_SUFFIXES and suffix not in (PNG_SUFFIX, DICOM_SUFFIX):
        raise DecodeError(path, f"unsupported extension {path.suffix!r}")


def _decode_by_extension(
    path: SourcePath, source: Path | BinaryIO, target_size: int | None
) -> DecodedImage:
    """`path` names the file (extension, errors); `source` is what the parsers read."""
    suffix = path.suffix.lower()
    if suffix in JPEG_SUFFIXES:
        return _decode_jpeg(path, source, target_size)
    if suffix == PNG_SUFFIX:
        return _decode_png(path, source, target_size)
    return _decode_dicom(path, source, target_size)


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
                # (~0.3 ms of a 14 ms decode, same pixels).
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
        # to 2 grey levels from one area resize, and there is no window to save.
        return DecodedImage(pixels, height, width)
    factor = reduction_factor(height, width, target_size)
    # The image's own range, not 0-65535: ReXGradient 16-bit PNGs may use only 12 bits and a
    # fixed shift would leave them nearly black. Taken at full size, before any reduction.
    low, high, _, _ = cv2.minMaxLoc(pixels)
    reduced = reduce_by_area(pixels, factor)
    if not high > low:
        return DecodedImage(np.zeros(reduced.shape, np.uint8), height, width, factor)
    # A linear stretch that never leaves 0-255: one SIMD pass, several times cheaper than a
    # lookup table, equal to stretch_to_uint8 but for ties in rounding.
    scale = GREY_MAX / (high - low)
    stretched = cv2.convertScaleAbs(reduced, alpha=scale, beta=-low * scale)
    return DecodedImage(stretched, height, width, factor)


# --- DICOM ----------------------------------------------------------------------------------


def _bytes_of(source: Path | BinaryIO) -> bytes | None:
    """The in-memory content of an object, None for a local file (read by its path)."""
    return source.getvalue() if isinstance(source, io.BytesIO) else None


def _decode_dicom(
    path: SourcePath, source: Path | BinaryIO, target_size: int | None
) -> DecodedImage:
    ds = _read_dicom(path, source)
    _require_grayscale_pixel_data(ds, path)
    _require_plausible_size(ds, path)
    _require_decodable_syntax(ds, path)
    rows, columns = int(ds.Rows), int(ds.Columns)
    factor = reduction_factor(rows, columns, target_size)
    stored, level_reduction = _stored_values(ds, path, factor)
    if stored.dtype not in LOOKUP_DTYPES:
        return DecodedImage(_presentation_values(ds, stored), rows, columns, level_reduction)
    # Reduce the stored values, then window the few that are left through a table composed
    # once per image: one pass over the full-resolution pixels in all.
    table = _presentation_table(ds, stored)
    area_factor = max(1, factor // level_reduction)
    pixels = through_lookup(reduce_by_area(stored, area_factor), table)
    return DecodedImage(pixels, rows, columns, level_reduction * area_factor)


def _read_dicom(path: SourcePath, source: Path | BinaryIO) -> Dataset:
    try:
        return pydicom.dcmread(source)
    except Exception as error:
        # pydicom's parser raises many unrelated types on corrupt input.
        raise DecodeError(path, f"not a readable DICOM file: {error}") from error


def _require_grayscale_pixel_data(ds: Dataset, path: Path) -> None:
    if "PixelData" not in ds:
        raise DecodeError(path, "DICOM has no (7FE0,0010) Pixel Data")
    photometric = ds.get("PhotometricInterpretation")
    if photometric not in GRAYSCALE_PHOTOMETRICS:
        raise DecodeError(path, f"DICOM PhotometricInterpretation {photometric!r} is not grayscale")


def _require_plausible_size(ds: Dataset, path: Path) -> None:
    """Check Rows × Columns × frames × samples × bits from the header against the limit."""
    try:
        dimensions = [
            int(ds.Rows),
            int(ds.Columns),
            int(ds.get("NumberOfFrames") or 1),
            int(ds.get("SamplesPerPixel") or 1),
        ]
        bits = int(ds.BitsAllocated)
    except (AttributeError, TypeError, ValueError) as error:
        raise DecodeError(path, f"DICOM image size tags are missing or invalid: {error}") from error
    if min(dimensions) < 1 or bits < 1:
        raise DecodeError(path, f"DICOM declares an empty image ({dimensions}, {bits} bits)")
    declared = math.prod(dimensions) * math.ceil(bits / 8)
    if declared > MAX_DICOM_PIXEL_BYTES:
        rows, columns, frames, _samples = dimensions
        raise DecodeError(
            path,
            f"DICOM declares {rows}x{columns} pixels x {frames} frame(s) at {bits} bits "
            f"({declared / 2**30:.1f} GiB), above the {MAX_DICOM_PIXEL_BYTES / 2**30:.0f} GiB "
            "limit; refused before decoding (corrupt header or not a radiograph)",
        )


def _syntax_label(syntax: UID) -> str:
    name = syntax.name if syntax.name != str(syntax) else "unknown"
    return f"transfer syntax {syntax} ({name})"


def _require_decodable_syntax(ds: Dataset, path: Path) -> None:
    """Refuse syntaxes pydicom cannot decode here, naming the UID, before touching pixels."""
    syntax = ds.file_meta.get("TransferSyntaxUID")
    if syntax is None:
        raise DecodeError(path, "DICOM file meta has no (0002,0010) Transfer Syntax UID")
    syntax = UID(syntax)
    try:
        decoder = get_decoder(syntax)
    except NotImplementedError as error:
        raise DecodeError(path, f"unsupported {_syntax_label(syntax)}") from error
    if not decoder.is_available:
        missing = "; ".join(decoder.missing_dependencies)
        raise DecodeError(path, f"unsupported {_syntax_label(syntax)}: no decoder ({missing})")


def _stored_values(ds: Dataset, path: Path, factor: int) -> tuple[np.ndarray, int]:
    """The stored pixel values of a single-frame image, bits above BitsStored cleared, and
    how many times smaller than Rows x Columns they are (a JPEG 2000 resolution level)."""
    reduced = _jpeg2000_reduced(ds, factor)
    if reduced is not None:
        return reduced
    try:
        stored = ds.pixel_array
    except Exception as error:
        # Decoder plugins report corrupt codestreams as RuntimeError, ValueError and others.
        label = _syntax_label(UID(ds.file_meta.TransferSyntaxUID))
        raise DecodeError(path, f"cannot decode {label} pixel data: {error}") from error
    if stored.ndim != 2:
        raise DecodeError(path, f"expected one grayscale frame, got pixel array {stored.shape}")
    return _mask_unused_bits(ds, stored), 1


def _jpeg2000_reduced(ds: Dataset, factor: int) -> tuple[np.ndarray, int] | None:
    """A JPEG 2000 image decoded at the coarsest resolution level within `factor`, or None
    where that does not apply (other syntaxes, several frames, signed values, a codestream
    whose precision exceeds BitsStored and so needs masking first) or fails: the caller then
    decodes the full image, which reports any problem with the data."""
    if (
        factor < 2
        or ds.file_meta.TransferSyntaxUID not in JPEG2000TransferSyntaxes
        or int(ds.get("NumberOfFrames") or 1) != 1
        or ds.PixelRepresentation != 0
    ):
        return None
    try:
        codestream = next(generate_frames(ds.PixelData, number_of_frames=1))
        precision, levels = jpeg2000_precision_and_levels(codestream)
        # The largest power of two in `factor`, so the area reduction finishes it exactly.
        level = min(levels, (factor & -factor).bit_length() - 1)
        if precision > int(ds.BitsStored) or level < 1:
            return None
        with Image.open(io.BytesIO(codestream), formats=["JPEG2000"]) as image:
            image.reduce = level
            image.load()
            container_bits = {"L": 8, "I;16": 16}.get(image.mode)
            if container_bits is None or precision > container_bits:
                return None
            # Pillow scales samples up to fill its container: shift them back.
            stored = np.asarray(image) >> (container_bits - precision)
    except Exception:
        # Pillow and the frame parser raise assorted types on corrupt data; the full decode
        # that follows names the problem.
        return None
    reduction = 1 << level
    expected = (int(ds.Rows) // reduction, int(ds.Columns) // reduction)
    return (stored, reduction) if stored.shape == expected else None


def jpeg2000_precision_and_levels(codestream: bytes) -> tuple[int, int]:
    """Bits per sample of the first component (SIZ) and wavelet decomposition levels (COD)
    from a JPEG 2000 codestream's main header."""
    if codestream[:4] != b"\xff\x4f\xff\x51":
        raise ValueError("not a JPEG 2000 codestream (no SOC, SIZ)")
    # SIZ: marker, Lsiz, Rsiz, 8 four-byte sizes and offsets, Csiz, then Ssiz per component.
    precision = (codestream[42] & 0x7F) + 1
    position = 4 + int.from_bytes(codestream[4:6], "big")
    while position + 4 <= len(codestream):
        marker = codestream[position : position + 2]
        if marker == b"\xff\x52":  # COD: Lcod, Scod, SGcod (4 bytes), then SPcod's levels
            return precision, codestream[position + 9]
        if marker == b"\xff\x90":  # SOT: the main header has ended
            break
        position += 2 + int.from_bytes(codestream[position + 2 : position + 4], "big")
    raise ValueError("JPEG 2000 main header has no COD marker")


def _mask_unused_bits(ds: Dataset, stored: np.ndarray) -> np.ndarray:
    """Clear bits above BitsStored in unsigned data where pydicom 3 leaves them set.

    Native, RLE and JPEG (lossless) data arrive masked already; a JPEG 2000 or JPEG-LS
    codestream whose precision exceeds BitsStored (e.g. overlay bits kept in the high bits
    when an archive recompressed the file) does not.
    """
    bits_stored = int(ds.BitsStored)
    if (
        ds.file_meta.TransferSyntaxUID not in UNMASKED_SYNTAXES
        or ds.PixelRepresentation != 0
        or bits_stored >= stored.dtype.itemsize * 8
    ):
        return stored
    return stored & stored.dtype.type((1 << bits_stored) - 1)


def _presentation_table(ds: Dataset, stored: np.ndarray) -> np.ndarray:
    """Stored values to 0-255 as a viewer shows them, as one table over every value of the
    stored type: modality LUT or rescale, VOI LUT or window (else a robust range of this
    image's values), stretch to 8 bits, MONOCHROME1 inverted so bone is bright."""
    values = apply_modality_lut(lookup_domain(stored.dtype), ds)
    windowed, low, high = _windowed(ds, values, lambda: _robust_range_of(values, stored))
    table = stretch_to_uint8(windowed, low, high)
    return GREY_MAX - table if ds.PhotometricInterpretation == "MONOCHROME1" else table


def _presentation_values(ds: Dataset, stored: np.ndarray) -> np.ndarray:
    """The same mapping as _presentation_table, over the pixels themselves (32-bit or float
    data, which no table covers)."""
    values = apply_modality_lut(stored, ds)
    windowed, low, high = _windowed(ds, values, lambda: _robust_range(values))
    pixels = stretch_to_uint8(windowed, low, high)
    return GREY_MAX - pixels if ds.PhotometricInterpretation == "MONOCHROME1" else pixels


def _windowed(
    ds: Dataset, values: np.ndarray, robust_range: Callable[[], tuple[float, float]]
) -> tuple[np.ndarray, float, float]:
    """The values after the file's VOI LUT or window, and the range that spans 0-255.

    Without a usable VOI the range is `robust_range()`, a robust min-max of the image.
    """
    if _has_voi_lut(ds) or _has_window(ds):
        try:
            return _apply_voi(ds, values)
        except ValueError:
            # A zero window width or an unknown VOI LUT Function: the tags are unusable, but
            # the pixels are fine, so fall back to the image's own range.
            pass
    low, high = robust_range()
    return values, low, high


def _has_voi_lut(ds: Dataset) -> bool:
    items = ds.get("VOILUTSequence")
    return bool(items) and "LUTDescriptor" in items[0] and "LUTData" in items[0]


def _has_window(ds: Dataset) -> bool:
    return ds.get("WindowCenter") is not None and ds.get("WindowWidth") is not None


def _apply_voi(ds: Dataset, values: np.ndarray) -> tuple[np.ndarray, float, float]:
    # Same precedence as pydicom's apply_voi_lut: the LUT wins when both are present.
    if _has_voi_lut(ds):
        # LUT entries are indexed by integer modality values; rescaled floats must round.
        values = np.rint(values).astype(np.int64)
    windowed = apply_voi_lut(values, ds, index=0)
    low, high = _voi_output_range(ds)
    return windowed, low, high


def _voi_output_range(ds: Dataset) -> tuple[float, float]:
    """What the VOI maps the lowest and highest possible inputs to, found by applying it.

    For a window that is pydicom's BitsStored-derived output range, so 0-255 spans exactly
    the window; for a LUT it is the LUT's own value range, which some files declare as 16
    bits while filling only 12.
    """
    if _has_voi_lut(ds):
        entries, first_mapped = ds.VOILUTSequence[0].LUTDescriptor[:2]
        probe = np.arange(first_mapped, first_mapped + (entries or 2**16), dtype=np.int64)
    else:
        probe = np.array([-np.inf, np.inf])
    mapped = apply_voi_lut(probe, ds, index=0)
    return float(mapped.min()), float(mapped.max())


def _percentile_sample(pixels: np.ndarray) -> np.ndarray:
    stride = max(1, math.isqrt(pixels.size // PERCENTILE_SAMPLES))
    return pixels[::stride, ::stride]


def _robust_range(values: np.ndarray) -> tuple[float, float]:
    low, high = np.percentile(_percentile_sample(values), ROBUST_PERCENTILES)
    return float(low), float(high)


def _robust_range_of(table_values: np.ndarray, stored: np.ndarray) -> tuple[float, float]:
    """ROBUST_PERCENTILES of the image's modality values, where `table_values[i]` is the
    modality value of the stored value with bit pattern i: read off a histogram of the
    stored values, exactly as np.percentile (linear) would find them on the values."""
    sample = _percentile_sample(stored).view(LOOKUP_DTYPES[stored.dtype])
    counts = np.bincount(sample.ravel(), minlength=table_values.size)
    present = np.flatnonzero(counts)
    order = np.argsort(table_values[present], kind="stable")
    sorted_values = np.asarray(table_values[present][order], dtype=np.float64)
    cumulative = np.cumsum(counts[present][order])
    last = int(cumulative[-1]) - 1

    def at_rank(rank: int) -> float:
        return float(sorted_values[np.searchsorted(cumulative, rank, side="right")])

    cut_points = []
    for percentile in ROBUST_PERCENTILES:
        position = last * percentile / 100
        below = math.floor(position)
        low_value, high_value = at_rank(below), at_rank(min(below + 1, last))
        cut_points.append(low_value + (position - below) * (high_value - low_value))
    return cut_points[0], cut_points[1]
