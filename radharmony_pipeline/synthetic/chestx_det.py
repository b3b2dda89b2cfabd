"""Miniature ChestX-Det: 1024x1024 PNGs and per-split JSON lists of polygons and boxes."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from radharmony_pipeline.processing.annotations.mask_overlap import image_overlap, overlap_figures
from radharmony_pipeline.processing.annotations.masks import area_fraction, rasterize_polygons
from radharmony_pipeline.synthetic.encoding import png_bytes, rgba_png_bytes
from radharmony_pipeline.synthetic.expected import write_expected_counts
from radharmony_pipeline.synthetic.files import write_bytes, write_text
from radharmony_pipeline.synthetic.findings import bounding_box, finding_polygon, polygon_mask
from radharmony_pipeline.synthetic.identifiers import distinct_integers
from radharmony_pipeline.synthetic.radiograph import paint_findings, render_radiograph, to_uint8
from radharmony_pipeline.synthetic.seeding import dataset_rng, image_rngs
from radharmony_pipeline.vocabulary import unified_class

DATASET = "chestx_det"
ROOTS = ("chestx-det",)
SIDE = 1024
SPLITS = ("train", "test")
FIRST_FILE_NUMBER, LAST_FILE_NUMBER = 36199, 70958
# Images per class in the released JSONs: how often each class is drawn here.
CLASS_IMAGES = {
    "Atelectasis": 297,
    "Calcification": 202,
    "Cardiomegaly": 293,
    "Consolidation": 1642,
    "Diffuse Nodule": 169,
    "Effusion": 1441,
    "Emphysema": 176,
    "Fibrosis": 500,
    "Fracture": 389,
    "Mass": 148,
    "Nodule": 392,
    "Pleural Thickening": 499,
    "Pneumothorax": 189,
}
CLASSES = tuple(sorted(CLASS_IMAGES))
_SINGLE_INSTANCE = {"Cardiomegaly"}


@dataclass(frozen=True)
class Sizing:
    images: dict[str, int]
    negatives: dict[str, int]
    rgba: dict[str, int]


SIZES = {
    "tiny": Sizing({"train": 8, "test": 4}, {"train": 2, "test": 1}, {"train": 1, "test": 1}),
    "small": Sizing({"train": 40, "test": 16}, {"train": 7, "test": 3}, {"train": 3, "test": 1}),
    # The documented 3,025 / 553 images.
    "full": Sizing(
        {"train": 3025, "test": 553}, {"train": 400, "test": 70}, {"train": 5, "test": 2}
    ),
}


@dataclass(frozen=True)
class Instance:
    class_name: str
    side: int
    site: str | None = None  # None: the class's usual site


@dataclass(frozen=True)
class DetImage:
    file_name: str
    split: str
    instances: tuple[Instance, ...]
    rgba: bool


def generate(out: Path, scale: str, seed: int) -> Path:
    """Write the ChestX-Det layout under `out/chestx-det`; return that root."""
    root = out / "chestx-det"
    images = plan_images(dataset_rng(seed, DATASET, 0), SIZES[scale])
    entries: dict[str, list[dict]] = {split: [] for split in SPLITS}
    for image, rng in zip(images, image_rngs(seed, DATASET, len(images)), strict=True):
        gray, entry = _render(image, rng)
        encoded = rgba_png_bytes(gray) if image.rgba else png_bytes(gray)
        write_bytes(root / image.split / image.file_name, encoded)
        entries[image.split].append(entry)
    for split in SPLITS:
        write_text(root / f"ChestX_Det_{split}.json", json.dumps(entries[split]))
    _write_counts(root, images, [entry for split in SPLITS for entry in entries[split]])
    return root


def plan_images(rng: np.random.Generator, sizing: Sizing) -> list[DetImage]:
    """Each split: an overlap case, a many-instance case, negatives, then random findings."""
    total = sum(sizing.images.values())
    numbers = iter(distinct_integers(rng, total, FIRST_FILE_NUMBER, LAST_FILE_NUMBER + 1))
    images = []
    for split in SPLITS:
        count = sizing.images[split]
        findings = [_overlapping(rng), _several_of_one(rng)]
        findings += [()] * sizing.negatives[split]
        findings += [_random_findings(rng) for _ in range(count - len(findings))]
        order = rng.permutation(count)
        rgba = set(rng.choice(count, size=sizing.rgba[split], replace=False).tolist())
        images += [
            DetImage(f"{next(numbers)}.png", split, findings[i], position in rgba)
            for position, i in enumerate(order)
        ]
    return images


def _overlapping(rng: np.random.Generator) -> tuple[Instance, ...]:
    """Consolidation sharing pixels with an effusion at the same lung base."""
    side = int(rng.integers(0, 2))
    return (Instance("Effusion", side), Instance("Consolidation", side, site="lung_base"))


def _several_of_one(rng: np.random.Generator) -> tuple[Instance, ...]:
    return tuple(Instance("Nodule", int(rng.integers(0, 2))) for _ in range(3))


def _random_findings(rng: np.random.Generator) -> tuple[Instance, ...]:
    weights = np.array([CLASS_IMAGES[name] for name in CLASSES], dtype=float)
    chosen = rng.choice(
        CLASSES, size=int(rng.integers(1, 4)), replace=False, p=weights / weights.sum()
    )
    instances = []
    for class_name in (str(name) for name in chosen):
        copies = 1 if class_name in _SINGLE_INSTANCE else int(rng.integers(1, 3))
        instances += [Instance(class_name, int(rng.integers(0, 2))) for _ in range(copies)]
    return tuple(instances)


def _render(image: DetImage, rng: np.random.Generator) -> tuple[np.ndarray, dict]:
    """8-bit pixels and the image's JSON entry (parallel syms, boxes, polygons)."""
    radiograph = render_radiograph(rng, SIDE, SIDE)
    pixels = radiograph.pixels
    entry: dict = {"file_name": image.file_name, "syms": [], "boxes": [], "polygons": []}
    for instance in image.instances:
        polygon = finding_polygon(
            unified_class(instance.class_name),
            radiograph.anatomy,
            rng,
            instance.side,
            instance.site,
        )
        pixels = paint_findings(pixels, polygon_mask([polygon], SIDE, SIDE), rng)
        entry["syms"].append(instance.class_name)
        entry["boxes"].append(list(bounding_box(polygon)))
        entry["polygons"].append(polygon.tolist())
    return to_uint8(pixels), entry


