"""CheXlocalize: CheXpert val/test JPEGs, their label CSVs and the COCO-RLE segmentation JSON."""

from __future__ import annotations

from collections.abc import Callable
from functools import cached_property
from pathlib import Path

import numpy as np
import pandas as pd

from ..processing.annotations.rle_text import RleTextError, validate_rle
from ..processing.corpus.parents import parent_identity
from ..processing.jobs.mask_jobs import MaskTarget, RleMaskJob
from ..processing.storage.source_store import SourcePath
from ..vocabulary import CHEXPERT_COLUMNS, snake_case, unified_class
from .base import (
    DatasetSource,
    RowErrors,
    SourceCard,
    SplitTables,
    confine_paths,
    empty_phrase_lists,
    entry_error,
    identity_counts,
    index_frame,
    label_frame,
    read_csv,
    read_json_entries,
    require_columns,
    split_named_in,
)
from .counts import ExpectedCounts
from .layouts import Found, chexlocalize_folders, chexlocalize_image_dir
from .location import SourceLocation
from .views import normalize_view_positions

# The pathology keys of every gt_segmentations_<split>.json entry, as the JSON spells them.
SEGMENTED_PATHOLOGIES: tuple[str, ...] = (
    "Enlarged Cardiomediastinum",
    "Cardiomegaly",
    "Lung Lesion",
    "Airspace Opacity",
    "Edema",
    "Consolidation",
    "Atelectasis",
    "Pneumothorax",
    "Pleural Effusion",
    "Support Devices",
)

# Everything up to and including the split folder is dropped: `CheXpert-v1.0/valid/` and
# `test/` prefixes both occur, and image paths are stored relative to the split folder.
_SPLIT_PREFIX = r"^(?:.*/)?(?:train|valid|val|test)/"
_CHEXPERT_SPLITS = {"val": "valid", "test": "test"}
_IMAGE_PATH = r"^(patient\d+)/(study\d+)/(view\d+)_(frontal|lateral)\.jpg$"


