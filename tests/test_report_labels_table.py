"""Report readings as report_labels rows: each distinct text read once, rows reused by
(labeler version, text SHA-256), the column names of other labelers mapped onto ours.

A stand-in reader replaces the spaCy labeler: these tests count what reaches it."""

from __future__ import annotations

import gzip
import io
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from radharmony_pipeline.processing.reports.label_files import (
    LabelFileError,
    LabelValueError,
    label_columns,
    observation_columns,
    tri_state_labels,
)
from radharmony_pipeline.processing.reports.labeler import Evidence, ReportReading
from radharmony_pipeline.processing.reports.report_table import (
    label_reports,
    read_texts,
    report_label_prevalence,
    text_sha256,
    unmentioned_share,
)
from radharmony_pipeline.processing.tables.table_schemas import (
    MIMIC_CHEXPERT,
    REPORT_LABEL_COLUMNS,
    REPORT_LABELS,
    REPORT_RULES,
    conform,
)
from radharmony_pipeline.sources.errors import MetadataError
from radharmony_pipeline.sources.mimic_chexpert import read_study_labels

EFFUSION = "FINDINGS:\nSmall left pleural effusion."
EDEMA = "IMPRESSION:\nPossible edema. No pneumothorax."
NOTHING = "IMPRESSION:\nStable chest."


@dataclass
class CountingReader:
    """Reads a few fixed texts; records every text it was given."""

    seen: list[str] = field(default_factory=list)

    def read_many(self, texts: Sequence[str]) -> list[ReportReading]:
        self.seen += list(texts)
        return [self._read(text) for text in texts]

    @staticmethod
    def _read(text: str) -> ReportReading:
        if "effusion" in text:
            return ReportReading(
                {"pleural_effusion": 1},
                (Evidence("pleural_effusion", 1, "Small left pleural effusion."),),
                True,
            )
        if "edema" in text:
            return ReportReading(
                {"edema": -1, "pneumothorax": 0},
                (Evidence("edema", -1, "Possible edema."),),
                True,
            )
        return ReportReading({"no_finding": 1}, (), False)


def reports() -> tuple[pd.Series, pd.Series]:
    ids = pd.Series(["rex/a", "rex/b", "rex/c", "rex/d", "rex/e"], dtype="string")
    texts = pd.Series([EFFUSION, None, EDEMA, EFFUSION, NOTHING], dtype="string")
    return ids, texts


def written_and_read_back(table: pd.DataFrame) -> pa.Table:
    """The table as the IO manager writes it and the next run reads it."""
    buffer = io.BytesIO()
    conformed = conform(table, REPORT_LABELS, {"dataset": "rexgradient", "split": "test"})
    pq.write_table(conformed, buffer)
    buffer.seek(0)
    return pq.read_table(buffer)


def test_each_distinct_text_is_read_once_and_every_image_with_a_report_gets_its_row():
    reader = CountingReader()
    ids, texts = reports()
    result = label_reports(ids, texts, reader, "v1")
    assert reader.seen == [EFFUSION, EDEMA, NOTHING]
    assert (result.distinct_reports, result.labelled, result.reused) == (3, 3, 0)
    table = result.table
    assert table["image_id"].tolist() == ["rex/a", "rex/c", "rex/d", "rex/e"]
    assert table["report_label_pleural_effusion"].tolist() == [1, pd.NA, 1, pd.NA]
    assert table["report_label_edema"].tolist() == [pd.NA, -1, pd.NA, pd.NA]
    assert table["report_label_pneumothorax"].tolist() == [pd.NA, 0, pd.NA, pd.NA]
    assert table["report_sha256"].tolist() == text_sha256([EFFUSION, EDEMA, EFFUSION, NOTHING])
    assert set(table["report_label_source"]) == {REPORT_RULES}
    assert set(table["report_labeler_version"]) == {"v1"}
    evidence = table["report_label_evidence"].tolist()
    assert evidence[1] == [{"observation": "edema", "value": -1, "sentence": "Possible edema."}]
    assert evidence[3] == []
    # It fits the declared schema as it is.
    conformed = conform(table, REPORT_LABELS, {"dataset": "rexgradient", "split": "test"})
    assert conformed.num_rows == 4


def test_an_unchanged_partition_reads_nothing_and_gives_the_same_rows():
    ids, texts = reports()
    first = label_reports(ids, texts, CountingReader(), "v1").table
    reader = CountingReader()
    again = label_reports(ids, texts, reader, "v1", previous=written_and_read_back(first))
    assert reader.seen == []
    assert (again.labelled, again.reused) == (0, 3)
    pd.testing.assert_frame_equal(again.table, first)


def test_only_new_texts_are_read_and_a_new_labeler_version_reads_every_text():
    ids, texts = reports()
    previous = written_and_read_back(label_reports(ids, texts, CountingReader(), "v1").table)
    changed = texts.copy()
    changed.iloc[4] = "IMPRESSION:\nNew text."
    reader = CountingReader()
    result = label_reports(ids, changed, reader, "v1", previous=previous)
    assert reader.seen == ["IMPRESSION:\nNew text."]
    assert (result.labelled, result.reused) == (1, 2)

    reader = CountingReader()
    result = label_reports(ids, texts, reader, "v2", previous=previous)
    assert reader.seen == [EFFUSION, EDEMA, NOTHING]
    assert (result.labelled, result.reused) == (3, 0)
    assert set(result.table["report_labeler_version"]) == {"v2"}


