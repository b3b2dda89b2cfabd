"""MS-CXR v1.1.0: the phrase-grounding CSV over a MIMIC-CXR JPG or DICOM `files/` tree."""

from __future__ import annotations

from functools import cached_property

import numpy as np
import pandas as pd

from ..processing.corpus.parents import parent_identity, patient_splits_of, splits_by_patient
from ..processing.storage import source_store
from ..processing.storage.source_store import FileState, SourcePath
from ..processing.tables.table_schemas import MIMIC_CHEXPERT
from ..vocabulary import STATUS_OK, snake_case, unified_class
from .base import (
    DatasetSource,
    ReportLabelFile,
    RowErrors,
    SourceCard,
    SplitTables,
    confine_paths,
    fail_at_first_bad_row,
    identity_counts,
    index_frame,
    label_frame,
    read_csv,
    require_columns,
)
from .counts import ExpectedCounts
from .errors import DatasetLayoutError, MetadataError
from .layouts import Found, mimic_files_dir, ms_cxr_csv_folder, nearby
from .mimic_chexpert import CHEXPERT_NAMES, chexpert_csv, read_study_labels
from .mimic_splits import read_official_splits, split_csv
from .mimic_views import metadata_csv, raw_view_positions
from .views import normalize_view_positions

CSV_NAME = "MS_CXR_Local_Alignment_v1.1.0.csv"
CSV_COLUMNS = (
    "dicom_id",
    "category_name",
    "label_text",
    "path",
    "x",
    "y",
    "w",
    "h",
    "image_width",
    "image_height",
    "split",
)
CATEGORIES: tuple[str, ...] = (
    "Atelectasis",
    "Cardiomegaly",
    "Consolidation",
    "Edema",
    "Lung Opacity",
    "Pleural Effusion",
    "Pneumonia",
    "Pneumothorax",
)
_PATH = r"^files/(p\d{2}/p(\d+)/s(\d+)/([0-9a-f]{8}(?:-[0-9a-f]{8}){4}))\.(?:jpg|dcm)$"
_SPLITS = {"train": "train", "val": "val", "valid": "val", "validation": "val", "test": "test"}


