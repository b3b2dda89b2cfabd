"""The decode and resize of the `images` stage as they were before issue 23 (LUT windowing,
reduce-first, pyspng), kept verbatim in substance as the reference the faster paths must
match within one grey level."""

from __future__ import annotations

import math
from pathlib import Path

import cv2
import numpy as np
import pydicom
from PIL import Image
from pydicom.pixels import apply_modality_lut, apply_voi_lut
from pydicom.uid import JPEG2000TransferSyntaxes, JPEGLSTransferSyntaxes

from radharmony_pipeline.processing.imaging.geometry import letterbox_geometry

GREY_MAX = 255
ROBUST_PERCENTILES = (0.5, 99.5)
PERCENTILE_SAMPLES = 1_000_000
UNMASKED_SYNTAXES = frozenset(JPEG2000TransferSyntaxes) | frozenset(JPEGLSTransferSyntaxes)


def stretch_to_uint8(values: np.ndarray, low: float, high: float) -> np.ndarray:
    if not high > low:
        return np.zeros(values.shape, dtype=np.uint8)
    scaled = (values.astype(np.float32) - np.float32(low)) * np.float32(GREY_MAX / (high - low))
    return np.rint(np.clip(scaled, 0, GREY_MAX)).astype(np.uint8)


def reference_png(path: Path) -> np.ndarray:
    """Full-resolution uint8 pixels of a grayscale PNG (L, I;16, or lossless RGB(A))."""
    with Image.open(path, formats=["PNG"]) as image:
        pixels, mode = np.array(image), image.mode
    if mode in ("RGB", "RGBA"):
        pixels = np.ascontiguousarray(pixels[..., 0])
    elif mode != "L":
        pixels = pixels.astype(np.uint16)
    if pixels.dtype != np.uint8:
        pixels = stretch_to_uint8(pixels, float(pixels.min()), float(pixels.max()))
    return pixels


def _has_voi_lut(ds) -> bool:
    items = ds.get("VOILUTSequence")
    return bool(items) and "LUTDescriptor" in items[0] and "LUTData" in items[0]


def _has_window(ds) -> bool:
    return ds.get("WindowCenter") is not None and ds.get("WindowWidth") is not None


def _voi_output_range(ds) -> tuple[float, float]:
    if _has_voi_lut(ds):
        entries, first_mapped = ds.VOILUTSequence[0].LUTDescriptor[:2]
        probe = np.arange(first_mapped, first_mapped + (entries or 2**16), dtype=np.int64)
    else:
        probe = np.array([-np.inf, np.inf])
    mapped = apply_voi_lut(probe, ds, index=0)
    return float(mapped.min()), float(mapped.max())


def _apply_voi(ds, values):
    if _has_voi_lut(ds):
        values = np.rint(values).astype(np.int64)
    windowed = apply_voi_lut(values, ds, index=0)
    low, high = _voi_output_range(ds)
    return windowed, low, high


def _robust_range(values: np.ndarray) -> tuple[float, float]:
    stride = max(1, math.isqrt(values.size // PERCENTILE_SAMPLES))
    low, high = np.percentile(values[::stride, ::stride], ROBUST_PERCENTILES)
    return float(low), float(high)


def _windowed(ds, values):
    if _has_voi_lut(ds) or _has_window(ds):
        try:
            return _apply_voi(ds, values)
        except ValueError:
            pass
    low, high = _robust_range(values)
    return values, low, high


def reference_dicom(path: Path) -> np.ndarray:
    """Full-resolution uint8 pixels of a grayscale DICOM, bone bright."""
    ds = pydicom.dcmread(path)
    stored = ds.pixel_array
    bits_stored = int(ds.BitsStored)
    if (
        ds.file_meta.TransferSyntaxUID in UNMASKED_SYNTAXES
        and ds.PixelRepresentation == 0
        and bits_stored < stored.dtype.itemsize * 8
    ):
        stored = stored & stored.dtype.type((1 << bits_stored) - 1)
    values = apply_modality_lut(stored, ds)
    values, low, high = _windowed(ds, values)
    pixels = stretch_to_uint8(values, low, high)
    if ds.PhotometricInterpretation == "MONOCHROME1":
        pixels = GREY_MAX - pixels
    return pixels


def reference_letterbox(pixels: np.ndarray, size: int) -> np.ndarray:
    """Full-resolution uint8 pixels letterboxed as `images` did: INTER_AREA, zero padding."""
    return reference_resize(pixels, pixels.shape, size)


DCT_MARGIN = 2


def reference_jpeg(path: Path, target_size: int) -> np.ndarray:
    """A JPEG decoded at the reduced DCT scale `images` used, as uint8 (not full size)."""
    with Image.open(path, formats=["JPEG"]) as image:
        width, height = image.size
        shrink = min(1.0, DCT_MARGIN * target_size / max(width, height))
        image.draft("L", (math.ceil(width * shrink), math.ceil(height * shrink)))
        image.load()
        grey = image if image.mode == "L" else image.convert("L")
        return np.array(grey, dtype=np.uint8)


def reference_resize(pixels: np.ndarray, source_shape: tuple[int, int], size: int) -> np.ndarray:
    """Possibly reduced pixels letterboxed for a source of `source_shape`, as `images` did."""
    geometry = letterbox_geometry(*source_shape, size)
    content = cv2.resize(
        pixels, (geometry.resized_width, geometry.resized_height), interpolation=cv2.INTER_AREA
    )
    frame = np.zeros((size, size), dtype=np.uint8)
    top, left = geometry.pad_top, geometry.pad_left
    frame[top : top + geometry.resized_height, left : left + geometry.resized_width] = content
    return frame
