"""`radharmony label-reports`: the report labeler over reports a user holds (a CSV or Parquet
file), and its agreement with labels the user holds for the same reports."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from ..processing.reports.label_files import LabelFileError, label_columns
from ..processing.reports.report_table import ReportReader, read_texts
from ..processing.storage.atomic import write_atomically
from ..processing.tables.table_schemas import REPORT_LABEL_PREFIX

if TYPE_CHECKING:
    from ..processing.reports.labeler import ReportReading

# Input formats by file suffix (lower case).
READERS = {".csv": "csv", ".csv.gz": "csv", ".parquet": "parquet", ".pq": "parquet"}
# Output formats by file suffix (lower case).
WRITERS = {".parquet": "parquet", ".csv": "csv"}
# Inputs with more distinct reports than this get a progress line per this many reports.
PROGRESS_EVERY = 10_000


class ReportInputError(ValueError):
    """A problem with the user's files or columns, said in one line with the fix."""


def read_table(path: Path) -> pd.DataFrame:
    """The CSV or Parquet file as a frame of text columns (CSV cells are kept as written)."""
    kind = next((k for s, k in READERS.items() if path.name.lower().endswith(s)), None)
    if kind is None:
        raise ReportInputError(
            f"{path}: not a CSV or Parquet file (expected one of {', '.join(READERS)})"
        )
    if not path.is_file():
        raise ReportInputError(f"{path}: no such file")
    try:
        if kind == "csv":
            frame = pd.read_csv(path, dtype="string", keep_default_na=False, na_values=[""])
        else:
            frame = pq.read_table(path).to_pandas()
    except pd.errors.EmptyDataError as error:
        raise ReportInputError(
            f"{path}: the file is empty; give a header and one row per report"
        ) from error
    except (pd.errors.ParserError, pa.ArrowInvalid, UnicodeDecodeError, OSError) as error:
        raise ReportInputError(f"{path}: not a readable {kind} file ({error})") from error
    if frame.empty:
        raise ReportInputError(f"{path}: no rows under the header; give one row per report")
    return frame


def output_format(path: Path) -> str:
    """The format the output's suffix names; a one-line error for any other suffix."""
    kind = next((k for s, k in WRITERS.items() if path.name.lower().endswith(s)), None)
    if kind is None:
        raise ReportInputError(
            f"{path}: the output's suffix names its format; use one of {', '.join(WRITERS)}"
        )
    return kind


class ReaderWithProgress:
    """A report reader that reads many texts in slices and reports after each:
    `progress(done, total)`."""

    def __init__(self, reader: ReportReader, progress: Callable[[int, int], None]):
        self.reader = reader
        self.progress = progress

    def read_many(self, texts: Sequence[str]) -> list[ReportReading]:
        if len(texts) <= PROGRESS_EVERY:
            return self.reader.read_many(texts)
        readings: list[ReportReading] = []
        for first in range(0, len(texts), PROGRESS_EVERY):
            readings += self.reader.read_many(texts[first : first + PROGRESS_EVERY])
            self.progress(len(readings), len(texts))
        return readings


def require_column(frame: pd.DataFrame, column: str, path: Path, option: str) -> None:
    if column not in frame.columns:
        raise ReportInputError(
            f"{path}: no column {column!r} (columns: {', '.join(map(str, frame.columns))}); "
            f"name the right one with {option}"
        )


def labelled_reports(
    reports: pd.DataFrame, text_column: str, id_column: str, reader: ReportReader
) -> pd.DataFrame:
    """One row per input row, in order: the id column (when the input has it), the
    report_label_* columns and the evidence."""
    texts = reports[text_column]
    blank = texts.astype("string").str.strip().eq("").fillna(True)
    labels = read_texts(texts.mask(blank.to_numpy()), reader)
    if id_column in reports.columns and id_column != text_column:
        labels.insert(0, id_column, reports[id_column].to_numpy())
    return labels


def write_labels(frame: pd.DataFrame, output: Path) -> None:
    """The frame as one Parquet or CSV file (by the output's suffix; in CSV the evidence as
    JSON text), never visible half-written."""
    output.parent.mkdir(parents=True, exist_ok=True)
    if output_format(output) == "csv":
        plain = frame.assign(
            report_label_evidence=[
                json.dumps([dict(e) for e in evidence])
                for evidence in frame["report_label_evidence"]
            ]
        )
        write_atomically(output, lambda temporary: plain.to_csv(temporary, index=False))
        return
    table = pa.Table.from_pandas(frame, preserve_index=False)
    # pandas cannot read its own name of the evidence's Arrow type back: the pandas metadata
    # of a plain object column instead (the labels keep their nullable Int8).
    plain = frame.head(0).astype({"report_label_evidence": object})
    table = table.replace_schema_metadata(
        pa.Table.from_pandas(plain, preserve_index=False).schema.metadata
    )
    write_atomically(output, lambda temporary: pq.write_table(table, temporary))


def reference_labels(path: Path, id_column: str) -> pd.DataFrame:
    """The user's labels, indexed by id (as text): one report_label_<name> column per
    observation column the file has (CheXpert's names, e.g. `Pleural Effusion`, or ours),
    1/0/-1 or null."""
    table = read_table(path)
    require_column(table, id_column, path, "--id-column")
    try:
        frame = label_columns(table.drop(columns=[id_column])).add_prefix(REPORT_LABEL_PREFIX)
    except LabelFileError as error:
        raise ReportInputError(f"{path}: {error}") from error
    frame.index = pd.Index(table[id_column].astype("string").str.strip(), name=id_column)
    duplicated = frame.index.duplicated()
    if duplicated.any():
        raise ReportInputError(
            f"{path}: id {frame.index[duplicated][0]!r} has several rows; ids must be unique"
        )
    return frame


def paired_labels(
    predicted: pd.DataFrame, reference: pd.DataFrame, id_column: str
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The predicted and reference labels of the ids both have, row-aligned, one column per
    observation the reference has (named by the observation)."""
    if id_column not in predicted.columns:
        raise ReportInputError(
            f"the reports have no column {id_column!r} to join the labels on; name it with "
            "--id-column"
        )
    ids = predicted[id_column].astype("string").str.strip()
    common = ids[ids.isin(reference.index)]
    if common.empty:
        raise ReportInputError(
            f"no id of the reports' {id_column!r} column is in the labels file (first ids: "
            f"{', '.join(ids.head(3).astype(str))} vs {', '.join(reference.index[:3])})"
        )
    columns = list(reference.columns)
    names = [c.removeprefix(REPORT_LABEL_PREFIX) for c in columns]
    ours = predicted.loc[common.index, columns].set_axis(names, axis=1).reset_index(drop=True)
    theirs = reference.loc[common.to_numpy(), columns].set_axis(names, axis=1)
    return ours, theirs.reset_index(drop=True)