class MsCxrSource(DatasetSource):
    key = "ms_cxr"
    synthetic_generator = "radharmony_pipeline.synthetic.ms_cxr"
    native_classes = CATEGORIES
    card = SourceCard(
        title="MS-CXR (local alignment, phrase grounding) over MIMIC-CXR",
        homepage="https://physionet.org/content/ms-cxr/",
        licence="PhysioNet credentialed access (MIMIC-CXR data use agreement)",
        citation="MS-CXR, PhysioNet (https://physionet.org/content/ms-cxr/), over "
        "MIMIC-CXR-JPG 2.0.0",
    )
    splits = ("train", "val", "test")
    env_vars = {"csv_path": "RADHARMONY_MS_CXR_CSV", "base_image_dir": "RADHARMONY_MIMIC_FILES_DIR"}
    layout = f"""\
ms-cxr/{CSV_NAME}              (RADHARMONY_MS_CXR_CSV)
mimic-cxr/files/pNN/pNNNNNNNN/sNNNNNNNN/<dicom_id>.jpg or .dcm   (RADHARMONY_MIMIC_FILES_DIR)
mimic-cxr/mimic-cxr-2.0.0-metadata.csv.gz   (optional, view positions; else DICOM headers)
mimic-cxr/mimic-cxr-2.0.0-split.csv.gz      (optional, MIMIC-CXR's official split)
mimic-cxr/{CHEXPERT_NAMES[0]}   (optional, MIMIC's report labels per study)"""
    documented_counts = ExpectedCounts(
        origin="MS-CXR dataset page",
        total={"images": 1047, "annotations": 1448},
    )
    has_boxes = True
    count_hints = {
        "images": "rows of the MS-CXR CSV for split {split}",
        "annotations": "box rows of the MS-CXR CSV for split {split}",
        "patients": "rows of the MS-CXR CSV for split {split}",
        "studies": "rows of the MS-CXR CSV for split {split}",
    }

    @cached_property
    def _layout(self) -> tuple[SourcePath | None, Found, Found]:
        """(the CSV file given, the folder to find it in, MIMIC-CXR's files/)."""
        # Resolved on first use: opening a reader does no I/O (a store may be unreachable).
        csv, folder = self._location.csv_path, self._location.root
        if csv is not None and source_store.is_dir(csv):
            # The CSV variable naming the folder that holds the CSV (any release).
            csv, folder = None, csv
        return (
            csv,
            ms_cxr_csv_folder(folder, self._data_root),
            mimic_files_dir(self._location.base_image_dir, self._data_root),
        )

    @property
    def _csv_given(self) -> SourcePath | None:
        return self._layout[0]

    @property
    def _csv_folder(self) -> SourcePath:
        return self._layout[1].path

    @property
    def _files(self) -> SourcePath:
        return self._layout[2].path

    @cached_property
    def _layout_notes(self) -> list[str]:
        return [found.note for found in self._layout[1:] if found.note]

    @property
    def root(self) -> SourcePath:
        return self.csv_path().parent

    def csv_path(self) -> SourcePath:
        """The given CSV, else the v1.1.0 CSV (or another MS-CXR release) in the folder."""
        if self._csv_given is not None:
            return self._csv_given
        preferred = self._csv_folder / CSV_NAME
        if source_store.exists(preferred) or not source_store.is_dir(self._csv_folder):
            return preferred
        releases = sorted(
            source_store.glob(self._csv_folder, "MS_CXR_Local_Alignment_v*.csv"), key=str
        )
        return releases[-1] if releases else preferred

    def _split_rows(self, split: str) -> pd.DataFrame:
        """The CSV's rows of one split, validated, with their line numbers as `csv_row`."""
        self.check_split(split)
        csv_path = self.require(self.csv_path(), "MS-CXR annotation CSV")
        boxes = read_csv(
            csv_path, dtype={"dicom_id": "string", "path": "string"}, columns=CSV_COLUMNS
        )
        require_columns(boxes, CSV_COLUMNS, csv_path)
        boxes["csv_row"] = np.arange(len(boxes)) + 2
        boxes["split"] = _normalized_splits(boxes, csv_path)
        _check_categories(boxes, csv_path)
        return boxes[boxes["split"] == split]

    def image_dir(self, split: str) -> SourcePath:
        self.check_split(split)
        return self._files

    def annotation_files(self, split: str) -> list[SourcePath]:
        mimic_root = self._files.parent
        optional = [metadata_csv(mimic_root), chexpert_csv(mimic_root)]
        return [self.csv_path(), *(p for p in optional if p is not None), *self.parent_files()]

    # MIMIC-CXR-JPG's CheXpert labels of every study, when the user has the file.
    report_label_source = MIMIC_CHEXPERT

    def read_report_labels(self, split: str, index: pd.DataFrame) -> ReportLabelFile | None:
        """Per image of `index` whose study the file labels, that study's labels."""
        path = chexpert_csv(self._files.parent)
        if path is None:
            return None
        studies = read_study_labels(path)
        images = index[["image_id", "study_id"]].astype("string")
        labelled = images.merge(studies, on="study_id", how="inner", validate="many_to_one")
        return ReportLabelFile(path, labelled.drop(columns="study_id").reset_index(drop=True))

    parent_dataset = "mimic_cxr"

    def parent_files(self) -> list[SourcePath]:
        official = split_csv(self._files.parent)
        return [official] if official is not None else []

    def parent_identity(self, split: str, index: pd.DataFrame) -> pd.DataFrame:
        """MIMIC's dicom_id, subject and study; the official split and the subject's splits
        only when the split file is there."""
        dicom_ids = index["image_id"].str.removeprefix(f"{self.key}/")
        official_split = patient_splits = None
        for path in self.parent_files():
            official = read_official_splits(path)
            official_split = dicom_ids.map(official.set_index("dicom_id")["split"]).to_numpy()
            by_subject = splits_by_patient(official["subject_id"], official["split"])
            patient_splits = patient_splits_of(index["patient_id"], by_subject)
        return parent_identity(
            len(index),
            self.parent_dataset,
            image_ids=dicom_ids.to_numpy(),
            patient_ids=index["patient_id"].to_numpy(),
            study_ids=index["study_id"].to_numpy(),
            splits=official_split,
            patient_splits=patient_splits,
        )

    def image_states(self, split: str) -> dict[str, FileState]:
        # The files/ tree is all of MIMIC-CXR; only the images the CSV names belong to the split.
        index = self.read_split(split).index
        named = index.loc[index["status"] == STATUS_OK, "image_path"]
        return source_store.named_states(self._files, named)

    def read_split(self, split: str) -> SplitTables:
        self.check_split(split)
        if not source_store.is_dir(self._files):
            raise DatasetLayoutError(
                self.key,
                self._files,
                self.env_vars["base_image_dir"],
                self.layout,
                "MIMIC-CXR files/ folder not found",
                nearby(self._files),
            )
        csv_path = self.csv_path()
        boxes = self._split_rows(split)
        images = _images_of(boxes, csv_path)
        relative = self._resolve_extensions(images["stem"])
        errors = RowErrors(len(images))
        lines = images["csv_row"].tolist()
        errors.update(confine_paths(relative, csv_path, lambda i: f"row {lines[i]}", "path"))
        # An unusable path is an error row: its DICOM header is never read for the view.
        usable = pd.Series([i not in errors for i in range(len(images))], index=images.index)
        view_raw = raw_view_positions(self._files, images["dicom_id"], relative.where(usable))
        index = index_frame(
            self.key,
            split,
            {
                "native_id": images["dicom_id"],
                "patient_id": images["patient"],
                "study_id": images["study"],
                "image_path": relative,
                "view_position": normalize_view_positions(view_raw),
                "view_position_raw": view_raw,
                "source_height": images["image_height"],
                "source_width": images["image_width"],
            },
        )
        labels = label_frame(index["image_id"], _label_columns(boxes, images["dicom_id"]))
        return SplitTables(index=index, labels=labels).with_row_errors(errors)

    def read_boxes(self, split: str) -> pd.DataFrame:
        """One row per CSV row of the split: top-left + size in image_width × image_height."""
        boxes = self._split_rows(split)
        frame = pd.DataFrame(
            {
                "image_id": self.key + "/" + boxes["dicom_id"],
                "box_index": boxes.groupby("dicom_id", sort=False).cumcount(),
                "label": boxes["category_name"].map(unified_class),
                "label_text": boxes["label_text"].astype("string"),
                **{
                    axis: pd.to_numeric(boxes[axis], errors="coerce")
                    for axis in ("x", "y", "w", "h")
                },
                "frame_height": pd.to_numeric(boxes["image_height"], errors="coerce"),
                "frame_width": pd.to_numeric(boxes["image_width"], errors="coerce"),
            }
        )
        return frame.reset_index(drop=True)

    def _resolve_extensions(self, stems: pd.Series) -> pd.Series:
        """Per file: `.jpg` if present, else `.dcm` if present, else the CSV's `.jpg`.

        Trees that mix JPG and DICOM exist, so the extension is never inferred from one row.
        Present is any kind of entry: a FIFO or folder under the name is what the images
        stage then reports, rather than a `.jpg` that was never there.
        """

        def resolve(stem: str) -> str:
            for suffix in (".jpg", ".dcm"):
                if source_store.exists(self._files / (stem + suffix)):
                    return stem + suffix
            return stem + ".jpg"

        return pd.Series([resolve(stem) for stem in stems], index=stems.index, dtype="string")

    def count_metrics(self, tables: SplitTables) -> dict[str, int]:
        return {
            **identity_counts(tables.index),
            "annotations": int(tables.labels["num_boxes"].sum()),
        }


