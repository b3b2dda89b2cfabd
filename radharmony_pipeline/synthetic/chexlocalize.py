"""Miniature CheXlocalize: CheXpert val/test JPEGs, label CSVs and per-pathology RLE masks."""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from pycocotools import mask as mask_utils

from radharmony_pipeline.sources.chexlocalize import SEGMENTED_PATHOLOGIES
from radharmony_pipeline.synthetic.encoding import jpeg_bytes
from radharmony_pipeline.synthetic.expected import summed, write_expected_counts
from radharmony_pipeline.synthetic.files import write_bytes, write_text
from radharmony_pipeline.synthetic.findings import finding_polygon, polygon_mask
from radharmony_pipeline.synthetic.radiograph import paint_findings, render_radiograph, to_uint8
from radharmony_pipeline.synthetic.seeding import dataset_rng, image_rngs
from radharmony_pipeline.vocabulary import CHEXPERT_COLUMNS

DATASET = "chexlocalize"
ROOTS = ("chexlocalize",)

# The label CSV columns are the reader's: both sides follow the one documented header.
LABELS = CHEXPERT_COLUMNS
# The segmentation file keeps CheXpert's older name "Airspace Opacity" for the label the CSV
# calls "Lung Opacity".
CSV_NAME_OF = {name: name for name in SEGMENTED_PATHOLOGIES} | {"Airspace Opacity": "Lung Opacity"}
LOCALIZABLE = tuple(CSV_NAME_OF[name] for name in SEGMENTED_PATHOLOGIES)
NOT_LOCALIZABLE = ("Pneumonia", "Pleural Other", "Fracture")
VAL_DEMOGRAPHICS = ("Sex", "Age", "Frontal/Lateral", "AP/PA")

FIRST_PATIENT = {"val": 64541, "test": 64741}
# The real test split's documented quirk: positive labels, yet no segmentation entry.
UNSEGMENTED_PATIENT = 65086
# Pathologies that are usually bilateral get one outline per lung.
_BILATERAL = {"Edema"}


@dataclass(frozen=True)
class Sizing:
    patients: dict[str, int]
    side: tuple[int, int]


SIZES = {
    "tiny": Sizing({"val": 3, "test": 4}, (180, 320)),
    "small": Sizing({"val": 12, "test": 24}, (500, 900)),
    # The documented patients (200 / 500); small films keep rendering quick.
    "full": Sizing({"val": 200, "test": 500}, (320, 640)),
}


@dataclass(frozen=True)
class CxrImage:
    """One CheXpert image and the labels of its study."""

    split: str
    patient: int
    study: int
    view_number: int
    view: str
    height: int
    width: int
    sex: str
    age: int
    ap_pa: str
    positives: frozenset[str]
    segmented: bool

    @property
    def relative_path(self) -> str:
        return (
            f"{self.split}/patient{self.patient}/study{self.study}/"
            f"view{self.view_number}_{self.view}.jpg"
        )

    @property
    def cxr_id(self) -> str:
        return f"patient{self.patient}_study{self.study}_view{self.view_number}_{self.view}"


# The first patients of each split are fixed so every scale and seed shows the variety:
# two positive studies with laterals, then a normal patient; the rest are random.
_ROLES = ("showcase", "normal")


@dataclass(frozen=True)
class _Role:
    studies: int | None  # None: 1 or 2 at random
    findings: str  # "positive", "negative" or "random"
    lateral: bool | None  # None: at random
    segmented: bool


_ROLE_RULES = {
    "showcase": _Role(2, "positive", True, True),
    "normal": _Role(None, "negative", None, True),
    "random": _Role(None, "random", None, True),
    "unsegmented": _Role(1, "positive", False, False),
}


def generate(out: Path, scale: str, seed: int) -> Path:
    """Write the CheXlocalize layout under `out/chexlocalize`; return that root."""
    root = out / "chexlocalize"
    images = plan_images(dataset_rng(seed, DATASET, 0), SIZES[scale])
    segmentations: dict[str, dict[str, dict]] = {"val": {}, "test": {}}
    for image, rng in zip(images, image_rngs(seed, DATASET, len(images)), strict=True):
        pixels, masks = _render(image, rng)
        write_bytes(root / "CheXpert" / image.relative_path, jpeg_bytes(to_uint8(pixels)))
        if image.segmented:
            segmentations[image.split][image.cxr_id] = _segmentation_entry(masks, image)
    for split in ("val", "test"):
        rows = [image for image in images if image.split == split]
        write_text(root / "CheXpert" / f"{split}_labels.csv", _labels_csv(split, rows))
        write_text(
            root / "CheXlocalize" / f"gt_segmentations_{split}.json",
            json.dumps(segmentations[split]),
        )
    _write_counts(root, images)
    return root


def plan_images(rng: np.random.Generator, sizing: Sizing) -> list[CxrImage]:
    """Patients, studies, views and labels of both splits, before any pixel is drawn."""
    images: list[CxrImage] = []
    for split in ("val", "test"):
        for index in range(sizing.patients[split]):
            patient = FIRST_PATIENT[split] + index
            if patient == UNSEGMENTED_PATIENT:  # one of the test patients at the full count
                continue
            role = _ROLES[index] if index < len(_ROLES) else "random"
            images += _patient_images(rng, sizing, split, patient, role)
    images += _patient_images(rng, sizing, "test", UNSEGMENTED_PATIENT, "unsegmented")
    return images


