"""Byte encodings of synthetic images: baseline grayscale JPEG and 8/16-bit or RGBA PNG."""

from __future__ import annotations

import io

import numpy as np
from PIL import Image

JPEG_QUALITY = 85
# zlib's default effort: level 9 is ten times slower on 1024 px images for 10 % less disk.
PNG_COMPRESS_LEVEL = 6


def jpeg_bytes(gray: np.ndarray) -> bytes:
    """Baseline 8-bit single-channel JFIF JPEG of a uint8 image."""
    buffer = io.BytesIO()
    Image.fromarray(_require(gray, np.uint8)).save(
        buffer, "JPEG", quality=JPEG_QUALITY, optimize=False, progressive=False
    )
    return buffer.getvalue()


def png_bytes(gray: np.ndarray, compress_level: int = PNG_COMPRESS_LEVEL) -> bytes:
    """Single-channel PNG: 8-bit for uint8 input, 16-bit for uint16 input."""
    if gray.dtype not in (np.uint8, np.uint16):
        raise TypeError(f"PNG pixels must be uint8 or uint16, got {gray.dtype}")
    return _png(Image.fromarray(gray), compress_level)


def rgba_png_bytes(gray: np.ndarray) -> bytes:
    """RGBA PNG with R = G = B = `gray` and opaque alpha, as some NIH images are stored."""
    gray = _require(gray, np.uint8)
    alpha = np.full_like(gray, 255)
    return _png(Image.fromarray(np.dstack([gray, gray, gray, alpha])), PNG_COMPRESS_LEVEL)


def _png(image: Image.Image, compress_level: int) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, "PNG", compress_level=compress_level)
    return buffer.getvalue()


def _require(pixels: np.ndarray, dtype: type) -> np.ndarray:
    if pixels.ndim != 2 or pixels.dtype != dtype:
        raise TypeError(
            f"expected a 2-D {np.dtype(dtype)} array, got {pixels.dtype} with shape {pixels.shape}"
        )
    return pixels
