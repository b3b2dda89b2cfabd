"""Miniature MS-CXR v1.1.0: the phrase-box CSV over a MIMIC-CXR JPG and/or DICOM tree."""

from __future__ import annotations

import csv
import gzip
import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from radharmony_pipeline.sources.mimic_chexpert import CHEXPERT_NAMES, STUDY_COLUMNS
from radharmony_pipeline.sources.ms_cxr import CATEGORIES, CSV_COLUMNS, CSV_NAME
from radharmony_pipeline.synthetic.dicom import COVERING_VARIANTS, DicomIdentity, DicomVariant
from radharmony_pipeline.synthetic.dicom import dicom_bytes as encode_dicom
from radharmony_pipeline.synthetic.encoding import jpeg_bytes
from radharmony_pipeline.synthetic.expected import write_expected_counts
from radharmony_pipeline.synthetic.files import write_bytes, write_text
from radharmony_pipeline.synthetic.findings import bounding_box, finding_polygon, polygon_mask
from radharmony_pipeline.synthetic.identifiers import (
    UUID_UID_ROOT,
    dicom_uids,
    distinct_integers,
    mimic_dicom_ids,
)
from radharmony_pipeline.synthetic.radiograph import paint_findings, render_radiograph, to_uint8
from radharmony_pipeline.synthetic.seeding import dataset_rng, image_rngs
from radharmony_pipeline.vocabulary import CHEXPERT_COLUMNS

DATASET = "ms_cxr"
ROOTS = ("ms-cxr", "mimic-cxr")
COLUMNS = CSV_COLUMNS
MIMIC_FORMATS = ("jpg", "dcm", "mixed")
VIEW_METADATA_NAME = "mimic-cxr-2.0.0-metadata.csv.gz"
VIEW_METADATA_COLUMNS = (
    "dicom_id",
    "subject_id",
    "study_id",
    "PerformedProcedureStepDescription",
    "ViewPosition",
    "Rows",
    "Columns",
    "StudyDate",
    "StudyTime",
    "ProcedureCodeSequence_CodeMeaning",
    "ViewCodeSequence_CodeMeaning",
    "PatientOrientationCodeSequence_CodeMeaning",
)
_VIEW_CODE_MEANINGS = {"PA": "postero-anterior", "AP": "antero-posterior"}

# Phrases name the patient's side: image left (side 0) is the patient's right.
_SIDE_NAMES = ("right", "left")
_ONE_SIDED = {
    "Atelectasis": ("{side} basilar atelectasis", "Subsegmental atelectasis at the {side} base"),
    "Cardiomegaly": ("Cardiomegaly", "Moderately enlarged cardiac silhouette"),
    "Consolidation": ("{side} lower lobe consolidation", "Consolidation, {side} mid lung"),
    "Edema": ("Mild pulmonary edema", "Interstitial edema in the {side} lung"),
    "Lung Opacity": ("Patchy opacity, {side} lower lung", "{side} upper lobe opacity"),
    "Pleural Effusion": ("Small {side} pleural effusion", "{side} pleural effusion"),
    "Pneumonia": ("{side} lower lobe pneumonia", "Pneumonia in the {side} lung base"),
    "Pneumothorax": ("Small {side} apical pneumothorax", "{side} pneumothorax"),
}
# A single finding: never split over several boxes.
_SINGLE_BOX = {"Cardiomegaly"}
# Phrases of several boxes carry a comma, so every file exercises CSV quoting.
_SEVERAL_BOXES = {
    "Atelectasis": "Bibasilar atelectasis, left greater than right",
    "Consolidation": "Bilateral consolidations, worse on the right",
    "Edema": "Moderate pulmonary edema, slightly improved",
    "Lung Opacity": "Bilateral patchy opacities, likely infectious",
    "Pleural Effusion": "Small bilateral pleural effusions, unchanged",
    "Pneumonia": "Multifocal pneumonia, both lower lobes",
    "Pneumothorax": "Bilateral pneumothoraces, small",
}


@dataclass(frozen=True)
class Sizing:
    patients: int
    side: tuple[int, int]


# The stream of the CheXpert label file's choices (0 plans the images, 1 renders them).
_LABEL_STREAM = 2
# "full": patients enough for about the documented 1,047 images (a tenth have two studies).
SIZES = {
    "tiny": Sizing(8, (200, 400)),
    "small": Sizing(40, (500, 900)),
    "full": Sizing(950, (320, 640)),
}


@dataclass(frozen=True)
class Phrase:
    category: str
    sides: tuple[int, ...]  # one lung side per box

    def text(self, rng: np.random.Generator) -> str:
        if len(self.sides) > 1:
            return _SEVERAL_BOXES[self.category]
        template = str(rng.choice(_ONE_SIDED[self.category]))
        text = template.replace("{side}", _SIDE_NAMES[self.sides[0]])
        return text[0].upper() + text[1:]


