"""ReXGradient-160K: per-split study JSON (`*_metadata_view_position.json`) over a PNG tree."""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import cached_property
from itertools import chain, repeat
from operator import itemgetter

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from ..processing.corpus.parents import parent_identity
from ..processing.storage import source_store
from ..processing.storage.source_store import FileState, SourcePath
from ..processing.tables.table_schemas import REPORT_RULES
from ..vocabulary import STATUS_OK
from .base import (
    DatasetSource,
    RowErrors,
    SourceCard,
    SplitTables,
    arrow_system_allocator,
    confine_paths,
    empty_phrase_lists,
    entry_error,
    garbage_collection_paused,
    identity_counts,
    index_frame,
    label_frame,
    read_json_entries,
    split_named_in,
    text_column,
)
from .counts import ExpectedCounts
from .errors import DatasetLayoutError, MetadataError
from .layouts import nearby, rexgradient_folders, rexgradient_metadata_folders
from .location import SourceLocation
from .views import normalize_view_positions

REPORT_SECTIONS = ("Indication", "Comparison", "Findings", "Impression")
_HEADERS = tuple(name.upper() for name in REPORT_SECTIONS)
# Split keys are normalized (`val`); the release's file names keep `valid`.
FILE_SPLITS = {"train": "train", "val": "valid", "test": "test"}
_AGE_UNIT_YEARS = {"Y": 1.0, "M": 1 / 12, "W": 7 / 365.25, "D": 1 / 365.25}
_EMPTY_SECTIONS = {"", "none", "nan", "null"}


def metadata_json_name(split: str) -> str:
    return f"{FILE_SPLITS[split]}_metadata_view_position.json"