def _write_counts(root: Path, images: list[DetImage], entries: list[dict]) -> None:
    splits = {}
    for split in SPLITS:
        chosen = [image for image in images if image.split == split]
        splits[split] = {
            "images": len(chosen),
            "annotations": sum(len(image.instances) for image in chosen),
            "negatives": sum(not image.instances for image in chosen),
            "images_with_masks": sum(bool(image.instances) for image in chosen),
            "rgba_images": sum(image.rgba for image in chosen),
            **_class_counts(chosen),
        }
    total = {
        metric: sum(c[metric] for c in splits.values())
        for metric in ("images", "annotations", "negatives", "images_with_masks", "rgba_images")
    }
    total.update(_class_counts(images))
    total.update(_overlap_counts(entries))
    write_expected_counts(root, DATASET, splits, total)


def _overlap_counts(entries: list[dict]) -> dict[str, int]:
    """The card's overlap figures for these images, from their own polygons."""
    overlaps, fractions = [], []
    for entry in entries:
        polygons: dict[str, list] = {}
        for sym, polygon in zip(entry["syms"], entry["polygons"], strict=True):
            polygons.setdefault(unified_class(sym), []).append(polygon)
        masks = {name: rasterize_polygons(p, SIDE, SIDE) for name, p in polygons.items()}
        fractions += [area_fraction(mask) for mask in masks.values() if mask.any()]
        overlaps.append(image_overlap(masks))
    return overlap_figures(overlaps, fractions)


def _class_counts(images: list[DetImage]) -> dict[str, int]:
    """Images on which each class appears, and its instances."""
    class_images = Counter(
        unified_class(name) for image in images for name in {i.class_name for i in image.instances}
    )
    class_annotations = Counter(
        unified_class(i.class_name) for image in images for i in image.instances
    )
    counts = {}
    for name in sorted(class_images):
        counts[f"class_images.{name}"] = class_images[name]
        counts[f"class_annotations.{name}"] = class_annotations[name]
    return counts
