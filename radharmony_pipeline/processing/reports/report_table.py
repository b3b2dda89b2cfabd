"""Report labels as `report_labels` rows: each distinct report text read once, every row keyed
by the labeler's version and the text's SHA-256, so an earlier run's rows are reused for
texts it has already read and only new or changed texts reach the labeler; rows of labels a
file gives; other labelers' column names and values mapped onto the observations; the
figures the checks and the profile show."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from radharmony_pipeline.processing.tables.table_schemas import (
    EVIDENCE,
    REPORT_LABEL_COLUMNS,
    REPORT_LABEL_PREFIX,
    REPORT_LABELS,
    REPORT_RULES,
)
from radharmony_pipeline.vocabulary import (
    NEGATIVE,
    NO_FINDING,
    POSITIVE,
    REPORT_OBSERVATIONS,
    UNCERTAIN,
)

if TYPE_CHECKING:
    # The labeler imports spaCy (and with it torch, when installed): only its type here, so
    # the definitions load without it.
    from radharmony_pipeline.processing.reports.labeler import ReportReading

# The largest share of a partition's distinct reports in which no observation is mentioned
# at all (every report_label_* but no finding null). Radiology reports of chest films nearly
# always name what was looked for ("no effusion", "heart size normal"); a larger share means
# the texts are not the findings and impression of chest reports (a wrong column, truncated
# text) or the labeler misses a phrasing the corpus uses.
UNMENTIONED_REPORTS_LIMIT = 0.2

# The observation columns except no finding, which a read text gets without any mention.
_MENTION_COLUMNS = tuple(
    c for c in REPORT_LABEL_COLUMNS if c != f"{REPORT_LABEL_PREFIX}{NO_FINDING}"
)
# States of a report label in the prevalence figures, by value (null: not mentioned).
PREVALENCE_STATES: dict[str, int] = {
    "positive": POSITIVE,
    "uncertain": UNCERTAIN,
    "negative": NEGATIVE,
}


class ReportReader(Protocol):
    """What reads report texts: the report labeler, or a stand-in in tests."""

    def read_many(self, texts: Sequence[str]) -> list[ReportReading]: ...


@dataclass(frozen=True)
class LabelledReports:
    """A partition's report_labels rows, and how many distinct texts were read or reused."""

    table: pd.DataFrame
    distinct_reports: int
    labelled: int
    reused: int


def text_sha256(texts: Iterable[str]) -> list[str]:
    """The SHA-256 of each text's UTF-8 bytes, in hex."""
    return [hashlib.sha256(text.encode("utf-8")).hexdigest() for text in texts]


def label_reports(
    image_ids: pd.Series,
    reports: pd.Series,
    reader: ReportReader,
    labeler_version: str,
    previous: pa.Table | None = None,
) -> LabelledReports:
    """One row per image with a report (null reports have none), in the given order.

    Each distinct text is read once; a text whose (labeler_version, SHA-256) key has a row in
    `previous` (the partition's last report_labels file, as Arrow: its evidence is never
    turned into Python objects) takes that row's labels and evidence instead of being read.
    """
    has_report = reports.notna().to_numpy()
    if not has_report.all():  # a boolean selection copies every column: only when needed
        image_ids, reports = image_ids[has_report], reports[has_report]
    ids = image_ids.astype("string").reset_index(drop=True)
    codes, uniques = pd.factorize(reports.astype(str))
    # As Python strings once: iterating the Arrow-backed values costs more than hashing them.
    distinct = uniques.to_numpy(dtype=object)
    keys = pa.array(text_sha256(distinct), pa.string())
    stored = _reusable_rows(previous, labeler_version)
    # Each text's first row in the stored ones (null: not there).
    at = pc.index_in(keys, value_set=stored.column("report_sha256").combine_chunks())
    reused = at.is_valid().to_numpy(zero_copy_only=False)
    to_read = [text for text, done in zip(distinct, reused, strict=True) if not done]
    read = _readings_table(reader.read_many(to_read) if to_read else [])
    kept = stored.select(read.column_names).cast(read.schema).take(at.filter(reused))
    # Each distinct text's row in read + kept, in the order of `distinct`.
    order = np.empty(len(keys), dtype=np.int64)
    order[~reused] = np.arange(len(to_read))
    order[reused] = len(to_read) + np.arange(int(reused.sum()))
    per_text = pa.concat_tables([read, kept]).take(pa.array(order))
    per_text = per_text.append_column("report_sha256", keys)
    table = _rows(ids, labeler_version, per_text.take(pa.array(codes, pa.int64())))
    return LabelledReports(
        table=table,
        distinct_reports=len(keys),
        labelled=len(to_read),
        reused=int(reused.sum()),
    )


def _reusable_rows(previous: pa.Table | None, labeler_version: str) -> pa.Table:
    """The previous rows that the same labeler version read from a text."""
    if previous is None:
        return REPORT_LABELS.arrow().empty_table()
    same = pc.and_(
        pc.equal(previous.column("report_label_source"), REPORT_RULES),
        pc.equal(previous.column("report_labeler_version"), labeler_version),
    )
    return previous.filter(pc.and_(same, pc.is_valid(previous.column("report_sha256"))))


def _evidence_dicts(reading: ReportReading) -> list[dict[str, object]]:
    return [
        {"observation": e.observation, "value": e.value, "sentence": e.sentence}
        for e in reading.evidence
    ]


