"""Miniature (or full-size, metadata only) ReXGradient-160K: per-split study JSONs and PNGs."""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from radharmony_pipeline.sources.rexgradient import FILE_SPLITS, REPORT_SECTIONS, STUDY_FIELDS
from radharmony_pipeline.synthetic.encoding import PNG_COMPRESS_LEVEL, png_bytes
from radharmony_pipeline.synthetic.expected import summed, write_expected_counts
from radharmony_pipeline.synthetic.files import write_bytes, write_text, write_text_chunks
from radharmony_pipeline.synthetic.identifiers import dicom_uids, grdn_codes
from radharmony_pipeline.synthetic.radiograph import render_radiograph, to_uint8, to_unsigned
from radharmony_pipeline.synthetic.reports import (
    COMPARISONS,
    FINDINGS,
    IMPRESSIONS,
    INDICATIONS,
    sentences,
)
from radharmony_pipeline.synthetic.seeding import dataset_rng

DATASET = "rexgradient"
ROOTS = ("rexgradient",)
METADATA_DIR = "download/metadata"
IMAGE_PREFIX = "../deid_png/"
SPLIT_FILES = FILE_SPLITS
VIEW_POSITIONS = (
    "PA",
    "AP",
    "LATERAL",
    "LL",
    "POSTERO_ANTERIOR",
    "LAO",
    "RAO",
    "UNKNOWN",
    "N/A",
    "AP (KUB)",
    None,
)
VIEW_WEIGHTS = (0.375, 0.3, 0.24, 0.02, 0.015, 0.005, 0.005, 0.01, 0.005, 0.005, 0.02)
LATERAL_VIEWS = {"LATERAL", "LL"}
ETHNIC_GROUPS = ("White", "Black or African American", "Hispanic", "Asian", "Other")
# The CSV twin of the metadata JSON: a study per row, in the JSON's field order.
CSV_COLUMNS = ("id", *STUDY_FIELDS)
_AGE_UNITS = (("Y", 1, 90, 0.94), ("M", 1, 24, 0.04), ("W", 1, 9, 0.01), ("D", 1, 31, 0.01))


@dataclass(frozen=True)
class SplitSize:
    studies: int
    images: int
    patients: int


FULL_SCALE = {
    "train": SplitSize(140_000, 238_968, 95_716),
    "val": SplitSize(10_000, 17_007, 6_964),
    "test": SplitSize(10_000, 17_029, 6_807),
}
SIZES = {
    "tiny": {"train": SplitSize(6, 10, 4), "val": SplitSize(3, 5, 2), "test": SplitSize(3, 5, 2)},
    "small": {
        "train": SplitSize(30, 50, 20),
        "val": SplitSize(8, 14, 6),
        "test": SplitSize(8, 14, 6),
    },
    "full": FULL_SCALE,
}
# PNG sides after the release's 25 % downsampling (tiny/small keep tests and demos fast).
IMAGE_SIDES = {"tiny": (200, 360), "small": (400, 700), "full": (480, 1100)}

Study = dict  # one JSON value: parallel image lists, report sections, demographics


def generate(out: Path, scale: str, seed: int) -> Path:
    """Write metadata and PNGs under `out/rexgradient`; return that root."""
    root = out / "rexgradient"
    studies = write_metadata(root, seed, SIZES[scale], IMAGE_SIDES[scale])
    for split_index, split in enumerate(SPLIT_FILES):
        write_images(root, seed, split_index, studies[split])
    return root


def write_full_scale(out: Path, seed: int) -> Path:
    """Write the release-sized metadata (no images) under `out/rexgradient`; return it."""
    root = out / "rexgradient"
    write_metadata(root, seed, FULL_SCALE, IMAGE_SIDES["full"])
    return root


def write_metadata(
    root: Path, seed: int, sizes: dict[str, SplitSize], sides: tuple[int, int]
) -> dict[str, list[tuple[str, Study]]]:
    """Per split the view-position JSON and the study CSV, plus expected_counts.json."""
    studies = plan_studies(seed, sizes, sides)
    write_planned_metadata(root, studies)
    return studies


def plan_studies(
    seed: int, sizes: dict[str, SplitSize], sides: tuple[int, int]
) -> dict[str, list[tuple[str, Study]]]:
    """Every split's studies, as write_metadata writes them (nothing written)."""
    return {
        split: plan_split(dataset_rng(seed, DATASET, 0, split_index), sizes[split], sides)
        for split_index, split in enumerate(SPLIT_FILES)
    }


def write_planned_metadata(root: Path, studies: dict[str, list[tuple[str, Study]]]) -> None:
    """The metadata files of studies already planned (e.g. a share of a larger plan)."""
    metadata = root / METADATA_DIR
    counts = {}
    for split, stem in SPLIT_FILES.items():
        write_text_chunks(
            metadata / f"{stem}_metadata_view_position.json", _json_chunks(studies[split])
        )
        write_text(metadata / f"{stem}_metadata.csv", _csv_text(studies[split]))
        counts[split] = _split_counts(studies[split])
    write_expected_counts(root, DATASET, counts, summed(counts, ("images", "studies", "patients")))


