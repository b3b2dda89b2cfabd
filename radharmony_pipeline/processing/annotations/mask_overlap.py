"""How per-class masks of one dataset overlap: the figures of the ChestX-Det card's table.

Measured on masks (never copied from documentation), so a different release, a broken
rasterization or a lost class shows up as a figure that no longer matches. Shares and
means are reported in per mille (integers), the precision the documentation gives them in.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import combinations
from pathlib import Path

import numpy as np
from PIL import Image

from radharmony_pipeline.processing.annotations.masks import read_mask_png
from radharmony_pipeline.processing.storage.source_store import NotARegularFile, open_source_file

# A (image, class) mask smaller than this share of the frame counts as small.
SMALL_MASK_FRACTION = 0.005
PREFIX = "overlap."


@dataclass(frozen=True)
class PairOverlap:
    first: str
    second: str
    intersection: int
    union: int


@dataclass(frozen=True)
class ImageOverlap:
    """One image's classes (with a non-empty mask) and every pair's pixel overlap."""

    classes: tuple[str, ...]
    pairs: tuple[PairOverlap, ...]


def image_overlap(masks: Mapping[str, np.ndarray]) -> ImageOverlap:
    """Pairwise intersections and unions of one image's non-empty class masks."""
    present = {name: np.asarray(mask) > 0 for name, mask in masks.items()}
    present = {name: mask for name, mask in sorted(present.items()) if mask.any()}
    pairs = tuple(
        PairOverlap(
            first,
            second,
            int(np.count_nonzero(present[first] & present[second])),
            int(np.count_nonzero(present[first] | present[second])),
        )
        for first, second in combinations(present, 2)
    )
    return ImageOverlap(tuple(present), pairs)


def pair_name(first: str, second: str) -> str:
    return "+".join(sorted((first, second)))


def overlap_figures(images: Iterable[ImageOverlap], area_fractions: Sequence[float]) -> dict:
    """The overlap figures of a dataset: `area_fractions` has one entry per (image, class)
    mask (class masks only, not unions)."""
    multi_class = overlapping_images = 0
    ious: list[float] = []
    together: Counter[str] = Counter()
    overlapping_pairs: Counter[str] = Counter()
    for image in images:
        multi_class += len(image.classes) > 1
        overlapping = [pair for pair in image.pairs if pair.intersection > 0]
        overlapping_images += bool(overlapping)
        ious += [pair.intersection / pair.union for pair in overlapping]
        for pair in image.pairs:
            name = pair_name(pair.first, pair.second)
            together[name] += 1
            overlapping_pairs[name] += pair.intersection > 0
    fractions = np.asarray(area_fractions, dtype=float)
    figures = {
        f"{PREFIX}multi_class_images": multi_class,
        f"{PREFIX}pixel_overlap_images": overlapping_images,
        f"{PREFIX}mean_pair_iou_permille": _permille(np.mean(ious)) if ious else 0,
        f"{PREFIX}small_mask_permille": (
            _permille(np.mean(fractions < SMALL_MASK_FRACTION)) if len(fractions) else 0
        ),
        f"{PREFIX}median_mask_area_permille": (
            _permille(np.median(fractions)) if len(fractions) else 0
        ),
    }
    for name in sorted(together):
        figures[f"{PREFIX}pair_images.{name}"] = together[name]
        figures[f"{PREFIX}pair_overlap_images.{name}"] = overlapping_pairs[name]
    return figures


def _permille(value: float) -> int:
    return round(float(value) * 1000)


def overlap_of_files(masks: Mapping[str, Path]) -> ImageOverlap:
    """image_overlap of one image's class-mask PNGs (top-level: runs in a process pool)."""
    return image_overlap({name: read_mask_png(path) for name, path in masks.items()})


def alpha_images(files: Iterable[Path]) -> int:
    """Source images stored with an alpha channel (RGBA/LA), from their headers only."""
    count = 0
    for path in files:
        try:
            with open_source_file(path) as handle, Image.open(handle) as image:
                count += image.mode in ("RGBA", "LA")
        except NotARegularFile:
            continue  # a FIFO or device named like an image: the images stage reports it
    return count