def test_rows_read_from_a_file_are_never_reused_as_rule_readings():
    ids, texts = reports()
    previous = written_and_read_back(label_reports(ids, texts, CountingReader(), "v1").table)
    sources = pa.array([MIMIC_CHEXPERT] * previous.num_rows, pa.string())
    previous = previous.set_column(
        previous.schema.get_field_index("report_label_source"), "report_label_source", sources
    )
    reader = CountingReader()
    label_reports(ids, texts, reader, "v1", previous=previous)
    assert len(reader.seen) == 3


def test_texts_of_a_users_file_keep_their_rows_and_order_nulls_included():
    reader = CountingReader()
    texts = pd.Series([EDEMA, None, EDEMA, EFFUSION])
    frame = read_texts(texts, reader)
    assert reader.seen == [EDEMA, EFFUSION]
    assert list(frame.columns) == [*REPORT_LABEL_COLUMNS, "report_label_evidence"]
    assert frame["report_label_edema"].tolist() == [-1, pd.NA, -1, pd.NA]
    assert frame["report_label_pleural_effusion"].tolist() == [pd.NA, pd.NA, pd.NA, 1]
    assert frame.loc[1, REPORT_LABEL_COLUMNS].isna().all()
    assert frame["report_label_evidence"].tolist()[1] == []


def test_prevalence_and_unmentioned_reports_count_distinct_texts():
    ids, texts = reports()
    table = label_reports(ids, texts, CountingReader(), "v1").table
    prevalence = report_label_prevalence(table)
    assert prevalence["pleural_effusion"] == {
        "positive": 2,
        "uncertain": 0,
        "negative": 0,
        "not_mentioned": 2,
    }
    assert prevalence["edema"]["uncertain"] == 1
    assert prevalence["pneumothorax"]["negative"] == 1
    # NOTHING mentions no observation (no finding alone is not a mention).
    assert unmentioned_share(table) == (1, 3)


@pytest.mark.parametrize(
    ("column", "observation"),
    [
        ("Pleural Effusion", "pleural_effusion"),
        ("No Finding", "no_finding"),
        ("Enlarged Cardiomediastinum", "enlarged_cardiomediastinum"),
        ("Airspace Opacity", "lung_opacity"),
        ("report_label_edema", "edema"),
        ("support_devices", "support_devices"),
    ],
)
def test_other_labelers_column_names_map_onto_the_observations(column, observation):
    assert observation_columns([column, "id", "subject_id"]) == {column: observation}
    assert observation_columns([f"gold_{column}", column], prefix="gold_") == {
        f"gold_{column}": observation
    }


def test_two_columns_naming_one_observation_are_refused():
    with pytest.raises(LabelFileError, match=r"Pleural Effusion.*pleural_effusion"):
        observation_columns(["Pleural Effusion", "pleural_effusion"])


def test_one_parser_reads_every_label_file():
    table = pd.DataFrame(
        {"id": ["a", "b"], "Pleural Effusion": ["1.0", ""], "edema": ["-1", "0"]}, dtype="string"
    )
    labels = label_columns(table)
    assert list(labels.columns) == ["pleural_effusion", "edema"]
    assert labels["pleural_effusion"].tolist() == [1, pd.NA]
    assert labels["edema"].tolist() == [-1, 0]
    with pytest.raises(LabelFileError, match="row 3: column 'edema': 'maybe'"):
        label_columns(table.assign(edema=["1", "maybe"]))
    with pytest.raises(LabelFileError, match="no observation column"):
        label_columns(table[["id"]])


def test_tri_state_values_as_written_by_chexpert_files():
    values = pd.Series(["1.0", "0.0", "-1.0", "", None, " 1 "], dtype="string")
    assert tri_state_labels(values).tolist() == [1, 0, -1, pd.NA, pd.NA, 1]
    with pytest.raises(LabelValueError) as error:
        tri_state_labels(pd.Series(["1", "2.0"]))
    assert error.value.position == 1


def test_mimic_chexpert_file_gives_labels_per_study(tmp_path: Path):
    text = (
        "subject_id,study_id,Atelectasis,No Finding,Pleural Effusion,Support Devices\n"
        "10000032,50414267,,1.0,,\n"
        "10000032,53189527,-1.0,,1.0,0.0\n"
    )
    path = tmp_path / "mimic-cxr-2.0.0-chexpert.csv.gz"
    path.write_bytes(gzip.compress(text.encode()))
    studies = read_study_labels(path)
    assert studies["study_id"].tolist() == ["50414267", "53189527"]
    assert studies["report_label_atelectasis"].tolist() == [pd.NA, -1]
    assert studies["report_label_no_finding"].tolist() == [1, pd.NA]
    assert studies["report_label_support_devices"].tolist() == [pd.NA, 0]


def test_a_bad_value_in_mimic_chexpert_names_the_row_and_column(tmp_path: Path):
    path = tmp_path / "mimic-cxr-2.0.0-chexpert.csv"
    path.write_text("subject_id,study_id,Edema\n1,2,1.0\n1,3,yes\n")
    with pytest.raises(MetadataError, match=r"row 3.*Edema.*'yes'"):
        read_study_labels(path)


@pytest.mark.slow
def test_loading_the_definitions_does_not_import_spacy():
    # spaCy imports torch when it is installed: seconds that every process loading the
    # definitions would pay, not only the step that reads reports.
    code = "import sys, radharmony_pipeline.definitions; print('spacy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