class ReXGradientSource(DatasetSource):
    key = "rexgradient"
    synthetic_generator = "radharmony_pipeline.synthetic.rexgradient"
    card = SourceCard(
        title="ReXGradient-160K",
        homepage="https://huggingface.co/datasets/rajpurkarlab/ReXGradient-160K",
        licence="ReXGradient-160K Non-Commercial Data Access and Use Agreement (Harvard "
        "Medical School / Gradient Health): non-commercial research only, no clinical use",
        citation="ReXGradient-160K, Rajpurkar Lab (rajpurkarlab/ReXGradient-160K)",
    )
    splits = ("train", "val", "test")
    # Its reports are free text only: the report labeler reads them.
    report_label_source = REPORT_RULES
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
        total={"images": 273004, "studies": 160000, "patients": 109487},
    )
    # The page's patient total (109,487) is the sum of the splits': no patient is in two.
    patients_disjoint_across_splits = True
    count_hints = {
        "images": "ImagePath entries of {file}",
        "studies": "study entries of {file}",
        "patients": "study entries of {file}",
    }

    def __init__(self, location: SourceLocation, data_root: SourcePath):
        super().__init__(location, data_root)
        self._json_given = location.csv_path

    @cached_property
    def _folders(self) -> tuple[SourcePath, SourcePath, str | None]:
        """(dataset root, deid_png/ folder, layout note)."""
        # Resolved on first use: opening a reader does no I/O (a store may be unreachable).
        return rexgradient_folders(
            self._location.root, self._location.base_image_dir, self._data_root
        )

    @property
    def _root(self) -> SourcePath:
        return self._folders[0]

    @property
    def _images(self) -> SourcePath:
        return self._folders[1]

    @cached_property
    def _layout_notes(self) -> list[str]:
        return [self._folders[2]] if self._folders[2] else []

    @property
    def root(self) -> SourcePath:
        return self._root

    def image_dir(self, split: str) -> SourcePath:
        self.check_split(split)
        return self._images

    def metadata_json(self, split: str) -> SourcePath:
        """The given JSON for its split, else the first metadata folder that has the file."""
        self.check_split(split)
        given = self._json_given
        if given is not None and split_named_in(given, self.splits) in (split, None):
            return given
        candidates = [
            folder / metadata_json_name(split)
            for folder in rexgradient_metadata_folders(self._root, self._images)
        ]
        return next((path for path in candidates if source_store.exists(path)), candidates[0])

    def annotation_files(self, split: str) -> list[SourcePath]:
        return [self.metadata_json(split)]

    def image_states(self, split: str) -> dict[str, FileState]:
        # deid_png/ holds every split; only the images this split's JSON names belong to it.
        index = self.read_split(split).index
        named = index.loc[index["status"] == STATUS_OK, "image_path"]
        return source_store.named_states(self._images, named)

    def read_split(self, split: str) -> SplitTables:
        path = self.metadata_json(split)
        if path.suffix.lower() == ".csv":
            raise MetadataError(
                path,
                "file type",
                "the per-study CSV has no image paths and cannot produce per-image rows",
                f"Pass {path.with_name(metadata_json_name(split)).name} (the JSON) instead",
            )
        if not source_store.exists(path):
            csv_twin = path.with_name(f"{FILE_SPLITS[split]}_metadata.csv")
            detail = (
                f"only {csv_twin.name} is there, which has no image paths; the JSON"
                if source_store.exists(csv_twin)
                else "metadata JSON"
            )
            raise DatasetLayoutError(
                self.key,
                path,
                self.env_vars["root"],
                self.layout,
                f"{detail} {path.name} not found",
                nearby(path),
            )
        self.require(self._images, "deid_png image folder")
        # Collections paused: millions of objects, none of them garbage (the parsed JSON, then
        # an empty label_text list per image), so a collection would only scan them.
        # For the allocator, see arrow_system_allocator.
        with garbage_collection_paused(), arrow_system_allocator():
            return self._read_tables(path, split)

    def _read_tables(self, path: SourcePath, split: str) -> SplitTables:
        # The parsed JSON is the largest object of the step; nothing keeps it past this call.
        studies = read_json_entries(
            path,
            dict,
            "an object keyed by study",
            f"{metadata_json_name(split)} from the ReXGradient download",
        )
        studies, images = _study_and_image_tables(studies, path, split)
        image_path = pd.Series(images["image_path"])
        errors = RowErrors(len(image_path))
        errors.update(images["problems"])
        entries = images["entry"]
        errors.update(
            confine_paths(image_path, path, lambda i: f"entry {entries[i]!r}", "ImagePath")
        )
        for position in np.flatnonzero(images["date_problem"]).tolist():
            errors.add(
                position,
                entry_error(
                    path,
                    f"entry {entries[position]!r}",
                    "StudyDate",
                    f"{images['date_raw'][position]!r} is not a YYYYMMDD date",
                ),
            )
        # All per-study work is done: one take per column spreads it over the study's images.
        per_image = {name: column.take(images["study"]) for name, column in studies.items()}
        view_raw = pd.Series(images["view_position_raw"])
        no_size = _all_null_int(len(image_path))
        index = index_frame(
            self.key,
            split,
            {
                "native_id": images["native_id"],
                "patient_id": per_image["PatientID"],
                "study_id": per_image["StudyInstanceUid"],
                "image_path": image_path,
                "view_position": normalize_view_positions(view_raw),
                "view_position_raw": view_raw,
                # ImageShape may describe the original, not the 25 % PNG: not a source size.
                "source_height": no_size,
                "source_width": no_size.copy(),
                "accession_number": per_image["AccessionNumber"],
                "patient_sex": per_image["patient_sex"],
                "patient_age": per_image["PatientAge"],
                "patient_age_years": per_image["patient_age_years"],
                "study_date": per_image["study_date"],
            },
        )
        labels = label_frame(
            index["image_id"],
            {
                "report": per_image["report"],
                "label_text": empty_phrase_lists(len(index)),
            },
        )
        return SplitTables(index=index, labels=labels).with_row_errors(errors)

    parent_dataset = "rexgradient"

    def parent_identity(self, split: str, index: pd.DataFrame) -> pd.DataFrame:
        # Not carved out of a larger public set: its own ids and split are the parent's.
        return parent_identity(
            len(index),
            self.parent_dataset,
            image_ids=index["image_id"].str.removeprefix(f"{self.key}/").to_numpy(),
            patient_ids=index["patient_id"].to_numpy(),
            study_ids=index["study_id"].to_numpy(),
            splits=split,
        )

    def count_metrics(self, tables: SplitTables) -> dict[str, int]:
        return identity_counts(tables.index)


STUDY_FIELDS = (
    "PatientID",
    "AccessionNumber",
    "StudyInstanceUid",
    "PatientSex",
    "PatientAge",
    "StudyDate",
    *REPORT_SECTIONS,
)
_ENTRY_FIELDS = ("ImagePath", "ImageViewPosition", *STUDY_FIELDS)
_ALL_ENTRY_FIELDS = itemgetter(*_ENTRY_FIELDS)