@dataclass(frozen=True)
class MimicImage:
    dicom_id: str
    subject: int
    study: int
    split: str
    height: int
    width: int
    phrases: tuple[Phrase, ...]
    variant: DicomVariant | None  # None: written as JPEG
    view_position: str

    def folder(self) -> str:
        return f"files/p{str(self.subject)[:2]}/p{self.subject}/s{self.study}"

    @property
    def csv_path(self) -> str:
        return f"{self.folder()}/{self.dicom_id}.jpg"

    @property
    def disk_path(self) -> str:
        return f"{self.folder()}/{self.dicom_id}.{'jpg' if self.variant is None else 'dcm'}"


def generate(out: Path, scale: str, seed: int, mimic_format: str = "mixed") -> Path:
    """Write `out/ms-cxr/<CSV>` and the images under `out/mimic-cxr/files`; return ms-cxr."""
    if mimic_format not in MIMIC_FORMATS:
        raise ValueError(
            f"mimic_format must be one of {', '.join(MIMIC_FORMATS)}, got {mimic_format!r}"
        )
    rng = dataset_rng(seed, DATASET, 0)
    images = plan_images(rng, SIZES[scale], mimic_format)
    uids = iter(dicom_uids(rng, 3 * len(images), root=UUID_UID_ROOT, digits=38))
    rows = []
    for image, image_rng in zip(images, image_rngs(seed, DATASET, len(images)), strict=True):
        pixels, boxes = _render(image, image_rng)
        identity = DicomIdentity(
            str(image.subject), next(uids), next(uids), next(uids), image.view_position
        )
        write_bytes(out / "mimic-cxr" / image.disk_path, _encode(pixels, image, identity))
        rows += _csv_rows(image, boxes, image_rng)
    _write_view_metadata(out / "mimic-cxr", images)
    _write_chexpert_labels(out / "mimic-cxr", images, dataset_rng(seed, DATASET, _LABEL_STREAM))
    root = out / "ms-cxr"
    write_text(root / CSV_NAME, _csv_text(rows))
    _write_counts(root, images)
    return root


def plan_images(rng: np.random.Generator, sizing: Sizing, mimic_format: str) -> list[MimicImage]:
    """Patients (the first with two studies), splits by patient, phrases and file formats."""
    subjects = distinct_integers(rng, sizing.patients, 10_000_000, 20_000_000)
    studies_per_subject = [2] + [2 if rng.random() < 0.1 else 1 for _ in subjects[1:]]
    count = sum(studies_per_subject)
    study_ids = iter(distinct_integers(rng, count, 50_000_000, 60_000_000))
    dicom_ids = iter(mimic_dicom_ids(rng, count))
    splits = _patient_splits(sizing.patients)
    phrase_sets = iter(_phrase_sets(rng, count))
    variants = iter(_file_variants(rng, count, mimic_format))
    images = []
    for subject, studies, split in zip(subjects, studies_per_subject, splits, strict=True):
        for _ in range(studies):
            height, width = (int(v) for v in rng.integers(sizing.side[0], sizing.side[1] + 1, 2))
            width += int(width == height)
            view = str(rng.choice(["PA", "AP"]))
            images.append(
                MimicImage(
                    next(dicom_ids),
                    subject,
                    next(study_ids),
                    split,
                    height,
                    width,
                    next(phrase_sets),
                    next(variants),
                    view,
                )
            )
    return images


def _patient_splits(patients: int) -> list[str]:
    """train first, then val and test, each at least one patient (split by patient)."""
    val = max(1, round(0.15 * patients))
    test = max(1, round(0.2 * patients))
    return ["train"] * (patients - val - test) + ["val"] * val + ["test"] * test


def _phrase_sets(rng: np.random.Generator, count: int) -> list[tuple[Phrase, ...]]:
    """Per image 1-2 phrases of different categories; the first images show the variety."""
    cycle = [str(c) for c in rng.permutation(CATEGORIES)]
    sets = []
    for index in range(count):
        phrases = 2 if index == 0 else 1 if index == 1 else 1 + int(rng.random() < 0.3)
        chosen: list[Phrase] = []
        for number in range(phrases):
            # The first image has a two-box phrase, the second a three-box one.
            forced = {(0, 0): 2, (1, 0): 3}.get((index, number))
            category = next(
                c
                for c in cycle
                if c not in {p.category for p in chosen} and not (forced and c in _SINGLE_BOX)
            )
            cycle.remove(category)
            cycle.append(category)
            boxes = forced or (1 if category in _SINGLE_BOX else 1 + int(rng.random() < 0.2))
            # Several boxes of one phrase start with one per lung.
            sides = (0, 1, int(rng.integers(0, 2)))[:boxes]
            if boxes == 1:
                sides = (int(rng.integers(0, 2)),)
            chosen.append(Phrase(category, sides))
        sets.append(tuple(chosen))
    return sets


