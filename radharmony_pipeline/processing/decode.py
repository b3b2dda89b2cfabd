"""Decode a JPEG, PNG or DICOM radiograph into a 2-D uint8 grayscale array, bone bright."""

from __future__ import annotations

import io
import math
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np
import pydicom
from PIL import Image
from pydicom.dataset import Dataset
from pydicom.pixels import apply_modality_lut, apply_voi_lut, get_decoder
from pydicom.uid import UID, JPEG2000TransferSyntaxes, JPEGLSTransferSyntaxes

from radharmony_pipeline.processing.image_files import ImageFileError, read_grayscale_png
from radharmony_pipeline.processing.source_store import (
    NotARegularFile,
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
# image it moves them by well under a stored level and is ~6x faster than the full sort.
PERCENTILE_SAMPLES = 1_000_000

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
    dct_scale: int = 1  # libjpeg reduced-DCT factor (1, 2, 4 or 8); 1 for non-JPEG


def decode_grayscale(
    path: SourcePath, target_size: int | None = None, content: bytes | None = None
) -> DecodedImage:
    """Decode a .jpg/.jpeg, .png or .dcm file (by extension) to 2-D uint8, bone bright.

    `target_size` is the long side the caller will resize to; a JPEG much larger than that
    is decoded at a reduced DCT scale, keeping at least DCT_MARGIN x target_size pixels.
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
        return _decode_png(path, source)
    return _decode_dicom(path, source)


# --- shared ---------------------------------------------------------------------------------


def stretch_to_uint8(values: np.ndarray, low: float, high: float) -> np.ndarray:
    """Map [low, high] linearly onto 0-255, saturating outside; flat images become 0."""
    if not high > low:
        return np.zeros(values.shape, dtype=np.uint8)
    scaled = (values.astype(np.float32) - np.float32(low)) * np.float32(GREY_MAX / (high - low))
    return np.rint(np.clip(scaled, 0, GREY_MAX)).astype(np.uint8)


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
    return DecodedImage(pixels, height, width, dct_scale)


# --- PNG ------------------------------------------------------------------------------------


def _decode_png(path: SourcePath, source: Path | BinaryIO) -> DecodedImage:
    try:
        pixels, _mode = read_grayscale_png(path, _bytes_of(source))
    except ImageFileError as error:
        raise DecodeError(path, error.reason) from error
    if pixels.dtype != np.uint8:
        # The image's own range, not 0-65535: ReXGradient 16-bit PNGs may use only 12 bits
        # and a fixed shift would leave them nearly black.
        pixels = stretch_to_uint8(pixels, float(pixels.min()), float(pixels.max()))
    return DecodedImage(pixels, *pixels.shape)


# --- DICOM ----------------------------------------------------------------------------------


def _bytes_of(source: Path | BinaryIO) -> bytes | None:
    """The in-memory content of an object, None for a local file (read by its path)."""
    return source.getvalue() if isinstance(source, io.BytesIO) else None


def _decode_dicom(path: SourcePath, source: Path | BinaryIO) -> DecodedImage:
    ds = _read_dicom(path, source)
    _require_grayscale_pixel_data(ds, path)
    _require_plausible_size(ds, path)
    _require_decodable_syntax(ds, path)
    stored = _stored_values(ds, path)
    pixels = _presentation_values(ds, stored)
    return DecodedImage(pixels, *stored.shape)


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


def _stored_values(ds: Dataset, path: Path) -> np.ndarray:
    """The stored pixel values of a single-frame image, bits above BitsStored cleared."""
    try:
        stored = ds.pixel_array
    except Exception as error:
        # Decoder plugins report corrupt codestreams as RuntimeError, ValueError and others.
        label = _syntax_label(UID(ds.file_meta.TransferSyntaxUID))
        raise DecodeError(path, f"cannot decode {label} pixel data: {error}") from error
    if stored.ndim != 2:
        raise DecodeError(path, f"expected one grayscale frame, got pixel array {stored.shape}")
    return _mask_unused_bits(ds, stored)


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


def _presentation_values(ds: Dataset, stored: np.ndarray) -> np.ndarray:
    """Stored values to 0-255 as a viewer would show them: modality LUT, VOI, polarity."""
    values = apply_modality_lut(stored, ds)
    values, low, high = _windowed(ds, values)
    pixels = stretch_to_uint8(values, low, high)
    if ds.PhotometricInterpretation == "MONOCHROME1":
        # MONOCHROME1 shows low values bright; invert so bone is bright in every output.
        pixels = GREY_MAX - pixels
    return pixels


def _windowed(ds: Dataset, values: np.ndarray) -> tuple[np.ndarray, float, float]:
    """The values after the file's VOI LUT or window, and the range that spans 0-255.

    Without a usable VOI the range is a robust min-max of the values themselves.
    """
    if _has_voi_lut(ds) or _has_window(ds):
        try:
            return _apply_voi(ds, values)
        except ValueError:
            # A zero window width or an unknown VOI LUT Function: the tags are unusable, but
            # the pixels are fine, so fall back to the image's own range.
            pass
    low, high = _robust_range(values)
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


def _robust_range(values: np.ndarray) -> tuple[float, float]:
    stride = max(1, math.isqrt(values.size // PERCENTILE_SAMPLES))
    low, high = np.percentile(values[::stride, ::stride], ROBUST_PERCENTILES)
    return float(low), float(high)