def _study_and_image_tables(
    studies: object, path: SourcePath, split: str
) -> tuple[dict[str, object], dict[str, object]]:
    """Per-study columns (with derived report, sex, age, date) and per-ImagePath columns.

    Study-level work is done once per study, not once per image; `images["study"]` gives
    each image's study position. Per-image lists shorter than ImagePath are padded with nulls.
    A study or path that cannot be read gives an image row with a null path, and its reason
    in `images["problems"]` (by image position).
    """
    study_problems = _unusable_studies(studies, path)
    if study_problems:
        # Each unusable study stands in as one image without a path, so it is reported.
        studies = {
            key: {"ImagePath": [None]} if key in study_problems else study
            for key, study in studies.items()
        }
    fields = _entry_fields(studies)
    path_lists = fields["ImagePath"]
    counts = list(map(len, path_lists))
    image_paths = list(chain.from_iterable(path_lists))
    positions = np.repeat(np.arange(len(counts)), counts)
    keys = np.asarray(list(studies), dtype=object)[positions]
    problems: dict[int, str] = {}
    if not all(map(isinstance, image_paths, repeat(str))):
        first_of_study = np.concatenate(([0], np.cumsum(counts)[:-1])) if counts else []
        for position, value in enumerate(image_paths):
            if isinstance(value, str):
                continue
            key = keys[position]
            problems[position] = study_problems.get(key) or entry_error(
                path,
                f"entry {key!r}",
                f"ImagePath[{position - first_of_study[positions[position]]}]",
                f"expected a path string, got {value!r}",
            )
            image_paths[position] = None
    # Same as stripping the regex ^(?:\.\./)?(?:deid_png/)? but without a regex call per image.
    relative = [
        p.removeprefix("../").removeprefix("deid_png/") if p is not None else None
        for p in image_paths
    ]
    native_ids = [
        p.rsplit("/", 1)[-1].rsplit(".", 1)[0] if p is not None else _pathless_id(keys, i)
        for i, p in enumerate(relative)
    ]
    study_columns = _derived_study_columns(fields)
    date_problem = study_columns.pop("date_problem")[positions]
    images = {
        "study": positions,
        # Read to name the study of a rejected path.
        "entry": keys,
        "image_path": text_column(relative),
        "native_id": text_column(native_ids),
        "view_position_raw": _per_image_views(fields["ImageViewPosition"], counts),
        "problems": problems,
        "date_problem": date_problem,
        "date_raw": np.asarray(fields["StudyDate"], dtype=object)[positions],
    }
    return study_columns, images


def _pathless_id(keys: np.ndarray, position: int) -> str:
    """`<study>-image<n>` for the study's n-th image, which has no usable path."""
    first = position
    while first > 0 and keys[first - 1] == keys[position]:
        first -= 1
    return f"{keys[position]}-image{position - first}"


def _unusable_studies(studies: dict, path: SourcePath) -> dict[str, str]:
    """Studies that are not objects with an ImagePath list, by key, with their reason."""
    if all(map(isinstance, studies.values(), repeat(dict))) and all(
        isinstance(study.get("ImagePath"), list) for study in studies.values()
    ):
        return {}
    problems = {}
    for key, study in studies.items():
        if not isinstance(study, dict):
            problems[key] = entry_error(
                path, f"entry {key!r}", "(study)", f"expected an object, got {study!r:.60}"
            )
        elif not isinstance(study.get("ImagePath"), list):
            problems[key] = entry_error(
                path,
                f"entry {key!r}",
                "ImagePath",
                f"expected a list of image paths, got {study.get('ImagePath')!r:.60}",
            )
    return problems


def _entry_fields(studies: dict) -> dict[str, tuple[object, ...]]:
    """Each field of _ENTRY_FIELDS across all studies, in study order (None where absent).

    One pass over the studies, transposed in C afterwards: each study dict is visited once.
    Every study is a dict with an ImagePath list (see _unusable_studies).
    """
    try:
        # Usually every study has every field: one C-level itemgetter call per study then
        # takes half the time of eleven dict.get calls.
        rows = list(map(_ALL_ENTRY_FIELDS, studies.values()))
    except KeyError:
        rows = [
            (study["ImagePath"], *map(study.get, _ENTRY_FIELDS[1:])) for study in studies.values()
        ]
    columns = list(zip(*rows, strict=True)) or [()] * len(_ENTRY_FIELDS)
    return dict(zip(_ENTRY_FIELDS, columns, strict=True))


def _per_image_views(lists: Sequence[object], counts: list[int]) -> pd.arrays.ArrowStringArray:
    """One ImageViewPosition per image, null where it is not a string; a study whose list is
    missing or shorter than its ImagePath gets nulls for the unknown tail."""
    if all(map(isinstance, lists, repeat(list))):
        # The usual case, converted and flattened in C: every study has a list of strings
        # (or nulls), one per image. Measured twice as fast as flattening in Python.
        try:
            nested = pa.array(lists, type=pa.list_(pa.large_string()), from_pandas=True)
        except (pa.ArrowInvalid, pa.ArrowTypeError):  # a value that is not a string
            nested = None
        if nested is not None and np.array_equal(
            pc.list_value_length(nested).to_numpy(zero_copy_only=False), counts
        ):
            return pd.arrays.ArrowStringArray(nested.flatten())
    views = _flattened_padded(lists, counts)
    return text_column([view if isinstance(view, str) else None for view in views])