class CheXlocalizeSource(DatasetSource):
    key = "chexlocalize"
    synthetic_generator = "radharmony_pipeline.synthetic.chexlocalize"
    native_classes = CHEXPERT_COLUMNS
    card = SourceCard(
        title="CheXlocalize (CheXpert validation and test images)",
        homepage="https://github.com/rajpurkarlab/cheXlocalize",
        licence="MIT License (https://github.com/rajpurkarlab/cheXlocalize/blob/master/"
        "LICENSE.md); CheXpert images under the Stanford AIMI research use agreement",
        citation="Saporta et al., Benchmarking saliency methods for chest X-ray "
        "interpretation, Nature Machine Intelligence 2022, doi:10.1038/s42256-022-00536-x",
    )
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
            "val": {"images": 234, "patients": 200, "entries_without_the_10_pathologies": 0},
            "test": {
                "images": 668,
                "patients": 500,
                "images_with_segmentation": 499,
                "images_with_masks": 499,
                # The test labels are radiologist consensus: no uncertain (-1) value.
                "uncertain_labels": 0,
                "entries_without_the_10_pathologies": 0,
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
        "uncertain_labels": "-1 values in CheXpert/{split}_labels.csv: the test labels are "
        "consensus labels without -1, so this is probably the val or an uncertainty-labelled "
        "CSV under the test name",
        "entries_without_the_10_pathologies": "entries of CheXlocalize/gt_segmentations_{split}"
        ".json whose keys are not exactly the 10 documented pathologies (a renamed, missing or "
        "extra key; see the check's `found` entries)",
    }

    def __init__(self, location: SourceLocation, data_root: SourcePath):
        base = location.base_image_dir
        self._explicit_split = split_named_in(base, self.splits) if base else None
        super().__init__(location, data_root)
        self._csv_override = location.csv_path
        self._mask_json_override = location.mask_json_path

    @cached_property
    def _folders(self) -> tuple[SourcePath, SourcePath, str | None]:
        """(dataset root, CheXpert/ folder, layout note)."""
        # Resolved on first use: opening a reader does no I/O (a store may be unreachable).
        base = self._location.base_image_dir
        chexpert = base.parent if self._explicit_split else base
        if self._location.root is not None and chexpert is None:
            return chexlocalize_folders(self._location.root)
        root = self._location.root or (
            chexpert.parent if chexpert else self._data_root / "chexlocalize"
        )
        return root, chexpert or root / "CheXpert", None

    @property
    def _root(self) -> SourcePath:
        return self._folders[0]

    @property
    def _chexpert(self) -> SourcePath:
        return self._folders[1]

    @cached_property
    def _image_dirs(self) -> dict[str, Found]:
        return {split: chexlocalize_image_dir(self._chexpert, split) for split in self.splits}

    @cached_property
    def _layout_notes(self) -> list[str]:
        notes = [self._folders[2], *(found.note for found in self._image_dirs.values())]
        return [note for note in notes if note]

    @property
    def root(self) -> SourcePath:
        return self._root

    def image_dir(self, split: str) -> SourcePath:
        self.check_split(split)
        return self._image_dirs[split].path

    def labels_csv(self, split: str) -> SourcePath:
        return (
            self._override_for(split, self._csv_override) or self._chexpert / f"{split}_labels.csv"
        )

    def segmentation_json(self, split: str) -> SourcePath:
        return self._override_for(split, self._mask_json_override) or (
            self._chexpert.parent / "CheXlocalize" / f"gt_segmentations_{split}.json"
        )

    def annotation_files(self, split: str) -> list[SourcePath]:
        return [self.labels_csv(split), self.segmentation_json(split)]

    def _override_for(self, split: str, path: SourcePath | None) -> SourcePath | None:
        """An explicit file applies to the split its name says (else the seed pages' `test`)."""
        if path is None:
            return None
        return path if (split_named_in(path, self.splits) or "test") == split else None

    def read_split(self, split: str) -> SplitTables:
        self.require(self.image_dir(split), f"CheXpert {split} image folder")
        csv_path = self.require(self.labels_csv(split), f"CheXpert {split} labels CSV")
        self.require(self.segmentation_json(split), "CheXlocalize segmentation JSON")
        table = read_csv(csv_path, columns=("Path", *CHEXPERT_COLUMNS))
        require_columns(table, ("Path", *CHEXPERT_COLUMNS), csv_path)
        errors = RowErrors(len(table))
        parts = _parse_paths(table["Path"], csv_path, errors)
        segmentation_sizes = _segmentation_sizes(self.read_segmentations(split))
        # A row whose Path is unusable is named by its line alone (`row5`), see _parse_paths.
        named = parts["study"] != ""
        native_id = (
            parts["patient"] + "_" + parts["study"] + "_" + parts["view"] + "_" + parts["side"]
        ).where(named, parts["patient"])
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
                "patient_id": parts["patient"].where(named, pd.NA),
                "study_id": (parts["patient"] + "_" + parts["study"]).where(named, pd.NA),
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
            snake_case(name): _label_values(table[name], csv_path, name, errors)
            for name in CHEXPERT_COLUMNS
        }
        # Uncertain (-1) is not negative: it stays in the native column, null in the unified one.
        unified = {
            f"label_{unified_class(name)}": native[snake_case(name)].mask(
                native[snake_case(name)] == -1
            )
            for name in CHEXPERT_COLUMNS
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
        return SplitTables(index=index, labels=labels).with_row_errors(errors)

    parent_dataset = "chexpert"

    def parent_identity(self, split: str, index: pd.DataFrame) -> pd.DataFrame:
        # CheXlocalize's val and test are CheXpert's valid and test images, under the same
        # paths below the split folder.
        parent_split = _CHEXPERT_SPLITS[split]
        paths = index["image_path"].astype("string")
        return parent_identity(
            len(index),
            self.parent_dataset,
            image_ids=(parent_split + "/" + paths).to_numpy(),
            patient_ids=index["patient_id"].to_numpy(),
            study_ids=index["study_id"].to_numpy(),
            splits=np.where(paths.notna().to_numpy(), parent_split, None),
        )

    def read_segmentations(self, split: str) -> dict:
        """`{cxr_id: {pathology: RLE}}` as in gt_segmentations_<split>.json."""
        path = self.require(self.segmentation_json(split), "CheXlocalize segmentation JSON")
        data = read_json_entries(
            path,
            dict,
            "an object keyed by cxr_id",
            "gt_segmentations_<split>.json from the CheXlocalize download",
        )
        return data

    def mask_jobs(
        self, split: str, index: pd.DataFrame, target_for: Callable[[str], MaskTarget]
    ) -> list[RleMaskJob]:
        """One job per image: its pathologies' RLEs under unified names ({} without entry).

        A malformed entry gives a job that only reports why (file, entry, field): RLE text
        is checked here, before pycocotools could loop on it.
        """
        segmentations = self.read_segmentations(split)
        json_path = self.segmentation_json(split)
        base = self.image_dir(split)
        jobs = []
        for image_id, image_key, relative in index[
            ["image_id", "image_key", "image_path"]
        ].itertuples(index=False):
            cxr_id = image_id.removeprefix(f"{self.key}/")
            entry = segmentations.get(cxr_id, {})
            problem = _entry_problem(entry, json_path, f"entry {cxr_id!r}")
            rles = {} if problem else {unified_class(name): rle for name, rle in entry.items()}
            jobs.append(
                RleMaskJob(
                    image_id,
                    base / relative,
                    target_for(image_key),
                    rles,
                    image_root=base,
                    problem=problem,
                )
            )
        return jobs

    def localizable_images(self, index: pd.DataFrame) -> pd.Series:
        # Segmentations are keyed `..._frontal`: lateral views are never segmented.
        return index["image_path"].str.endswith("_frontal.jpg").fillna(False).astype(bool)

    def count_metrics(self, tables: SplitTables) -> dict[str, int]:
        return {
            **identity_counts(tables.index),
            "images_with_segmentation": int(tables.labels["has_segmentation"].sum()),
            "uncertain_labels": int(
                sum(tables.labels[snake_case(n)].eq(-1).sum() for n in CHEXPERT_COLUMNS)
            ),
            "entries_without_the_10_pathologies": len(
                self.irregular_entries(_split_of(tables.index))
            ),
        }

    def irregular_entries(self, split: str) -> list[str]:
        """Segmentation entries whose pathology keys are not exactly the documented ten."""
        documented = set(SEGMENTED_PATHOLOGIES)
        return [
            cxr_id
            for cxr_id, entry in self.read_segmentations(split).items()
            if set(entry) != documented
        ]


def _split_of(index: pd.DataFrame) -> str:
    splits = index["split"].dropna().unique()
    return str(splits[0]) if len(splits) else "test"


def _parse_paths(paths: pd.Series, csv_path: Path, errors: RowErrors) -> pd.DataFrame:
    """Patient, study, view and side of every row; a row whose Path is unusable is an error
    row, named by its line."""
    relative = paths.astype("string").str.strip().str.replace(_SPLIT_PREFIX, "", regex=True)
    lines = _csv_rows(paths)
    errors.update(confine_paths(relative, csv_path, lambda i: f"row {lines[i]}", "Path"))
    parts = relative.str.extract(_IMAGE_PATH)
    parts.columns = ["patient", "study", "view", "side"]
    for position in np.flatnonzero(parts["patient"].isna().to_numpy()).tolist():
        errors.add(
            position,
            entry_error(
                csv_path,
                f"row {lines[position]}",
                "Path",
                f"{paths.iloc[position]!r} is not like test/patient64741/study1/view1_frontal.jpg",
            ),
        )
        # Named by its line, so that the row keeps a unique image_id.
        parts.loc[parts.index[position], ["patient", "study", "view", "side"]] = [
            f"row{lines[position]}",
            "",
            "",
            "",
        ]
    parts["relative"] = relative.where(
        pd.Series([i not in errors for i in range(len(relative))], index=relative.index)
    )
    return parts


def _csv_rows(frame_or_series: pd.Series | pd.DataFrame) -> list[int]:
    """Line numbers in the CSV file (header is line 1) for error messages."""
    return [i + 2 for i in range(len(frame_or_series))]


def _label_values(values: pd.Series, csv_path: Path, column: str, errors: RowErrors) -> pd.Series:
    """0/1 written `0`, `1`, `0.0` or `1.0`; CheXpert's -1 (uncertain) kept; blanks null.
    Any other value is null and makes its row an error row."""
    numeric = pd.to_numeric(values, errors="coerce")
    bad = values.notna() & ~numeric.isin([0, 1, -1])
    for position in np.flatnonzero(bad.to_numpy()).tolist():
        errors.add(
            position,
            entry_error(
                csv_path,
                f"row {position + 2}",
                column,
                f"label value {values.iloc[position]!r} is not 0, 1, -1 or blank",
            ),
        )
    return numeric.mask(bad).astype("Int8")


def _segmentation_sizes(data: dict) -> pd.DataFrame:
    """Height and width per cxr_id, from the entry's first well-formed size (else null);
    entries are validated where their masks are made (see _entry_problem)."""
    heights, widths = [], []
    for entry in data.values():
        size = next(
            (
                rle["size"]
                for rle in (entry.values() if isinstance(entry, dict) else ())
                if isinstance(rle, dict) and _is_size(rle.get("size"))
            ),
            [None, None],
        )
        heights.append(size[0])
        widths.append(size[1])
    return pd.DataFrame(
        {"height": pd.array(heights, dtype="Int64"), "width": pd.array(widths, dtype="Int64")},
        index=list(data.keys()),
    )


def _is_size(value: object) -> bool:
    return (
        isinstance(value, list)
        and len(value) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value)
    )


