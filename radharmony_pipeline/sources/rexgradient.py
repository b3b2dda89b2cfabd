"""ReXGradient-160K: per-split study JSON (`*_metadata_view_position.json`) over a PNG tree."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd

from .base import (
    DatasetSource,
    SplitTables,
    confine_paths,
    empty_phrase_lists,
    index_frame,
    label_frame,
    read_json,
    split_named_in,
)
from .counts import ExpectedCounts
from .errors import DatasetLayoutError, MetadataError
from .location import SourceLocation
from .views import normalize_view_positions

REPORT_SECTIONS = ("Indication", "Comparison", "Findings", "Impression")
_FILE_SPLIT = {"train": "train", "val": "valid", "test": "test"}
_IMAGE_PREFIX = r"^(?:\.\./)?(?:deid_png/)?"
_AGE_UNIT_YEARS = {"Y": 1.0, "M": 1 / 12, "W": 7 / 365.25, "D": 1 / 365.25}
_EMPTY_SECTIONS = {"", "none", "nan", "null"}


def metadata_json_name(split: str) -> str:
    return f"{_FILE_SPLIT[split]}_metadata_view_position.json"


class ReXGradientSource(DatasetSource):
    key = "rexgradient"
    splits = ("train", "val", "test")
    env_vars = {"root": "RADHARMONY_REXGRADIENT_ROOT"}
    layout = """\