def _normalized_splits(boxes: pd.DataFrame, csv_path: SourcePath) -> pd.Series:
    raw = boxes["split"].astype("string").str.strip().str.lower()
    split = raw.map(_SPLITS)
    fail_at_first_bad_row(
        split.isna(),
        csv_path,
        lambda row: f"split {boxes['split'].iloc[row]!r} is not train, val or test",
        "Use the MS-CXR CSV as downloaded",
    )
    return split


def _check_categories(boxes: pd.DataFrame, csv_path: SourcePath) -> None:
    fail_at_first_bad_row(
        ~boxes["category_name"].isin(CATEGORIES),
        csv_path,
        lambda row: (
            f"category_name {boxes['category_name'].iloc[row]!r} is not one of "
            + ", ".join(CATEGORIES)
        ),
        "Use the MS-CXR v1.1.0 CSV as downloaded",
    )


def _images_of(boxes: pd.DataFrame, csv_path: SourcePath) -> pd.DataFrame:
    """One row per dicom_id, with ids parsed from `path` and the image size, checked consistent."""
    parts = boxes["path"].str.strip().str.extract(_PATH)
    parts.columns = ["stem", "patient", "study", "path_dicom_id"]
    bad = (parts["stem"].isna() | (parts["path_dicom_id"] != boxes["dicom_id"])).to_numpy()
    if bad.any():
        row = boxes["csv_row"].iloc[int(np.flatnonzero(bad)[0])]
        raise MetadataError(
            csv_path,
            f"row {row}",
            f"path {boxes['path'].iloc[int(np.flatnonzero(bad)[0])]!r} is not "
            "files/pNN/pNNNNNNNN/sNNNNNNNN/<dicom_id>.jpg with this row's dicom_id",
            "Use the MS-CXR CSV as downloaded",
        )
    table = pd.concat(
        [boxes[["dicom_id", "image_width", "image_height", "csv_row"]], parts], axis=1
    )
    per_image = table.groupby("dicom_id", sort=False)
    inconsistent = per_image[["stem", "image_width", "image_height"]].nunique().gt(1).any(axis=1)
    if inconsistent.any():
        dicom_id = inconsistent[inconsistent].index[0]
        rows = table.loc[table["dicom_id"] == dicom_id, "csv_row"].tolist()
        raise MetadataError(
            csv_path,
            f"rows {rows}",
            f"dicom_id {dicom_id} has differing path or image size across rows",
            "Every box row of one image must agree on path and size",
        )
    images = per_image.first().reset_index()
    for column in ("image_width", "image_height"):
        images[column] = pd.to_numeric(images[column], errors="coerce").astype("Int64")
    return images


