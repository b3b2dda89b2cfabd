"""MIMIC-CXR's own report labels (`mimic-cxr-2.0.0-chexpert.csv.gz`, from MIMIC-CXR-JPG: the
CheXpert labeler run on every study's report), when the user has put the file at the
MIMIC-CXR root beside `files/`."""

from __future__ import annotations

import pandas as pd

from ..processing.reports.label_files import LabelFileError, label_columns
from ..processing.storage import source_store
from ..processing.storage.source_store import SourcePath
from ..processing.tables.table_schemas import REPORT_LABEL_PREFIX
from .base import read_csv, require_columns
from .errors import MetadataError

CHEXPERT_NAMES = ("mimic-cxr-2.0.0-chexpert.csv.gz", "mimic-cxr-2.0.0-chexpert.csv")
STUDY_COLUMNS = ("subject_id", "study_id")
_FIX = "Use mimic-cxr-2.0.0-chexpert.csv.gz as downloaded from MIMIC-CXR-JPG"


def chexpert_csv(mimic_root: SourcePath) -> SourcePath | None:
    """The CheXpert labels file at the MIMIC-CXR root, when there is one."""
    return next(
        (mimic_root / n for n in CHEXPERT_NAMES if source_store.is_file(mimic_root / n)), None
    )


def read_study_labels(path: SourcePath) -> pd.DataFrame:
    """One row per study: `study_id` (as text) and a report_label_<name> column (nullable
    Int8: 1, 0, -1, null) per observation the file has."""
    table = read_csv(path, dtype="string", columns=STUDY_COLUMNS)
    require_columns(table, STUDY_COLUMNS, path)
    try:
        labels = label_columns(table.drop(columns=list(STUDY_COLUMNS)))
    except LabelFileError as error:
        if error.row is None:
            raise MetadataError(path, "header", error.problem, _FIX) from error
        problem = f"{error.column}: {error.problem}"
        raise MetadataError(path, f"row {error.row}", problem, _FIX) from error
    frame = labels.add_prefix(REPORT_LABEL_PREFIX)
    frame.insert(0, "study_id", table["study_id"].str.strip())
    return frame.dropna(subset=["study_id"]).drop_duplicates("study_id").reset_index(drop=True)