def _entry_problem(entry: object, json_path: Path, where: str) -> str | None:
    """Why a segmentation entry cannot give masks (file, entry, field), or None."""
    if not isinstance(entry, dict):
        return entry_error(json_path, where, "(entry)", "expected {pathology: RLE}")
    sizes = set()
    for pathology, rle in entry.items():
        try:
            unified_class(pathology)
        except (KeyError, ValueError):
            return entry_error(json_path, where, pathology, "unknown pathology")
        try:
            sizes.add(validate_rle(rle))
        except RleTextError as error:
            return entry_error(json_path, where, f"{pathology}.{error.field}", str(error))
    if len(sizes) > 1:
        return entry_error(
            json_path, where, "size", f"pathologies disagree on the image size: {sorted(sizes)}"
        )
    return None


def _sex(table: pd.DataFrame) -> pd.Series:
    if "Sex" not in table:
        return pd.Series(pd.NA, index=table.index, dtype="string")
    sex = table["Sex"].astype("string").str.strip().str.upper().str[:1]
    return sex.where(sex.isin(["M", "F"]))


def _age(table: pd.DataFrame) -> pd.Series:
    if "Age" not in table:
        return pd.Series(np.nan, index=table.index, dtype="float64")
    return pd.to_numeric(table["Age"], errors="coerce").astype("float64")
