"""MIMIC-CXR's own report labels (`mimic-cxr-2.0.0-chexpert.csv.gz`, from MIMIC-CXR-JPG: the
CheXpert labeler run on every study's report), when the user has put the file at the
MIMIC-CXR root beside `files/`."""

from __future__ import annotations

import pandas as pd

from ..processing.reports.report_table import LabelValueError, observation_columns, tri_state_labels
from ..processing.storage import source_store
from ..processing.storage.source_store import SourcePath
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
    observations = observation_columns(c for c in table.columns if c not in STUDY_COLUMNS)
    if not observations:
        raise MetadataError(
            path, "header", "no CheXpert observation column (e.g. `Pleural Effusion`)", _FIX
        )
    labels = {"study_id": table["study_id"].str.strip()}
    for column, target in observations.items():
        try:
            labels[target] = tri_state_labels(table[column])
        except LabelValueError as error:
            where = f"row {error.position + 2}"
            raise MetadataError(path, where, f"{column}: {error}", _FIX) from error
    frame = pd.DataFrame(labels)
    return frame.dropna(subset=["study_id"]).drop_duplicates("study_id").reset_index(drop=True)