def _file_variants(
    rng: np.random.Generator, count: int, mimic_format: str
) -> list[DicomVariant | None]:
    """Per image: None for JPEG, else how the DICOM stores pixels; mixed covers every kind."""
    if mimic_format == "jpg":
        return [None] * count
    jpeg_share = 0.5 if mimic_format == "mixed" else 0.0
    chosen: list[DicomVariant | None] = list(COVERING_VARIANTS)
    if mimic_format == "mixed":
        chosen += [None, None]
    if count < len(chosen):
        raise ValueError(f"{count} images cannot cover the {len(chosen)} file variants")
    for _ in range(count - len(chosen)):
        pick = COVERING_VARIANTS[int(rng.integers(0, len(COVERING_VARIANTS)))]
        chosen.append(None if rng.random() < jpeg_share else pick)
    return [chosen[i] for i in rng.permutation(count)]


def _render(
    image: MimicImage, rng: np.random.Generator
) -> tuple[np.ndarray, list[list[tuple[int, int, int, int]]]]:
    """Pixels with each box's finding painted, and the (x, y, w, h) boxes of each phrase."""
    radiograph = render_radiograph(rng, image.height, image.width)
    pixels, boxes = radiograph.pixels, []
    for phrase in image.phrases:
        finding = phrase.category.lower().replace(" ", "_")
        phrase_boxes = []
        for side in phrase.sides:
            polygon = finding_polygon(finding, radiograph.anatomy, rng, side)
            pixels = paint_findings(pixels, polygon_mask([polygon], *pixels.shape), rng)
            x1, y1, x2, y2 = bounding_box(polygon)
            phrase_boxes.append((x1, y1, x2 - x1 + 1, y2 - y1 + 1))
        boxes.append(phrase_boxes)
    return pixels, boxes


def _encode(pixels: np.ndarray, image: MimicImage, identity: DicomIdentity) -> bytes:
    if image.variant is None:
        return jpeg_bytes(to_uint8(pixels))
    return encode_dicom(pixels, image.variant, identity)


def _csv_rows(
    image: MimicImage, boxes: list[list[tuple[int, int, int, int]]], rng: np.random.Generator
) -> list[list[object]]:
    rows = []
    for phrase, phrase_boxes in zip(image.phrases, boxes, strict=True):
        text = phrase.text(rng)
        for x, y, w, h in phrase_boxes:
            rows.append(
                [
                    image.dicom_id,
                    phrase.category,
                    text,
                    image.csv_path,
                    x,
                    y,
                    w,
                    h,
                    image.width,
                    image.height,
                    image.split,
                ]
            )
    return rows


def _csv_text(rows: list[list[object]], columns: tuple[str, ...] = COLUMNS) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(columns)
    writer.writerows(rows)
    return buffer.getvalue()


def _write_view_metadata(mimic_root: Path, images: list[MimicImage]) -> None:
    """`mimic-cxr-2.0.0-metadata.csv.gz` as MIMIC-CXR-JPG ships it, listing the JPG images.

    DICOM images are left out on purpose: their view position then comes from the header
    tag, so one mixed tree exercises both sources. A DICOM-only tree has no such file.
    """
    listed = [image for image in images if image.variant is None]
    if not listed:
        return
    rows = [
        [
            image.dicom_id,
            image.subject,
            image.study,
            "CHEST (PA AND LAT)",
            image.view_position,
            image.height,
            image.width,
            "21800101",
            "120000.000",
            "CHEST (PA AND LAT)",
            _VIEW_CODE_MEANINGS[image.view_position],
            "Erect",
        ]
        for image in listed
    ]
    text = _csv_text(rows, VIEW_METADATA_COLUMNS)
    write_bytes(mimic_root / VIEW_METADATA_NAME, gzip.compress(text.encode(), mtime=0))


def _write_chexpert_labels(
    mimic_root: Path, images: list[MimicImage], rng: np.random.Generator
) -> None:
    """`mimic-cxr-2.0.0-chexpert.csv.gz` as MIMIC-CXR-JPG ships it: per study, the CheXpert
    observations (alphabetical, as there) as 1.0 / 0.0 / -1.0 or blank. The study's grounded
    categories are positive; one other observation is negative or uncertain, the rest blank."""
    observations = sorted(CHEXPERT_COLUMNS)
    studies = {image.study: image for image in images}
    rows = []
    for study, image in sorted(studies.items()):
        values = dict.fromkeys(observations, "")
        for phrase in image.phrases:
            values[phrase.category] = "1.0"
        others = [o for o in observations if not values[o] and o != "No Finding"]
        values[str(rng.choice(others))] = str(rng.choice(["0.0", "-1.0"]))
        rows.append([image.subject, study, *values.values()])
    text = _csv_text(rows, (*STUDY_COLUMNS, *observations))
    write_bytes(mimic_root / CHEXPERT_NAMES[0], gzip.compress(text.encode(), mtime=0))


def _write_counts(root: Path, images: list[MimicImage]) -> None:
    splits = {}
    for split in ("train", "val", "test"):
        chosen = [image for image in images if image.split == split]
        splits[split] = {
            "images": len(chosen),
            "patients": len({image.subject for image in chosen}),
            "studies": len({image.study for image in chosen}),
            "annotations": sum(len(p.sides) for image in chosen for p in image.phrases),
        }
    total = {"images": len(images), "annotations": sum(c["annotations"] for c in splits.values())}
    write_expected_counts(root, DATASET, splits, total)
