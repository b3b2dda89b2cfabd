"""Whether two resized images show the same film: the confirmation of a perceptual-hash match.

Radiographs look alike: two different films can lie within the hash radius and correlate at
0.95 on their pixels. A copy differs from its original by a monotone change of grey levels
(brightness, gamma, windowing), compression noise, resampling, and a small shift or crop; a
different film differs in its fine structure (ribs, vessels, noise). So both images are
reduced to that structure: grey levels replaced by their rank (any monotone change cancels),
the content resampled to a `GRID`×`GRID` frame (any size or aspect), slightly blurred
(compression noise) minus a wider blur (the shared anatomy); then the second is aligned to
the first by ECC (a bounded affine warp: shifts, crops, rescaling) and the two correlated.
Copies score ≥ 0.99, different look-alike films ≤ 0.93 (benchmarks/README.md).
"""

from __future__ import annotations

import cv2
import numpy as np

GRID = 64
# Blurs in grid pixels: the fine one removes compression noise, the wide one the anatomy
# every chest radiograph shares.
_FINE_BLUR = 0.8
_WIDE_BLUR = 4.0
# Rows and columns left out of the correlation: a warp fills them from the border.
_MARGIN = 4
# The warp of a copy stays near the identity; a larger one fits a different film.
_MAX_LINEAR_CHANGE = 0.1
_MAX_SHIFT = 0.1 * GRID
_ECC_CRITERIA = (cv2.TERM_CRITERIA_COUNT | cv2.TERM_CRITERIA_EPS, 30, 1e-5)
# Between the lowest copy (0.994) and the highest different film (0.931) measured by
# `benchmarks/bench_duplicates.py --section films`: residuals 0.006 and 0.069, the
# threshold's 0.02 is about three times the one and a third of the other.
SAME_FILM_MIN_CORRELATION = 0.98


def film_structure(content: np.ndarray) -> np.ndarray:
    """GRID×GRID float32 fine structure of a uint8 image's content (its padding cut off)."""
    if content.ndim != 2 or content.dtype != np.uint8 or min(content.shape) < 1:
        raise ValueError(f"expected a 2-D uint8 image, got {content.dtype} {content.shape}")
    counts = np.bincount(content.ravel(), minlength=256).astype(np.float64)
    below = np.cumsum(counts) - counts / 2  # mid-rank of each grey level
    ranks = (below / content.size).astype(np.float32)[content]
    frame = cv2.resize(ranks, (GRID, GRID), interpolation=cv2.INTER_AREA)
    fine = cv2.GaussianBlur(frame, (0, 0), _FINE_BLUR)
    return (fine - cv2.GaussianBlur(frame, (0, 0), _WIDE_BLUR)).astype(np.float32)


def film_similarity(first: np.ndarray, second: np.ndarray) -> float:
    """Correlation of two `film_structure`s once the second is aligned to the first, in
    [-1, 1]; -1 when no alignment near the identity is found."""
    warp = np.eye(2, 3, dtype=np.float32)
    try:
        _, warp = cv2.findTransformECC(
            first, second, warp, cv2.MOTION_AFFINE, _ECC_CRITERIA, None, 1
        )
    except cv2.error:  # no convergence: nothing near the identity aligns them
        return -1.0
    linear_change = np.abs(warp[:, :2] - np.eye(2, dtype=np.float32)).max()
    if linear_change > _MAX_LINEAR_CHANGE or np.abs(warp[:, 2]).max() > _MAX_SHIFT:
        return -1.0
    aligned = cv2.warpAffine(
        second,
        warp,
        (GRID, GRID),
        flags=cv2.INTER_LINEAR + cv2.WARP_INVERSE_MAP,
        borderMode=cv2.BORDER_REFLECT,
    )
    return _correlation(
        first[_MARGIN:-_MARGIN, _MARGIN:-_MARGIN], aligned[_MARGIN:-_MARGIN, _MARGIN:-_MARGIN]
    )


def same_film(first: np.ndarray, second: np.ndarray) -> bool:
    """Two `film_structure`s of one film (a copy, however re-encoded, shifted or cropped),
    the same answer whichever comes first: one film when either aligns onto the other.

    `film_similarity` aligns the second onto the first, and the two directions can fall on
    either side of the threshold: a warp within the bounds can have its inverse outside them
    (a rescaling by 0.9 changes the linear part by 0.1, its inverse by 0.11), and ECC may
    converge one way only. Failing to align is no evidence of two films, while a correlation
    at the threshold after a warp near the identity is (different look-alike films stay
    ≤ 0.93 both ways). The second direction is computed only when the first says no."""
    return (
        film_similarity(first, second) >= SAME_FILM_MIN_CORRELATION
        or film_similarity(second, first) >= SAME_FILM_MIN_CORRELATION
    )


def _correlation(a: np.ndarray, b: np.ndarray) -> float:
    a = a - a.mean()
    b = b - b.mean()
    scale = float(np.sqrt((a * a).sum() * (b * b).sum()))
    return float((a * b).sum() / scale) if scale > 0 else -1.0