def plan_split(
    rng: np.random.Generator, size: SplitSize, sides: tuple[int, int]
) -> list[tuple[str, Study]]:
    """Studies of one split keyed `p<PatientID>_a<AccessionNumber>_s<StudyInstanceUid>`."""
    if not size.patients <= size.studies <= size.images:
        raise ValueError(f"need patients <= studies <= images, got {size}")
    patients = grdn_codes(rng, size.patients)
    accessions = grdn_codes(rng, size.studies)
    study_uids = dicom_uids(rng, size.studies)
    series_uids = dicom_uids(rng, size.images)
    instance_uids = dicom_uids(rng, size.images)
    owners = _study_owners(rng, size)
    bounds = np.concatenate([[0], np.cumsum(_images_per_study(rng, size))]).tolist()
    images = _image_columns(rng, size.images, sides)
    people = _patient_columns(rng, size.patients)
    sections = _report_sections(rng, size.studies)
    dates = _study_dates(rng, size.studies)
    studies = []
    for s in range(size.studies):
        lo, hi = bounds[s], bounds[s + 1]
        patient, accession, uid = patients[owners[s]], accessions[s], study_uids[s]
        folder = f"{IMAGE_PREFIX}{patient}/{accession}/studies/{uid}/series/"
        study: Study = {
            "ImagePath": [
                f"{folder}{series_uids[i]}/instances/{instance_uids[i]}.png" for i in range(lo, hi)
            ],
            **{key: values[lo:hi] for key, values in images.items()},
            **{key: values[s] for key, values in sections.items()},
            "PatientID": patient,
            "AccessionNumber": accession,
            "StudyInstanceUid": uid,
            **{
                key: values[owners[s]]
                for key, values in people.items()
                if values[owners[s]] is not None
            },
            "StudyDate": dates[s],
        }
        studies.append((f"p{patient}_a{accession}_s{uid}", study))
    _shorten_one_body_part_list(studies)
    return studies


def _study_owners(rng: np.random.Generator, size: SplitSize) -> list[int]:
    """Patient index per study: everyone has one, some have several."""
    extra = rng.integers(0, size.patients, size.studies - size.patients)
    return rng.permutation(np.concatenate([np.arange(size.patients), extra])).tolist()


def _images_per_study(rng: np.random.Generator, size: SplitSize) -> np.ndarray:
    """1 to 3 images per study summing to exactly `size.images`."""
    extra = size.images - size.studies
    triples = extra // 10
    doubles = extra - 2 * triples
    if doubles + triples > size.studies:
        raise ValueError(f"{size.images} images do not fit 1-3 per study in {size.studies}")
    counts = np.ones(size.studies, dtype=np.int64)
    grown = rng.choice(size.studies, size=doubles + triples, replace=False)
    counts[grown[:triples]] += 2
    counts[grown[triples:]] += 1
    return counts


def _image_columns(rng: np.random.Generator, count: int, sides: tuple[int, int]) -> dict[str, list]:
    views = rng.choice(len(VIEW_POSITIONS), size=count, p=VIEW_WEIGHTS).tolist()
    view_positions = [VIEW_POSITIONS[v] for v in views]
    # Rare spellings would seldom be drawn in a small split: place each once where room allows
    # (rarest first), so every split exercises the reader's normalization.
    rare_first = sorted(VIEW_POSITIONS[:-1], key=lambda v: VIEW_WEIGHTS[VIEW_POSITIONS.index(v)])
    slots = rng.permutation(count - 1)[: len(rare_first)].tolist()
    for slot, view in zip(slots, rare_first, strict=False):
        view_positions[slot] = view
    view_positions[-1] = None  # every split shows the ~2 % null views at least once
    shapes = rng.integers(sides[0], sides[1] + 1, size=(count, 2)).tolist()
    modality = np.where(rng.random(count) < 0.7, "DX", "CR").tolist()
    body_part = np.array(["CHEST", "PORT CHEST", "THORAX"])[
        rng.choice(3, size=count, p=[0.9, 0.07, 0.03])
    ].tolist()
    return {
        "ImageViewPosition": view_positions,
        "ImageShape": shapes,
        "ImageModality": modality,
        "ImageBodyPart": body_part,
    }


def _patient_columns(rng: np.random.Generator, count: int) -> dict[str, list]:
    sexes = np.where(rng.random(count) < 0.5, "M", "F").tolist()
    groups = rng.integers(0, len(ETHNIC_GROUPS), count).tolist()
    recorded = (rng.random(count) < 0.3).tolist()
    recorded[0] = True  # the tag is optional: make sure a tiny split shows it
    ethnic = [ETHNIC_GROUPS[g] if r else None for g, r in zip(groups, recorded, strict=True)]
    return {"PatientSex": sexes, "PatientAge": _ages(rng, count), "EthnicGroup": ethnic}