def _flattened_padded(lists: Sequence[object], counts: list[int]) -> list[object]:
    """One value per image from per-study lists; a study whose list is missing or shorter
    than its ImagePath gets nulls for the unknown tail."""
    if all(map(isinstance, lists, repeat(list))) and list(map(len, lists)) == counts:
        # The usual case, flattened in C.
        return list(chain.from_iterable(lists))
    return list(
        chain.from_iterable(
            values if isinstance(values, list) and len(values) == n else _padded(values, n)
            for values, n in zip(lists, counts, strict=True)
        )
    )


def _derived_study_columns(fields: dict[str, Sequence[object]]) -> dict[str, object]:
    """Per-study columns, each an array with `.take` so it can be spread over images."""
    table: dict[str, object] = {
        name: text_column(fields[name])
        for name in ("PatientID", "AccessionNumber", "StudyInstanceUid", "PatientAge")
    }
    # Sections are kept only inside the report (with their headers): separate columns would
    # double the text stored and cost more time than the rest of the labels together.
    sections = [_clean_sections(fields[name]) for name in REPORT_SECTIONS]
    table["report"] = text_column([format_report(parts) for parts in zip(*sections, strict=True)])
    table["patient_sex"] = _sex(fields["PatientSex"]).array
    table["patient_age_years"] = _per_unique(
        pd.Series(table["PatientAge"]), age_in_years
    ).to_numpy()
    raw_dates = pd.Series(fields["StudyDate"], dtype=object)
    dates = _per_unique(raw_dates, _study_dates)
    table["study_date"] = dates.to_numpy()
    # A date that is present but unreadable (Infinity, 2023-13-45) makes its images errors;
    # a missing one (null, NaN) is just null.
    table["date_problem"] = (dates.isna() & ~raw_dates.map(_is_missing)).to_numpy(dtype=bool)
    return table


def _per_unique(values: pd.Series, convert) -> pd.Series:
    """Apply a vectorized conversion to the distinct values only (ages and dates repeat)."""
    codes, uniques = pd.factorize(values, use_na_sentinel=True)
    converted = convert(pd.Series(uniques)).to_numpy()
    result = pd.Series(converted[codes], index=values.index)
    return result.mask(codes < 0)


def _padded(values: object, n: int) -> list[object]:
    """Per-image lists are occasionally shorter than ImagePath: the tail is unknown."""
    values = values if isinstance(values, list) else []
    return (values + [None] * n)[:n]


def _clean_sections(values: Sequence[object]) -> list[str | None]:
    """Report sections as stripped text; empty, "None" and NaN sections become None."""
    # One pass that strips and tests together: a third faster than two on 560k sections.
    return [
        text
        if isinstance(value, str)
        and (text := value.strip())
        and (len(text) > 4 or text.lower() not in _EMPTY_SECTIONS)
        else None
        for value in values
    ]


def format_report(sections: Sequence[str | None]) -> str | None:
    """`INDICATION:\n...\n\nFINDINGS:\n...` from the present sections, in REPORT_SECTIONS
    order; None when every section is empty."""
    present = [
        f"{header}:\n{text}" for header, text in zip(_HEADERS, sections, strict=True) if text
    ]
    return "\n\n".join(present) if present else None


def age_in_years(ages: pd.Series) -> pd.Series:
    """DICOM age strings (`014Y`, `007M`, `003W`, `002D`) in years; anything else null."""
    parts = ages.astype("string").str.strip().str.upper().str.extract(r"^(\d+)\s*([YMWD])$")
    number = pd.to_numeric(parts[0], errors="coerce")
    return (number * parts[1].map(_AGE_UNIT_YEARS)).astype("float64")


def _sex(values: list[object]) -> pd.Series:
    sex = pd.Series(
        [v.strip().upper() if isinstance(v, str) else None for v in values], dtype="string"
    )
    return sex.where(sex.isin(["M", "F"]))


def _all_null_int(n: int) -> pd.arrays.IntegerArray:
    return pd.arrays.IntegerArray(np.zeros(n, dtype=np.int64), np.ones(n, dtype=bool))


def _study_dates(values: list[object]) -> pd.Series:
    text = pd.Series(
        [
            str(int(v)) if isinstance(v, (int, float)) and math.isfinite(v) else _text_or_none(v)
            for v in values
        ],
        dtype="string",
    )
    return pd.to_datetime(text, format="%Y%m%d", errors="coerce")


def _text_or_none(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _is_missing(value: object) -> bool:
    if value is None:
        return True
    if isinstance(value, float) and math.isnan(value):
        return True
    return isinstance(value, str) and not value.strip()
