"""MIMIC-CXR's official split (`mimic-cxr-2.0.0-split.csv.gz`, from MIMIC-CXR-JPG), when the
user has put it at the MIMIC-CXR root beside `files/`."""

from __future__ import annotations

import pandas as pd

from ..processing.storage import source_store
from ..processing.storage.source_store import SourcePath
from .base import fail_at_first_bad_row, read_csv, require_columns
from .errors import MetadataError

SPLIT_NAMES = ("mimic-cxr-2.0.0-split.csv.gz", "mimic-cxr-2.0.0-split.csv")
SPLIT_COLUMNS = ("dicom_id", "study_id", "subject_id", "split")
OFFICIAL_SPLITS = ("train", "validate", "test")


def split_csv(mimic_root: SourcePath) -> SourcePath | None:
    """The official split file at the MIMIC-CXR root, when there is one."""
    return next((mimic_root / n for n in SPLIT_NAMES if source_store.is_file(mimic_root / n)), None)


def read_official_splits(path: SourcePath) -> pd.DataFrame:
    """`dicom_id, study_id, subject_id, split` as strings, every split checked."""
    table = read_csv(path, dtype={column: "string" for column in SPLIT_COLUMNS})
    require_columns(table, SPLIT_COLUMNS, path)
    table = table[list(SPLIT_COLUMNS)].apply(lambda column: column.str.strip())
    fail_at_first_bad_row(
        ~table["split"].isin(OFFICIAL_SPLITS),
        path,
        lambda row: (
            f"split {table['split'].iloc[row]!r} is not one of {', '.join(OFFICIAL_SPLITS)}"
        ),
        "Use mimic-cxr-2.0.0-split.csv.gz as downloaded from MIMIC-CXR-JPG",
    )
    duplicated = table["dicom_id"].duplicated(keep=False) & ~table.duplicated(keep=False)
    if duplicated.any():
        dicom_id = table.loc[duplicated, "dicom_id"].iloc[0]
        raise MetadataError(
            path,
            f"dicom_id {dicom_id}",
            "listed twice with different studies, subjects or splits",
            "Use mimic-cxr-2.0.0-split.csv.gz as downloaded from MIMIC-CXR-JPG",
        )
    return table.drop_duplicates("dicom_id").reset_index(drop=True)
