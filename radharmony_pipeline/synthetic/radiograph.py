"""Synthesis of radiograph-like images: body outline, lung fields, heart, spine and ribs.

Every dataset renders its images here, so masks and boxes line up with visible findings.
"""

from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np

# Anatomy is rendered on a coarse grid and upsampled: it is smooth anyway, it keeps 1024 px
# images fast, and smooth images compress well as PNG.
_COARSE_SIDE = 256


@dataclass(frozen=True)
class Ellipse:
    """An axis-aligned ellipse in pixel coordinates."""

    cx: float
    cy: float
    rx: float
    ry: float

    def falloff(self, xx: np.ndarray, yy: np.ndarray, softness: float) -> np.ndarray:
        """1 inside, 0 outside, with a smooth edge `softness` wide (in normalized radius)."""
        d = np.sqrt(((xx - self.cx) / self.rx) ** 2 + ((yy - self.cy) / self.ry) ** 2)
        return np.clip((1.0 - d) / softness + 0.5, 0.0, 1.0) ** 2


@dataclass(frozen=True)
class Anatomy:
    """Where the structures of one rendered radiograph are, so findings can be placed."""

    height: int
    width: int
    view: str
    lungs: tuple[Ellipse, ...]
    heart: Ellipse
    spine_x: float

    def lung(self, side: int) -> Ellipse:
        """Lung `side` (0 = image left = patient right); laterals have a single lung field."""
        return self.lungs[side % len(self.lungs)]


@dataclass(frozen=True)
class Radiograph:
    """Pixels in [0, 1] (bright = dense) and the anatomy they show."""

    pixels: np.ndarray
    anatomy: Anatomy


def render_radiograph(
    rng: np.random.Generator, height: int, width: int, view: str = "frontal"
) -> Radiograph:
    """Render a chest radiograph of `height` x `width` pixels; `view` is frontal or lateral."""
    anatomy = (
        _frontal_anatomy(rng, height, width)
        if view == "frontal"
        else (_lateral_anatomy(rng, height, width))
    )
    scale = min(1.0, _COARSE_SIDE / max(height, width))
    coarse_h, coarse_w = max(8, round(height * scale)), max(8, round(width * scale))
    yy, xx = np.mgrid[0:coarse_h, 0:coarse_w].astype(np.float32)
    xx *= width / coarse_w
    yy *= height / coarse_h
    coarse = _anatomy_intensity(rng, anatomy, xx, yy)
    coarse += _smooth_noise(rng, coarse_h, coarse_w, cells=6, amplitude=0.05)
    coarse += _smooth_noise(rng, coarse_h, coarse_w, cells=24, amplitude=0.015)
    pixels = cv2.resize(coarse, (width, height), interpolation=cv2.INTER_CUBIC)
    return Radiograph(np.clip(pixels, 0.0, 1.0), anatomy)


