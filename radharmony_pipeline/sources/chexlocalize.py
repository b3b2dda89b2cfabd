"""CheXlocalize: CheXpert val/test JPEGs, their label CSVs and the COCO-RLE segmentation JSON."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

from ..processing.mask_jobs import MaskTarget, RleMaskJob
from ..processing.vocabulary import unified_class
from .base import (
    DatasetSource,
    SplitTables,
    confine_paths,
    empty_phrase_lists,
    index_frame,
    label_frame,
    read_csv,
    read_json,
    require_columns,
    split_named_in,
)
from .counts import ExpectedCounts
from .errors import MetadataError
from .location import SourceLocation
from .views import normalize_view_positions

CHEXPERT_LABELS: tuple[str, ...] = (
    "No Finding",
    "Enlarged Cardiomediastinum",
    "Cardiomegaly",
    "Lung Opacity",
    "Lung Lesion",
    "Edema",
    "Consolidation",
    "Pneumonia",
    "Atelectasis",
    "Pneumothorax",
    "Pleural Effusion",
    "Pleural Other",
    "Fracture",
    "Support Devices",
)

# Everything up to and including the split folder is dropped: `CheXpert-v1.0/valid/` and
# `test/` prefixes both occur, and image paths are stored relative to the split folder.
_SPLIT_PREFIX = r"^(?:.*/)?(?:train|valid|val|test)/"
_IMAGE_PATH = r"^(patient\d+)/(study\d+)/(view\d+)_(frontal|lateral)\.jpg$"


class CheXlocalizeSource(DatasetSource):
    key = "chexlocalize"
    splits = ("val", "test")
    env_vars = {"root": "RADHARMONY_CHEXLOCALIZE_ROOT"}
    layout = """\