def _label_columns(boxes: pd.DataFrame, dicom_ids: pd.Series) -> dict[str, object]:
    """Native 0/1 flags per category, phrases, and positives-only unified labels.

    A category without a box is unknown, not absent: MS-CXR only grounds phrases that a
    report mentions, so it never says a finding is missing.
    """
    order = pd.Index(dicom_ids)
    present = pd.crosstab(boxes["dicom_id"], boxes["category_name"]).reindex(
        index=order, columns=list(CATEGORIES), fill_value=0
    )
    flags = {snake_case(name): (present[name] > 0).astype("Int8").to_numpy() for name in CATEGORIES}
    unified = {
        f"label_{unified_class(name)}": pd.array(
            np.where(present[name] > 0, 1, pd.NA), dtype="Int8"
        )
        for name in CATEGORIES
    }
    # One phrase per CSV row (= per box, in box_index order), duplicates kept: entry i
    # describes box i. A phrase grounded by two boxes appears twice.
    phrases = (
        boxes.groupby("dicom_id", sort=False)["label_text"]
        .agg(lambda texts: [None if pd.isna(t) else str(t) for t in texts])
        .reindex(order)
    )
    num_boxes = boxes.groupby("dicom_id", sort=False).size().reindex(order)
    return {
        **flags,
        "num_boxes": num_boxes.astype("int32").to_numpy(),
        "report": pd.array([None] * len(order), dtype="string"),
        "label_text": phrases.tolist(),
        **unified,
    }