def paint_findings(pixels: np.ndarray, mask: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Brighten the image where `mask` is set, with soft edges, as an opacity would."""
    rows, cols = np.nonzero(mask.any(axis=1))[0], np.nonzero(mask.any(axis=0))[0]
    if rows.size == 0:
        return pixels
    # Edges soften in proportion to the finding, so small nodules stay visible.
    sigma = max(0.8, 0.08 * np.sqrt(float(mask.sum())))
    margin = int(np.ceil(3 * sigma))
    # Blur only around the finding: a full-frame blur per finding dominates 1024 px images.
    top, bottom = max(0, rows[0] - margin), min(mask.shape[0], rows[-1] + margin + 1)
    left, right = max(0, cols[0] - margin), min(mask.shape[1], cols[-1] + margin + 1)
    soft = cv2.GaussianBlur(mask[top:bottom, left:right].astype(np.float32), (0, 0), sigma)
    strength = rng.uniform(0.4, 0.5)
    painted = pixels.copy()
    window = painted[top:bottom, left:right]
    # Dense regions (heart, spine) gain less, so an opacity over them does not saturate.
    window += strength * soft * (1.05 - window)
    np.clip(window, 0.0, 1.0, out=window)
    return painted


def to_uint8(pixels: np.ndarray) -> np.ndarray:
    """Quantize [0, 1] pixels to 8 bits."""
    return np.round(np.clip(pixels, 0.0, 1.0) * 255.0).astype(np.uint8)


def to_unsigned(pixels: np.ndarray, bits: int) -> np.ndarray:
    """Quantize [0, 1] pixels to `bits` bits stored in uint16."""
    return np.round(np.clip(pixels, 0.0, 1.0) * float((1 << bits) - 1)).astype(np.uint16)


def _frontal_anatomy(rng: np.random.Generator, h: int, w: int) -> Anatomy:
    mid = w * (0.5 + rng.uniform(-0.03, 0.03))
    lung_cy = h * rng.uniform(0.42, 0.48)
    lung_rx, lung_ry = w * rng.uniform(0.15, 0.19), h * rng.uniform(0.26, 0.32)
    offset = w * rng.uniform(0.19, 0.23)
    right = Ellipse(mid - offset, lung_cy, lung_rx, lung_ry)
    # The patient's left lung is a little smaller: the heart takes its place.
    left = Ellipse(mid + offset, lung_cy + 0.02 * h, lung_rx * 0.92, lung_ry * 0.95)
    heart = Ellipse(
        mid + w * rng.uniform(0.03, 0.07),
        h * rng.uniform(0.6, 0.65),
        w * rng.uniform(0.14, 0.18),
        h * rng.uniform(0.1, 0.12),
    )
    return Anatomy(h, w, "frontal", (right, left), heart, mid)


def _lateral_anatomy(rng: np.random.Generator, h: int, w: int) -> Anatomy:
    lung = Ellipse(
        w * rng.uniform(0.48, 0.54),
        h * rng.uniform(0.44, 0.5),
        w * rng.uniform(0.26, 0.3),
        h * rng.uniform(0.3, 0.34),
    )
    # Patients face image-left on a lateral: heart anterior (left), spine posterior (right).
    heart = Ellipse(
        w * rng.uniform(0.34, 0.4),
        h * rng.uniform(0.62, 0.68),
        w * rng.uniform(0.14, 0.18),
        h * rng.uniform(0.11, 0.14),
    )
    return Anatomy(h, w, "lateral", (lung,), heart, w * rng.uniform(0.76, 0.8))


def _anatomy_intensity(
    rng: np.random.Generator, anatomy: Anatomy, xx: np.ndarray, yy: np.ndarray
) -> np.ndarray:
    h, w = anatomy.height, anatomy.width
    body = Ellipse(w * 0.5, h * 0.58, w * rng.uniform(0.5, 0.56), h * rng.uniform(0.62, 0.7))
    soft_tissue = body.falloff(xx, yy, softness=0.25)
    heart = anatomy.heart.falloff(xx, yy, softness=0.5)
    lungs = np.zeros_like(xx)
    for lung in anatomy.lungs:
        lungs = np.maximum(lungs, _tapered_lung(lung, xx, yy))
    # The heart shadow hides the lung behind it, as on a real film.
    lungs *= 1.0 - 0.85 * heart
    spine = np.exp(-(((xx - anatomy.spine_x) / (0.035 * w)) ** 2))
    spine *= np.clip((yy / h - 0.04) * 8.0, 0.0, 1.0)
    dense = np.maximum(0.2 * heart, 0.2 * spine)
    if anatomy.view == "frontal":
        mediastinum = Ellipse(anatomy.spine_x, h * 0.4, w * 0.075, h * 0.26)
        dense = np.maximum(dense, 0.17 * mediastinum.falloff(xx, yy, softness=0.6))
    ribcage = np.clip((0.8 * h - yy) / (0.08 * h), 0.0, 1.0) * soft_tissue
    ribs = _ribs(rng, anatomy, xx, yy) * ribcage * (0.35 + 0.65 * lungs)
    image = 0.05 + 0.5 * soft_tissue - 0.3 * lungs + dense + 0.09 * ribs
    return image.astype(np.float32)


def _tapered_lung(lung: Ellipse, xx: np.ndarray, yy: np.ndarray) -> np.ndarray:
    """A lung field: an ellipse narrowed towards the apex."""
    above_centre = np.clip((lung.cy - yy) / lung.ry, 0.0, 1.0)
    narrowed = Ellipse(lung.cx, lung.cy, lung.rx, lung.ry)
    squeeze = 1.0 + 0.45 * above_centre
    return narrowed.falloff(lung.cx + (xx - lung.cx) * squeeze, yy, softness=0.2)


def _ribs(rng: np.random.Generator, anatomy: Anatomy, xx: np.ndarray, yy: np.ndarray) -> np.ndarray:
    """Arcs that sag away from the spine, one band per rib."""
    h, w = anatomy.height, anatomy.width
    spacing = h * rng.uniform(0.07, 0.085)
    sag = h * rng.uniform(0.9, 1.3)
    dx = (xx - anatomy.spine_x) / w
    phase = (yy - sag * dx**2) / spacing
    return np.clip(np.cos(2 * np.pi * phase) * 1.3 - 0.3, 0.0, 1.0)


def _smooth_noise(
    rng: np.random.Generator, h: int, w: int, cells: int, amplitude: float
) -> np.ndarray:
    grid = rng.standard_normal((cells, cells)).astype(np.float32)
    return amplitude * cv2.resize(grid, (w, h), interpolation=cv2.INTER_CUBIC)