def _ages(rng: np.random.Generator, count: int) -> list[str]:
    """DICOM age strings: three digits and a unit, `014Y`, `007M`, `003W`, `002D`."""
    units = rng.choice(len(_AGE_UNITS), size=count, p=[u[3] for u in _AGE_UNITS]).tolist()
    draws = rng.random(count).tolist()
    ages = []
    for unit_index, draw in zip(units, draws, strict=True):
        unit, low, high, _ = _AGE_UNITS[unit_index]
        ages.append(f"{low + int(draw * (high - low)):03d}{unit}")
    ages[:4] = ["014Y", "007M", "003W", "002D"][:count]
    return ages


def _report_sections(rng: np.random.Generator, count: int) -> dict[str, list]:
    """The four sections, with the release's empty strings, "None" strings and NaNs."""
    sections = {
        "Indication": _with_gaps(rng, sentences(rng, INDICATIONS, count, 1, 2), 0.05, 0.0, 0.03),
        "Comparison": _with_gaps(rng, sentences(rng, COMPARISONS, count, 1, 1), 0.05, 0.35, 0.05),
        "Findings": _with_gaps(rng, sentences(rng, FINDINGS, count, 3, 6), 0.02, 0.0, 0.03),
        "Impression": _with_gaps(rng, sentences(rng, IMPRESSIONS, count, 1, 2), 0.01, 0.0, 0.02),
    }
    if count > 1:
        # One study whose report is entirely missing, in every form the release uses.
        for section, gap in zip(REPORT_SECTIONS, ("", "None", math.nan, math.nan), strict=True):
            sections[section][1] = gap
    return sections


def _with_gaps(
    rng: np.random.Generator, texts: list[str], empty: float, none: float, nan: float
) -> list:
    draws = rng.random(len(texts)).tolist()
    return [
        ""
        if d < empty
        else "None"
        if d < empty + none
        else math.nan
        if d < empty + none + nan
        else text
        for d, text in zip(draws, texts, strict=True)
    ]


def _study_dates(rng: np.random.Generator, count: int) -> list[int | str]:
    """YYYYMMDD, an int for some studies and a string for others, as in the release."""
    days = np.datetime64("2008-01-01") + rng.integers(0, 15 * 365, count).astype("timedelta64[D]")
    text = [d.replace("-", "") for d in np.datetime_as_string(days).tolist()]
    as_int = (rng.random(count) < 0.5).tolist()
    as_int[:2] = [True, False][:count]
    return [int(t) if flag else t for t, flag in zip(text, as_int, strict=True)]


def _shorten_one_body_part_list(studies: list[tuple[str, Study]]) -> None:
    """The release's lists are occasionally shorter than ImagePath: the first multi-image
    study loses its last body part, the second its last view position."""
    multi_image = [study for _, study in studies if len(study["ImagePath"]) > 1]
    for study, key in zip(multi_image, ("ImageBodyPart", "ImageViewPosition"), strict=False):
        study[key] = study[key][:-1]


def _json_chunks(studies: list[tuple[str, Study]]) -> Iterator[str]:
    """json.dumps of the whole object, one study at a time; NaN stays a bare `NaN` token."""
    yield "{"
    for index, (key, study) in enumerate(studies):
        yield f"{', ' if index else ''}{json.dumps(key)}: {json.dumps(study)}"
    yield "}"


def _csv_text(studies: list[tuple[str, Study]]) -> str:
    """One row per study, no image paths; missing sections are empty cells."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for key, study in studies:
        row = [key, *(study[column] for column in CSV_COLUMNS[1:7])]
        row += ["" if isinstance(study[s], float) else study[s] for s in REPORT_SECTIONS]
        writer.writerow(row)
    return buffer.getvalue()


def _split_counts(studies: list[tuple[str, Study]]) -> dict[str, int]:
    return {
        "images": sum(len(study["ImagePath"]) for _, study in studies),
        "studies": len(studies),
        "patients": len({study["PatientID"] for _, study in studies}),
    }


def write_images(
    root: Path,
    seed: int,
    split_index: int,
    studies: list[tuple[str, Study]],
    first_index: int = 0,
    compress_level: int = PNG_COMPRESS_LEVEL,
) -> None:
    """One PNG per ImagePath, of its ImageShape; 8-bit or 16-bit (first two: one of each).

    `first_index` is the split-wide number of the first study's first image, so a split
    written in chunks (in parallel) gets the same files as one written whole.
    """
    index = first_index
    for _, study in studies:
        # ImageViewPosition may be one short: the missing view renders as a frontal film.
        views = study["ImageViewPosition"] + [None] * len(study["ImagePath"])
        for path, view, (height, width) in zip(
            study["ImagePath"], views, study["ImageShape"], strict=False
        ):
            rng = dataset_rng(seed, DATASET, 1, split_index, index)
            view_kind = "lateral" if view in LATERAL_VIEWS else "frontal"
            pixels = render_radiograph(rng, height, width, view_kind).pixels
            sixteen_bit = index == 0 or (index > 1 and rng.random() < 0.5)
            if sixteen_bit:
                # Some 16-bit PNGs use the full range, some only 12 bits of it.
                gray = to_unsigned(pixels, 16 if rng.random() < 0.5 else 12)
            else:
                gray = to_uint8(pixels)
            target = root / "deid_png" / path.removeprefix(IMAGE_PREFIX)
            write_bytes(target, png_bytes(gray, compress_level))
            index += 1
