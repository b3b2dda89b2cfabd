"""Distinct radiographs that look alike, and copies of them altered the way real duplicates are.

The near-duplicate search and its confirmation on pixels are measured and tested on these:
every render comes from the project's renderer (frontal or lateral, its own anatomy and
noise), so distinct renders share the structure real radiographs share, and each copy kind
is one alteration a film undergoes between two datasets (re-encoded, downscaled, shifted,
cropped, brighter, another gamma).
"""

from __future__ import annotations

from collections.abc import Callable

import cv2
import numpy as np

from radharmony_pipeline.processing.imaging.geometry import letterbox_geometry, resize_image
from radharmony_pipeline.synthetic.duplicates import (
    BRIGHTNESS,
    JPEG_QUALITY,
    RESIZE_FACTOR,
    SHIFT_PIXELS,
)
from radharmony_pipeline.synthetic.radiograph import render_radiograph, to_uint8
from radharmony_pipeline.synthetic.seeding import dataset_rng

# Share of laterals among the renders (ReXGradient's studies hold about one in six).
LATERAL_SHARE = 1 / 6
_STREAM = "look_alikes"


def look_alike_radiograph(seed: int, index: int, side: int) -> np.ndarray:
    """Render `index` of a seeded series: a uint8 `side`×`side` radiograph, distinct from
    every other index, frontal or lateral."""
    rng = dataset_rng(seed, _STREAM, index)
    view = "lateral" if rng.random() < LATERAL_SHARE else "frontal"
    return to_uint8(render_radiograph(rng, side, side, view).pixels)


def jpeg_round_trip(pixels: np.ndarray, quality: int) -> np.ndarray:
    _, encoded = cv2.imencode(".jpg", pixels, [cv2.IMWRITE_JPEG_QUALITY, quality])
    return cv2.imdecode(encoded, cv2.IMREAD_GRAYSCALE)


def downscaled(pixels: np.ndarray, factor: float) -> np.ndarray:
    size = (max(1, round(pixels.shape[1] * factor)), max(1, round(pixels.shape[0] * factor)))
    return cv2.resize(pixels, size, interpolation=cv2.INTER_AREA)


def shifted(pixels: np.ndarray, share: float) -> np.ndarray:
    """Moved right and up by `share` of the side, the edge repeated into the gap."""
    dx = share * pixels.shape[1]
    matrix = np.float32([[1, 0, dx], [0, 1, -dx]])
    size = (pixels.shape[1], pixels.shape[0])
    return cv2.warpAffine(pixels, matrix, size, borderMode=cv2.BORDER_REPLICATE)


def cropped(pixels: np.ndarray, share: float) -> np.ndarray:
    """`share` of the height cut off the top and of the width off the left (a tighter
    collimation or a scanner's trimmed border): the rest of the film, at its own size."""
    height, width = pixels.shape
    return pixels[round(share * height) :, round(share * width) :].copy()


def brightened(pixels: np.ndarray, factor: float) -> np.ndarray:
    return np.clip(pixels.astype(np.float32) * factor, 0, 255).astype(np.uint8)


def with_gamma(pixels: np.ndarray, gamma: float) -> np.ndarray:
    table = np.round(255.0 * (np.arange(256) / 255.0) ** gamma).astype(np.uint8)
    return table[pixels]


# The planted transforms of synthetic/duplicates.py at their settings, then harsher ones.
# Shifts and crops are shares of the side, so they mean the same film at any render size
# (SHIFT_PIXELS is planted on 1024-pixel films).
COPY_KINDS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "same_pixels": lambda p: p.copy(),
    "jpeg_quality": lambda p: jpeg_round_trip(p, JPEG_QUALITY),
    "resized": lambda p: downscaled(p, RESIZE_FACTOR),
    "shifted": lambda p: shifted(p, SHIFT_PIXELS / 1024),
    "brightness": lambda p: brightened(p, BRIGHTNESS),
    "jpeg_q20": lambda p: jpeg_round_trip(p, 20),
    "downscaled_half": lambda p: downscaled(p, 0.5),
    "shifted_1pct": lambda p: shifted(p, 0.01),
    "cropped_2pct": lambda p: cropped(p, 0.02),
    "darker": lambda p: brightened(p, 0.85),
    "gamma_0.8": lambda p: with_gamma(p, 0.8),
    "gamma_1.25": lambda p: with_gamma(p, 1.25),
}


def resized_like_images_stage(pixels: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """(the S×S letterboxed image, its content without padding) as the `images` stage makes
    them from a decoded film."""
    geometry = letterbox_geometry(pixels.shape[0], pixels.shape[1], size)
    framed = resize_image(pixels, geometry)
    top, left = geometry.pad_top, geometry.pad_left
    return framed, framed[top : top + geometry.resized_height, left : left + geometry.resized_width]