rexgradient/
  deid_png/<PatientID>/<AccessionNumber>/studies/<StudyUID>/series/<SeriesUID>/instances/<SOP>.png
  download/metadata/
    train_metadata_view_position.json, valid_metadata_view_position.json,
    test_metadata_view_position.json"""
    documented_counts = ExpectedCounts(
        origin="ReXGradient-160K dataset page",
        splits={
            "train": {"images": 238968, "studies": 140000, "patients": 95716},
            "val": {"images": 17007, "studies": 10000, "patients": 6964},
            "test": {"images": 17029, "studies": 10000, "patients": 6807},
        },
    )
    count_hints = {
        "images": "ImagePath entries of {file}",
        "studies": "study entries of {file}",
        "patients": "study entries of {file}",
    }

    def __init__(self, location: SourceLocation, data_root: Path):
        self._images = location.base_image_dir
        self._root = location.root or (
            self._images.parent if self._images else data_root / "rexgradient"
        )
        self._images = self._images or self._root / "deid_png"
        self._json_given = location.csv_path

    @property
    def root(self) -> Path:
        return self._root

    def image_dir(self, split: str) -> Path:
        self.check_split(split)
        return self._images

    def metadata_json(self, split: str) -> Path:
        """The given JSON for its split, else the first metadata folder that has the file."""
        self.check_split(split)
        given = self._json_given
        if given is not None and split_named_in(given, self.splits) in (split, None):
            return given
        candidates = [
            folder / metadata_json_name(split)
            for folder in (
                self._root / "download" / "metadata",
                self._root / "metadata",
                self._images.parent / "download" / "metadata",
                self._images.parent / "metadata",
            )
        ]
        return next((path for path in candidates if path.exists()), candidates[0])

    def annotation_files(self, split: str) -> list[Path]:
        return [self.metadata_json(split)]

    def image_files(self, split: str) -> Iterator[Path]:
        # deid_png/ holds every split; only the images this split's JSON names belong to it.
        index = self.read_split(split).index
        for relative in index["image_path"]:
            path = self._images / relative
            if path.exists():
                yield path

    def read_split(self, split: str) -> SplitTables:
        path = self.metadata_json(split)
        if path.suffix.lower() == ".csv":
            raise MetadataError(
                path, "file type",
                "the per-study CSV has no image paths and cannot produce per-image rows",
                f"Pass {path.with_name(metadata_json_name(split)).name} (the JSON) instead",
            )
        if not path.exists():
            csv_twin = path.with_name(f"{_FILE_SPLIT[split]}_metadata.csv")
            detail = (f"only {csv_twin.name} is there, which has no image paths; the JSON"
                      if csv_twin.exists() else "metadata JSON")
            raise DatasetLayoutError(self.key, path, self.env_vars["root"], self.layout,
                                     f"{detail} {path.name} not found")
        self.require(self._images, "deid_png image folder")
        studies = read_json(path)
        if not isinstance(studies, dict):
            raise MetadataError(path, "top level", "expected an object keyed by study",
                                f"Use {metadata_json_name(split)} from the ReXGradient download")
        columns = _explode_studies(studies, path)
        relative = columns["image_path"].str.replace(_IMAGE_PREFIX, "", regex=True)
        confine_paths(relative, self._images, path, rows=columns["entry"].tolist())
        view_raw = columns["view_position_raw"]
        index = index_frame(
            self.key,
            split,
            {
                "native_id": relative.str.extract(r"([^/]+)\.png$", expand=False).fillna(relative),
                "patient_id": columns["PatientID"],
                "study_id": columns["StudyInstanceUid"],
                "image_path": relative,
                "view_position": normalize_view_positions(view_raw),
                "view_position_raw": view_raw,
                # ImageShape may describe the original, not the 25 % PNG: not a source size.
                "source_height": pd.array([pd.NA] * len(relative), dtype="Int64"),
                "source_width": pd.array([pd.NA] * len(relative), dtype="Int64"),
                "accession_number": columns["AccessionNumber"],
                "patient_sex": _sex(columns["PatientSex"]),
                "patient_age": columns["PatientAge"],
                "patient_age_years": age_in_years(columns["PatientAge"]),
                "study_date": _study_dates(columns["StudyDate"]),
                "metadata_image_shape": columns["ImageShape"],
            },
        )
        sections = {
            name.lower(): _clean_sections(columns[name]) for name in REPORT_SECTIONS
        }
        labels = label_frame(
            index["image_id"],
            {
                **sections,
                "report": format_reports(sections),
                "label_text": empty_phrase_lists(len(index)),
            },
        )
        return SplitTables(index=index, labels=labels)

    def count_metrics(self, tables: SplitTables) -> dict[str, int]:
        index = tables.index
        return {
            "images": len(index),
            "studies": int(index["study_id"].nunique()),
            "patients": int(index["patient_id"].nunique()),
        }


_STUDY_FIELDS = ("PatientID", "AccessionNumber", "StudyInstanceUid", "PatientSex", "PatientAge",
                 "StudyDate", *REPORT_SECTIONS)


def _explode_studies(studies: dict, path: Path) -> dict[str, pd.Series]:
    """One row per ImagePath; study fields repeated, per-image lists padded with nulls."""
    image_paths: list[str] = []
    views: list[object] = []
    shapes: list[object] = []
    per_study: dict[str, list[object]] = {name: [] for name in _STUDY_FIELDS}
    counts: list[int] = []
    keys: list[str] = []
    for key, study in studies.items():
        paths = study.get("ImagePath") if isinstance(study, dict) else None
        if not isinstance(paths, list) or not all(isinstance(p, str) for p in paths):
            raise MetadataError(path, f"entry {key!r}", "has no 'ImagePath' list of strings",
                                "Re-download the metadata JSON")
        n = len(paths)
        image_paths.extend(paths)
        views.extend(_padded(study.get("ImageViewPosition"), n))
        shapes.extend(_padded(study.get("ImageShape"), n))
        for name in _STUDY_FIELDS:
            per_study[name].append(study.get(name))
        counts.append(n)
        keys.append(key)
    repeats = np.asarray(counts, dtype=np.int64)
    columns = {
        name: pd.Series(np.repeat(np.asarray(values, dtype=object), repeats))
        for name, values in per_study.items()
    }
    for name in ("PatientID", "AccessionNumber", "StudyInstanceUid", "PatientSex", "PatientAge"):
        columns[name] = columns[name].astype("string")
    columns["entry"] = pd.Series(np.repeat(np.asarray(keys, dtype=object), repeats))
    columns["image_path"] = pd.Series(image_paths, dtype="string")
    columns["view_position_raw"] = pd.Series(
        [v if isinstance(v, str) else None for v in views], dtype="string"
    )
    columns["ImageShape"] = pd.Series(
        [_shape_or_none(s) for s in shapes], dtype=object
    )
    return columns


def _padded(values: object, n: int) -> list[object]:
    """Per-image lists are occasionally shorter than ImagePath: the tail is unknown."""
    values = values if isinstance(values, list) else []
    return (values + [None] * n)[:n]


def _shape_or_none(shape: object) -> list[int] | None:
    if isinstance(shape, list) and all(isinstance(v, (int, float)) for v in shape):
        return [int(v) for v in shape]
    return None


def _clean_sections(values: pd.Series) -> pd.Series:
    """Report sections as text, with empty, "None" and NaN sections as null."""
    text = pd.Series(
        [v.strip() if isinstance(v, str) else None for v in values], dtype="string"
    )
    return text.mask(text.str.lower().isin(_EMPTY_SECTIONS))


def format_reports(sections: dict[str, pd.Series]) -> pd.Series:
    """`INDICATION:\n...\n\nFINDINGS:\n...` from the present sections; null when none is."""
    chunks = [(name.upper() + ":\n" + text + "\n\n").fillna("") for name, text in sections.items()]
    joined = sum(chunks[1:], chunks[0]).str.removesuffix("\n\n")
    return joined.mask(joined == "").astype("string")


def age_in_years(ages: pd.Series) -> pd.Series:
    """DICOM age strings (`014Y`, `007M`, `003W`, `002D`) in years; anything else null."""
    parts = ages.astype("string").str.strip().str.upper().str.extract(r"^(\d+)\s*([YMWD])$")
    number = pd.to_numeric(parts[0], errors="coerce")
    return (number * parts[1].map(_AGE_UNIT_YEARS)).astype("float64")


def _sex(values: pd.Series) -> pd.Series:
    sex = values.str.strip().str.upper()
    return sex.where(sex.isin(["M", "F"])).astype("string")


def _study_dates(values: pd.Series) -> pd.Series:
    text = pd.Series(
        [str(int(v)) if isinstance(v, (int, float)) and not _is_nan(v) else v for v in values],
        dtype="string",
    )
    return pd.to_datetime(text, format="%Y%m%d", errors="coerce")


def _is_nan(value: object) -> bool:
    return isinstance(value, float) and math.isnan(value)