chexlocalize/
  CheXpert/
    val_labels.csv, test_labels.csv
    val/patientNNNNN/studyN/viewN_frontal.jpg
    test/patientNNNNN/studyN/viewN_frontal.jpg
  CheXlocalize/
    gt_segmentations_val.json, gt_segmentations_test.json"""
    documented_counts = ExpectedCounts(
        origin="CheXlocalize dataset page and dataset record",
        splits={
            "val": {"images": 234, "patients": 200},
            "test": {
                "images": 668,
                "patients": 500,
                "images_with_segmentation": 499,
                "images_with_masks": 499,
            },
        },
    )
    # The 10 pathologies of gt_segmentations_<split>.json, in the unified vocabulary.
    mask_classes = (
        "enlarged_cardiomediastinum",
        "cardiomegaly",
        "lung_lesion",
        "lung_opacity",
        "edema",
        "consolidation",
        "atelectasis",
        "pneumothorax",
        "pleural_effusion",
        "support_devices",
    )
    # The CheXlocalize release notes one test image with positive labels and no segmentation.
    documented_unmasked_positives = frozenset({"patient65086_study1_view1_frontal"})
    count_hints = {
        "images": "rows of CheXpert/{split}_labels.csv (re-download the CheXpert {split} labels)",
        "patients": "patient folders under CheXpert/{split}/ or rows of {split}_labels.csv",
        "images_with_segmentation": "entries of CheXlocalize/gt_segmentations_{split}.json",
    }

    def __init__(self, location: SourceLocation, data_root: Path):
        base = location.base_image_dir
        self._explicit_split = split_named_in(base, self.splits) if base else None
        chexpert = base.parent if self._explicit_split else base
        self._root = location.root or (chexpert.parent if chexpert else data_root / "chexlocalize")
        self._chexpert = chexpert or self._root / "CheXpert"
        self._csv_override = location.csv_path
        self._mask_json_override = location.mask_json_path

    @property
    def root(self) -> Path:
        return self._root

    def image_dir(self, split: str) -> Path:
        self.check_split(split)
        return self._chexpert / split

    def labels_csv(self, split: str) -> Path:
        return (
            self._override_for(split, self._csv_override) or self._chexpert / f"{split}_labels.csv"
        )

    def segmentation_json(self, split: str) -> Path:
        return self._override_for(split, self._mask_json_override) or (
            self._chexpert.parent / "CheXlocalize" / f"gt_segmentations_{split}.json"
        )

    def annotation_files(self, split: str) -> list[Path]:
        return [self.labels_csv(split), self.segmentation_json(split)]

    def _override_for(self, split: str, path: Path | None) -> Path | None:
        """An explicit file applies to the split its name says (else the seed pages' `test`)."""
        if path is None:
            return None
        return path if (split_named_in(path, self.splits) or "test") == split else None

    def read_split(self, split: str) -> SplitTables:
        self.require(self.image_dir(split), f"CheXpert {split} image folder")
        csv_path = self.require(self.labels_csv(split), f"CheXpert {split} labels CSV")
        json_path = self.require(self.segmentation_json(split), "CheXlocalize segmentation JSON")
        table = read_csv(csv_path)
        require_columns(table, ("Path", *CHEXPERT_LABELS), csv_path)
        parts = _parse_paths(table["Path"], csv_path)
        segmentation_sizes = _segmentation_sizes(self.read_segmentations(split), json_path)
        native_id = (
            parts["patient"] + "_" + parts["study"] + "_" + parts["view"] + "_" + parts["side"]
        )
        sizes = segmentation_sizes.reindex(native_id.to_numpy())
        view_raw = parts["side"]
        if "AP/PA" in table:
            projection = table["AP/PA"].astype("string").str.strip()
            view_raw = projection.where(projection.notna() & (projection != ""), view_raw)
        index = index_frame(
            self.key,
            split,
            {
                "native_id": native_id,
                "patient_id": parts["patient"],
                "study_id": parts["patient"] + "_" + parts["study"],
                "image_path": parts["relative"],
                "view_position": normalize_view_positions(view_raw),
                "view_position_raw": view_raw,
                "source_height": sizes["height"].to_numpy(),
                "source_width": sizes["width"].to_numpy(),
                "patient_sex": _sex(table),
                "patient_age_years": _age(table),
            },
        )
        native = {
            name_to_column(name): _label_values(table[name], csv_path, name)
            for name in CHEXPERT_LABELS
        }
        # Uncertain (-1) is not negative: it stays in the native column, null in the unified one.
        unified = {
            f"label_{unified_class(name)}": native[name_to_column(name)].mask(
                native[name_to_column(name)] == -1
            )
            for name in CHEXPERT_LABELS
        }
        labels = label_frame(
            index["image_id"],
            {
                **native,
                "has_segmentation": native_id.isin(segmentation_sizes.index).to_numpy(),
                "report": pd.array([None] * len(index), dtype="string"),
                "label_text": empty_phrase_lists(len(index)),
                **unified,
            },
        )
        return SplitTables(index=index, labels=labels)

    def read_segmentations(self, split: str) -> dict:
        """`{cxr_id: {pathology: RLE}}` as in gt_segmentations_<split>.json."""
        path = self.require(self.segmentation_json(split), "CheXlocalize segmentation JSON")
        data = read_json(path)
        if not isinstance(data, dict):
            raise MetadataError(
                path,
                "top level",
                "expected an object keyed by cxr_id",
                "Use gt_segmentations_<split>.json from the CheXlocalize download",
            )
        return data

    def mask_jobs(
        self, split: str, index: pd.DataFrame, target_for: Callable[[str], MaskTarget]
    ) -> list[RleMaskJob]:
        """One job per image: its pathologies' RLEs under unified names ({} without entry)."""
        segmentations = self.read_segmentations(split)
        base = self.image_dir(split)
        jobs = []
        for image_id, image_key, relative in index[
            ["image_id", "image_key", "image_path"]
        ].itertuples(index=False):
            entry = segmentations.get(image_id.removeprefix(f"{self.key}/"), {})
            rles = {unified_class(name): rle for name, rle in entry.items()}
            jobs.append(RleMaskJob(image_id, base / relative, target_for(image_key), rles))
        return jobs

    def localizable_images(self, index: pd.DataFrame) -> pd.Series:
        # Segmentations are keyed `..._frontal`: lateral views are never segmented.
        return index["image_path"].str.endswith("_frontal.jpg")

    def count_metrics(self, tables: SplitTables) -> dict[str, int]:
        index = tables.index
        return {
            "images": len(index),
            "patients": int(index["patient_id"].nunique()),
            "studies": int(index["study_id"].nunique()),
            "images_with_segmentation": int(tables.labels["has_segmentation"].sum()),
        }


def name_to_column(name: str) -> str:
    return name.lower().replace(" ", "_")


def _parse_paths(paths: pd.Series, csv_path: Path) -> pd.DataFrame:
    relative = paths.astype("string").str.strip().str.replace(_SPLIT_PREFIX, "", regex=True)
    confine_paths(relative, csv_path.parent, csv_path, rows=_csv_rows(paths))
    parts = relative.str.extract(_IMAGE_PATH)
    parts.columns = ["patient", "study", "view", "side"]
    bad = parts["patient"].isna().to_numpy()
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise MetadataError(
            csv_path,
            f"row {_csv_rows(paths)[row]} (Path={paths.iloc[row]!r})",
            "expected a path like test/patient64741/study1/view1_frontal.jpg",
            "Use the labels CSV shipped with CheXpert/CheXlocalize",
        )
    parts["relative"] = relative
    return parts


def _csv_rows(frame_or_series: pd.Series | pd.DataFrame) -> list[int]:
    """Line numbers in the CSV file (header is line 1) for error messages."""
    return [i + 2 for i in range(len(frame_or_series))]


def _label_values(values: pd.Series, csv_path: Path, column: str) -> pd.Series:
    """0/1 written `0`, `1`, `0.0` or `1.0`; CheXpert's -1 (uncertain) kept; blanks null."""
    numeric = pd.to_numeric(values, errors="coerce")
    bad = values.notna() & ~numeric.isin([0, 1, -1])
    if bad.any():
        row = int(np.flatnonzero(bad.to_numpy())[0])
        raise MetadataError(
            csv_path,
            f"row {row + 2}, column {column!r}",
            f"label value {values.iloc[row]!r} is not 0, 1, -1 or blank",
            "Use the labels CSV as downloaded",
        )
    return numeric.astype("Int8")


def _segmentation_sizes(data: dict, json_path: Path) -> pd.DataFrame:
    """Height and width per cxr_id, validating each entry's shape on the way."""
    heights, widths = [], []
    for cxr_id, entry in data.items():
        try:
            first = next(iter(entry.values()))
            height, width = (int(v) for v in first["size"])
            for pathology, rle in entry.items():
                unified_class(pathology)
                if [int(v) for v in rle["size"]] != [height, width] or not rle["counts"]:
                    raise ValueError(f"pathology {pathology!r} has size {rle['size']}")
        except (AttributeError, StopIteration, KeyError, TypeError, ValueError) as exc:
            raise MetadataError(
                json_path,
                f"entry {cxr_id!r}",
                f"expected {{pathology: {{'size': [h, w], 'counts': str}}}} ({exc!r})",
                "Re-download the CheXlocalize annotations",
            ) from exc
        heights.append(height)
        widths.append(width)
    return pd.DataFrame({"height": heights, "width": widths}, index=list(data.keys()))


def _sex(table: pd.DataFrame) -> pd.Series:
    if "Sex" not in table:
        return pd.Series(pd.NA, index=table.index, dtype="string")
    sex = table["Sex"].astype("string").str.strip().str.upper().str[:1]
    return sex.where(sex.isin(["M", "F"]))


def _age(table: pd.DataFrame) -> pd.Series:
    if "Age" not in table:
        return pd.Series(np.nan, index=table.index, dtype="float64")
    return pd.to_numeric(table["Age"], errors="coerce").astype("float64")