def _patient_images(
    rng: np.random.Generator, sizing: Sizing, split: str, patient: int, role_name: str
) -> list[CxrImage]:
    role = _ROLE_RULES[role_name]
    studies = role.studies or int(rng.integers(1, 3))
    sex, age = str(rng.choice(["Male", "Female"])), int(rng.integers(18, 91))
    images = []
    for study in range(1, studies + 1):
        positives = _study_findings(rng, role.findings)
        lateral = rng.random() < 0.45 if role.lateral is None else role.lateral
        localizable = bool(positives & set(LOCALIZABLE))
        for number, view in enumerate(("frontal", "lateral") if lateral else ("frontal",), 1):
            height, width = _image_size(rng, sizing.side)
            ap_pa = str(rng.choice(["AP", "PA"], p=[0.7, 0.3])) if view == "frontal" else ""
            segmented = role.segmented and view == "frontal" and localizable
            images.append(
                CxrImage(
                    split,
                    patient,
                    study,
                    number,
                    view,
                    height,
                    width,
                    sex,
                    age,
                    ap_pa,
                    positives,
                    segmented,
                )
            )
    return images


def _study_findings(rng: np.random.Generator, kind: str) -> frozenset[str]:
    """Positive CSV labels of a study; empty means No Finding."""
    draw = rng.random()
    if kind == "negative" or (kind == "random" and draw < 0.25):
        return frozenset()
    if kind == "random" and draw < 0.35:
        return frozenset({str(rng.choice(NOT_LOCALIZABLE))})
    count = 2 if kind == "positive" else int(rng.integers(1, 4))
    chosen = {str(name) for name in rng.choice(LOCALIZABLE, size=count, replace=False)}
    if rng.random() < 0.2:
        chosen.add(str(rng.choice(NOT_LOCALIZABLE)))
    return frozenset(chosen)


def _image_size(rng: np.random.Generator, side: tuple[int, int]) -> tuple[int, int]:
    height, width = (int(v) for v in rng.integers(side[0], side[1] + 1, size=2))
    # Real CheXpert images are rarely square; keep every one non-square.
    return height, width + 1 if width == height else width


def _render(image: CxrImage, rng: np.random.Generator) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Pixels with each localizable finding painted where its mask says (frontals only)."""
    radiograph = render_radiograph(rng, image.height, image.width, image.view)
    pixels, masks = radiograph.pixels, {}
    if image.view != "frontal":
        return pixels, masks
    for pathology in SEGMENTED_PATHOLOGIES:
        if CSV_NAME_OF[pathology] not in image.positives:
            continue
        finding = CSV_NAME_OF[pathology].lower().replace(" ", "_")
        sides = (0, 1) if pathology in _BILATERAL else (None,)
        polygons = [finding_polygon(finding, radiograph.anatomy, rng, side) for side in sides]
        masks[pathology] = polygon_mask(polygons, image.height, image.width)
        pixels = paint_findings(pixels, masks[pathology], rng)
    return pixels, masks


def _segmentation_entry(masks: dict[str, np.ndarray], image: CxrImage) -> dict[str, dict]:
    """All ten pathologies; an absent one is the RLE of an all-zero mask."""
    empty = np.zeros((image.height, image.width), dtype=np.uint8)
    return {pathology: _rle(masks.get(pathology, empty)) for pathology in SEGMENTED_PATHOLOGIES}


def _rle(mask: np.ndarray) -> dict:
    encoded = mask_utils.encode(np.asfortranarray(mask))
    return {"size": [int(v) for v in encoded["size"]], "counts": encoded["counts"].decode()}


def _labels_csv(split: str, images: list[CxrImage]) -> str:
    """test: `Path` + 14 labels as 0.0/1.0; val: the full CheXpert header, prefixed paths."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    if split == "test":
        writer.writerow(["Path", *LABELS])
        for image in images:
            writer.writerow([image.relative_path, *_label_values(image, "0.0", "1.0")])
        return buffer.getvalue()
    writer.writerow(["Path", *VAL_DEMOGRAPHICS, *LABELS])
    for image in images:
        path = "CheXpert-v1.0/valid/" + image.relative_path.split("/", 1)[1]
        writer.writerow(
            [
                path,
                image.sex,
                image.age,
                image.view.capitalize(),
                image.ap_pa,
                *_label_values(image, "0", "1"),
            ]
        )
    return buffer.getvalue()


def _label_values(image: CxrImage, negative: str, positive: str) -> list[str]:
    no_finding = not image.positives
    return [
        positive if (label == "No Finding" and no_finding) or label in image.positives else negative
        for label in LABELS
    ]


def _write_counts(root: Path, images: list[CxrImage]) -> None:
    splits = {}
    for split in ("val", "test"):
        rows = [image for image in images if image.split == split]
        splits[split] = {
            "images": len(rows),
            "patients": len({image.patient for image in rows}),
            "studies": len({(image.patient, image.study) for image in rows}),
            "images_with_segmentation": sum(image.segmented for image in rows),
            # Entries exist only for images with a positive localizable finding.
            "images_with_masks": sum(image.segmented for image in rows),
            # Labels are written 0/1 only, and every entry holds all ten pathologies.
            "uncertain_labels": 0,
            "entries_without_the_10_pathologies": 0,
        }
    total = summed(
        splits, ("images", "patients", "studies", "images_with_segmentation", "images_with_masks")
    )
    write_expected_counts(root, DATASET, splits, total)
