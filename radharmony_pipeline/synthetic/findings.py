"""Finding outlines (polygons) placed at anatomically plausible sites, and their rasters."""

from __future__ import annotations

import cv2
import numpy as np

from radharmony_pipeline.synthetic.radiograph import Anatomy, Ellipse

# Where each finding (unified vocabulary) is drawn.
FINDING_SITES: dict[str, str] = {
    "atelectasis": "lung_base",
    "calcification": "nodule",
    "cardiomegaly": "heart",
    "consolidation": "lung",
    "diffuse_nodule": "diffuse",
    "edema": "lung",
    "emphysema": "apex",
    "enlarged_cardiomediastinum": "mediastinum",
    "fibrosis": "lung",
    "fracture": "rib",
    "lung_lesion": "nodule",
    "lung_opacity": "lung",
    "mass": "mass",
    "nodule": "nodule",
    "pleural_effusion": "lung_base",
    "pleural_thickening": "pleura",
    "pneumonia": "lung",
    "pneumothorax": "apex",
    "support_devices": "device",
}

Polygon = np.ndarray  # (n, 2) int32 array of (x, y) vertices


def finding_polygon(
    finding: str,
    anatomy: Anatomy,
    rng: np.random.Generator,
    side: int | None = None,
    site: str | None = None,
) -> Polygon:
    """One outline of `finding`; `side` picks the lung (0 = image left), random if None.

    `site` overrides where the finding is drawn (one of FINDING_SITES' values, e.g. `lung_base`).
    """
    if side is None:
        side = int(rng.integers(0, 2))
    site = site or FINDING_SITES[finding]
    if site == "device":
        return _clip(_tube(anatomy, rng), anatomy)
    return _clip(_blob(_site_ellipse(site, anatomy, side, rng), rng), anatomy)


def polygon_mask(polygons: list[Polygon], height: int, width: int) -> np.ndarray:
    """Rasterize the union of `polygons` into a uint8 0/1 mask."""
    mask = np.zeros((height, width), dtype=np.uint8)
    if polygons:
        cv2.fillPoly(mask, [p.reshape(-1, 1, 2) for p in polygons], 1)
    return mask


def bounding_box(polygon: Polygon) -> tuple[int, int, int, int]:
    """(x1, y1, x2, y2) of the polygon's vertices, inclusive pixel coordinates."""
    x1, y1 = polygon.min(axis=0)
    x2, y2 = polygon.max(axis=0)
    return int(x1), int(y1), int(x2), int(y2)


def _site_ellipse(site: str, anatomy: Anatomy, side: int, rng: np.random.Generator) -> Ellipse:
    lung = anatomy.lung(side)
    # +1 points away from the spine, towards the chest wall.
    outward = 1.0 if lung.cx >= anatomy.spine_x else -1.0
    u = rng.uniform
    if site == "heart":
        heart = anatomy.heart
        grow = u(1.05, 1.2)
        return Ellipse(heart.cx, heart.cy, heart.rx * grow, heart.ry * grow)
    if site == "mediastinum":
        return Ellipse(
            anatomy.spine_x,
            anatomy.heart.cy - anatomy.heart.ry * u(1.6, 2.0),
            anatomy.width * u(0.07, 0.1),
            anatomy.height * u(0.12, 0.16),
        )
    if site == "lung_base":
        return Ellipse(
            lung.cx + outward * lung.rx * u(0.0, 0.2),
            lung.cy + lung.ry * u(0.6, 0.75),
            lung.rx * u(0.55, 0.8),
            lung.ry * u(0.15, 0.25),
        )
    if site == "apex":
        return Ellipse(
            lung.cx + outward * lung.rx * u(0.2, 0.4),
            lung.cy - lung.ry * u(0.5, 0.7),
            lung.rx * u(0.25, 0.4),
            lung.ry * u(0.15, 0.25),
        )
    if site == "pleura":
        return Ellipse(
            lung.cx + outward * lung.rx * u(0.8, 0.9),
            lung.cy + lung.ry * u(-0.3, 0.3),
            lung.rx * u(0.06, 0.1),
            lung.ry * u(0.25, 0.45),
        )
    if site == "rib":
        return Ellipse(
            lung.cx + outward * lung.rx * u(0.7, 0.95),
            lung.cy + lung.ry * u(-0.5, 0.5),
            lung.rx * u(0.08, 0.14),
            lung.ry * u(0.04, 0.07),
        )
    cx, cy = _point_in(lung, rng, reach=0.55)
    if site == "nodule":
        r = lung.rx * u(0.07, 0.12)
        return Ellipse(cx, cy, r, r * u(0.85, 1.15))
    if site == "mass":
        r = lung.rx * u(0.18, 0.28)
        return Ellipse(cx, cy, r, r * u(0.8, 1.2))
    if site == "diffuse":
        return Ellipse(cx, cy, lung.rx * u(0.4, 0.6), lung.ry * u(0.3, 0.45))
    return Ellipse(cx, cy, lung.rx * u(0.3, 0.55), lung.ry * u(0.18, 0.32))


def _point_in(ellipse: Ellipse, rng: np.random.Generator, reach: float) -> tuple[float, float]:
    angle = rng.uniform(0.0, 2 * np.pi)
    radius = reach * np.sqrt(rng.uniform(0.0, 1.0))
    return (
        ellipse.cx + radius * ellipse.rx * np.cos(angle),
        ellipse.cy + radius * ellipse.ry * np.sin(angle),
    )


def _blob(ellipse: Ellipse, rng: np.random.Generator) -> np.ndarray:
    """An irregular closed outline around `ellipse`: a few low harmonics wobble the radius."""
    n = int(rng.integers(12, 25))
    # A few pixels at least, so a finding never rasterizes to nothing on a tiny image.
    rx, ry = max(ellipse.rx, 3.0), max(ellipse.ry, 3.0)
    theta = np.linspace(0.0, 2 * np.pi, n, endpoint=False)
    wobble = np.ones(n)
    for harmonic in (2, 3, 5):
        wobble += rng.uniform(0.0, 0.12) * np.cos(harmonic * theta + rng.uniform(0, 2 * np.pi))
    tilt = rng.uniform(-0.3, 0.3)
    x = rx * wobble * np.cos(theta)
    y = ry * wobble * np.sin(theta)
    return np.stack(
        [
            ellipse.cx + x * np.cos(tilt) - y * np.sin(tilt),
            ellipse.cy + x * np.sin(tilt) + y * np.cos(tilt),
        ],
        axis=1,
    )


def _tube(anatomy: Anatomy, rng: np.random.Generator) -> np.ndarray:
    """A line or catheter: a thin band from the neck down into the chest."""
    h, w = anatomy.height, anatomy.width
    y = np.linspace(0.02 * h, h * rng.uniform(0.45, 0.6), 8)
    x = anatomy.spine_x + w * rng.uniform(-0.04, 0.04) + w * 0.05 * np.sin(y / h * np.pi)
    half = max(1.5, 0.008 * w)
    left = np.stack([x - half, y], axis=1)
    right = np.stack([x + half, y], axis=1)[::-1]
    return np.concatenate([left, right])


def _clip(points: np.ndarray, anatomy: Anatomy) -> Polygon:
    """Round to integer pixels inside the image and drop repeated vertices."""
    xy = np.round(points).astype(np.int32)
    xy[:, 0] = np.clip(xy[:, 0], 0, anatomy.width - 1)
    xy[:, 1] = np.clip(xy[:, 1], 0, anatomy.height - 1)
    keep = np.ones(len(xy), dtype=bool)
    keep[1:] = np.any(xy[1:] != xy[:-1], axis=1)
    return xy[keep]