def _readings_table(readings: Sequence[ReportReading]) -> pa.Table:
    """The report_label_* columns and the evidence of each reading, in order."""
    return pa.table(
        {
            **{
                column: pa.array([reading.labels.get(name) for reading in readings], pa.int8())
                for name, column in zip(REPORT_OBSERVATIONS, REPORT_LABEL_COLUMNS, strict=True)
            },
            "report_label_evidence": pa.array(list(map(_evidence_dicts, readings)), EVIDENCE),
        }
    )


def _rows(ids: pd.Series, version: str, per_image: pa.Table) -> pd.DataFrame:
    """The rows in declared column order (dataset and split are the partition's, filled on
    writing); the evidence stays in its declared Arrow type."""
    frame = pd.DataFrame(
        {
            "image_id": ids,
            "report_labeler_version": pd.Series(version, index=ids.index, dtype="string"),
            "report_sha256": pd.Series(
                per_image.column("report_sha256").to_pandas(), index=ids.index, dtype="string"
            ),
            "report_label_source": pd.Series(REPORT_RULES, index=ids.index, dtype="string"),
        }
    )
    frame = pd.concat([frame, _label_frame(per_image, ids.index)], axis=1)
    return frame[[c for c in REPORT_LABELS.names if c in frame.columns]]


def _label_frame(per_row: pa.Table, index: pd.Index) -> pd.DataFrame:
    """The report_label_* columns (nullable Int8) and the evidence of an Arrow table."""
    frame = pd.DataFrame(
        {
            column: pd.Series(per_row.column(column).to_pandas(), index=index).astype("Int8")
            for column in REPORT_LABEL_COLUMNS
        },
        index=index,
    )
    frame["report_label_evidence"] = evidence_series(per_row.column("report_label_evidence"), index)
    return frame


def evidence_series(values: pa.ChunkedArray | pa.Array, index: pd.Index) -> pd.Series:
    """Evidence lists as a pandas column of the declared Arrow type (written as declared)."""
    return pd.Series(pd.arrays.ArrowExtensionArray(values.cast(EVIDENCE)), index=index, copy=False)


def read_texts(texts: pd.Series, reader: ReportReader) -> pd.DataFrame:
    """One row per text, in order: the report_label_* columns and the evidence (for reports a
    user holds, outside any partition). Each distinct text is read once; a null text gets
    null labels and no evidence."""
    present = texts.notna().to_numpy()
    codes, distinct = pd.factorize(texts[present].astype(str))
    read = _readings_table(reader.read_many(list(distinct)) if len(distinct) else [])
    # One more row, all null and without evidence: where the null texts point.
    nothing = pa.table(
        {
            **{column: pa.nulls(1, pa.int8()) for column in REPORT_LABEL_COLUMNS},
            "report_label_evidence": pa.array([[]], EVIDENCE),
        }
    )
    positions = np.full(len(texts), len(distinct), dtype=np.int64)
    positions[present] = codes
    per_text = pa.concat_tables([read, nothing]).take(pa.array(positions))
    return _label_frame(per_text, pd.RangeIndex(len(texts)))


def report_label_prevalence(table: pd.DataFrame) -> dict[str, dict[str, int]]:
    """Per observation: rows positive, uncertain, negative and not mentioned."""
    figures = {}
    for name, column in zip(REPORT_OBSERVATIONS, REPORT_LABEL_COLUMNS, strict=True):
        values = table[column] if column in table else pd.Series(dtype="Int8")
        counts = {state: int(values.eq(value).sum()) for state, value in PREVALENCE_STATES.items()}
        figures[name] = {**counts, "not_mentioned": int(values.isna().sum())}
    return figures


def unmentioned_share(table: pd.DataFrame) -> tuple[int, int]:
    """(distinct reports in which no observation is mentioned at all, distinct reports);
    rows without a report hash (labels read from a file) count one per row."""
    if table.empty:
        return 0, 0
    keys = table["report_sha256"].fillna(table["image_id"])
    distinct = table.loc[~keys.duplicated()]
    unmentioned = distinct[list(_MENTION_COLUMNS)].isna().all(axis=1)
    return int(unmentioned.sum()), len(distinct)


def empty_report_labels() -> pd.DataFrame:
    """A report_labels table without rows, typed as declared."""
    frame = pd.DataFrame(
        {
            "image_id": pd.Series(dtype="string"),
            "report_labeler_version": pd.Series(dtype="string"),
            "report_sha256": pd.Series(dtype="string"),
            **{column: pd.Series(dtype="Int8") for column in REPORT_LABEL_COLUMNS},
            "report_label_source": pd.Series(dtype="string"),
        }
    )
    frame["report_label_evidence"] = evidence_series(pa.array([], EVIDENCE), frame.index)
    return frame


def file_labels(labels: pd.DataFrame, source: str, version: str) -> pd.DataFrame:
    """report_labels rows for labels read from a file (`labels`: image_id and the
    report_label_* columns it has): no text hash, no evidence."""
    index = pd.RangeIndex(len(labels))
    frame = pd.DataFrame(
        {
            "image_id": labels["image_id"].astype("string").to_numpy(),
            "report_labeler_version": pd.Series(version, index=index, dtype="string"),
            "report_sha256": pd.Series(None, index=index, dtype="string"),
            **{
                column: (
                    labels[column].astype("Int8").to_numpy()
                    if column in labels
                    else pd.array([None] * len(index), dtype="Int8")
                )
                for column in REPORT_LABEL_COLUMNS
            },
            "report_label_source": pd.Series(source, index=index, dtype="string"),
        },
        index=index,
    )
    frame["report_label_evidence"] = evidence_series(pa.array([[] for _ in index], EVIDENCE), index)
    return frame
