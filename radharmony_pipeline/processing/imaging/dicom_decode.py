"""DICOM radiographs to bone-bright uint8: stored values, then one lookup table per image
(modality LUT, VOI, 8 bits, polarity); imported on the first DICOM (pydicom is slow to load)."""

from __future__ import annotations

import io
import math
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

import numpy as np
import pydicom
from PIL import Image
from pydicom.dataset import Dataset
from pydicom.encaps import generate_frames
from pydicom.pixels import apply_modality_lut, apply_voi_lut, get_decoder
from pydicom.uid import (
    UID,
    ExplicitVRLittleEndian,
    ImplicitVRLittleEndian,
    JPEG2000TransferSyntaxes,
    JPEGLSTransferSyntaxes,
)

from radharmony_pipeline.processing.imaging.geometry import reduce_by_area
from radharmony_pipeline.processing.imaging.pixels import (
    GREY_MAX,
    LOOKUP_DTYPES,
    DecodedImage,
    DecodeError,
    lookup_domain,
    reduce_stored_values,
    reduction_factor,
    stretch_to_uint8,
    through_lookup,
)
from radharmony_pipeline.processing.storage.source_store import SourcePath

# Without a VOI window, clip this much of each tail before stretching: enough to ignore
# dead or hot detector pixels and burned-in lead markers (~0.5 % of a 3000x2500 image is
# ~37,000 pixels, more than a marker letter), too little to saturate visible anatomy.
ROBUST_PERCENTILES = (0.5, 99.5)
# Percentiles come from a regular subsample of about this many pixels: on 3056x2544
# radiographs it moves them by 1-3 stored levels of ~3,000 from a 1,000,000-pixel sample
# (under 0.3 grey levels), at a quarter of the histogram's cost. They are read off its
# histogram, which gives np.percentile's exact values on the sample without sorting.
PERCENTILE_SAMPLES = 250_000

GRAYSCALE_PHOTOMETRICS = ("MONOCHROME1", "MONOCHROME2")
# Refuse a DICOM whose header declares more pixel data than this before decoding: a 1 KB
# file may declare 30000x30000 16-bit pixels, which the decoder would allocate (~1.7 GiB)
# before noticing the data is missing. The largest radiographs (~4300x3500 at 16 bits) hold
# ~30 MiB, so 1 GiB leaves room for multi-frame files without letting a bomb through.
MAX_DICOM_PIXEL_BYTES = 1 << 30
# pydicom 3 masks the bits above BitsStored itself except for these syntaxes, whose
# decoders return whatever precision the codestream declares.
NATIVE_LITTLE_ENDIAN = frozenset({ExplicitVRLittleEndian, ImplicitVRLittleEndian})
# Values larger than this are read only when used (by then, for native pixels, never).
DEFER_BYTES = 1 << 16
UNMASKED_SYNTAXES = frozenset(JPEG2000TransferSyntaxes) | frozenset(JPEGLSTransferSyntaxes)


def decode_dicom(
    path: SourcePath, source: Path | BinaryIO, target_size: int | None
) -> DecodedImage:
    """A .dcm file's first VOI (or a robust range) applied, 8 bits, bone bright; reduced by
    a whole factor first when much larger than `target_size` (see decode_grayscale)."""
    ds = _read_dicom(path, source)
    _require_grayscale_pixel_data(ds, path)
    _require_plausible_size(ds, path)
    _require_decodable_syntax(ds, path)
    rows, columns = int(ds.Rows), int(ds.Columns)
    factor = reduction_factor(rows, columns, target_size)
    content = source.getvalue() if isinstance(source, io.BytesIO) else None
    stored, level_reduction = _stored_values(ds, path, factor, content)
    if stored.dtype not in LOOKUP_DTYPES:
        return DecodedImage(_presentation_values(ds, stored), rows, columns, level_reduction)
    # Reduce the stored values, then window the few that are left through a table composed
    # once per image: one pass over the full-resolution pixels in all.
    table = _presentation_table(ds, stored)
    if level_reduction > 1:  # a JPEG 2000 level: the rest of the whole factor by area
        area_factor = max(1, factor // level_reduction)
        reduced = reduce_by_area(stored, area_factor)
    else:
        reduced, area_factor = reduce_stored_values(stored, target_size)
    pixels = through_lookup(reduced, table)
    return DecodedImage(pixels, rows, columns, level_reduction * area_factor)


def _read_dicom(path: SourcePath, source: Path | BinaryIO) -> Dataset:
    try:
        # Large values (the pixels) are left unread until asked for: native pixels are then
        # viewed in the file's bytes instead of copied out of them (see _native_pixels).
        return pydicom.dcmread(source, defer_size=DEFER_BYTES)
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


def _stored_values(
    ds: Dataset, path: Path, factor: int, content: bytes | None
) -> tuple[np.ndarray, int]:
    """The stored pixel values of a single-frame image, bits above BitsStored cleared, and
    how many times smaller than Rows x Columns they are (a JPEG 2000 resolution level)."""
    native = _native_pixels(ds, content)
    if native is not None:
        return native, 1
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


def _native_pixels(ds: Dataset, content: bytes | None) -> np.ndarray | None:
    """Uncompressed little-endian unsigned 16-bit pixels of one frame as a read-only view of
    the file's bytes, bits above BitsStored cleared (a copy only when some are set); None
    for anything else, which pydicom decodes. pydicom's own path copies the 15 MB of a
    MIMIC-sized image twice and masks it once, about half the cost of its decode."""
    if (
        content is None
        or ds.file_meta.TransferSyntaxUID not in NATIVE_LITTLE_ENDIAN
        or int(ds.BitsAllocated) != 16
        or int(ds.get("SamplesPerPixel") or 1) != 1
        or int(ds.get("NumberOfFrames") or 1) != 1
        or ds.PixelRepresentation != 0
    ):
        return None
    element = ds.get_item("PixelData", keep_deferred=True)
    rows, columns = int(ds.Rows), int(ds.Columns)
    offset = getattr(element, "value_tell", None)
    if offset is None or offset + rows * columns * 2 > len(content):
        return None  # already read, or truncated: pydicom's decode reports it
    pixels = np.frombuffer(content, dtype="<u2", count=rows * columns, offset=offset)
    pixels = pixels.reshape(rows, columns)
    bits_stored = int(ds.BitsStored)
    # The maximum alone: half the time of cv2.minMaxLoc, which also finds the minimum.
    if bits_stored < 16 and int(pixels.max()) >= 1 << bits_stored:
        pixels = pixels & np.uint16((1 << bits_stored) - 1)
    return pixels


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
    stored values, exactly as np.percentile (linear) would find them on the values.

    The sample is every k-th whole row (k the square of _percentile_sample's stride, so the
    same number of pixels), counted by np.bincount: at this sample size OpenCV's calcHist
    costs twice the CPU, mostly in waking its threads."""
    stride = max(1, math.isqrt(stored.size // PERCENTILE_SAMPLES))
    sample = stored[:: stride * stride].view(LOOKUP_DTYPES[stored.dtype])
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
