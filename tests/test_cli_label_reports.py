"""`radharmony label-reports` on a user's CSV and Parquet files, in process: one output row per
input row in order, the agreement with labels the user holds, one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

from radharmony_pipeline.cli import main
from radharmony_pipeline.processing.tables.table_schemas import REPORT_LABEL_COLUMNS

REPORTS = pd.DataFrame(
    {
        "id": ["r1", "r2", "r3", "r4", "r5"],
        "text": [
            "FINDINGS: Small left pleural effusion. No pneumothorax.",
            "IMPRESSION: Possible right lower lobe pneumonia.",
            None,
            "FINDINGS: Small left pleural effusion. No pneumothorax.",
            "INDICATION: Rule out pneumonia.\nFINDINGS: The lungs are clear.",
        ],
    }
)
# What a CheXpert-style file says of the same reports (its own column names, 1.0/-1.0/blank).
AGREEING = (
    "id,Pleural Effusion,Pneumothorax,Pneumonia,No Finding\nr1,1.0,0.0,,\nr2,,,-1.0,\nr5,,,,1.0\n"
)


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


@pytest.fixture
def reports_csv(tmp_path: Path) -> Path:
    path = tmp_path / "reports.csv"
    REPORTS.to_csv(path, index=False)
    return path


def label(source: Path, output: Path, *extra: str) -> int:
    return main(
        [
            "label-reports",
            "--input",
            str(source),
            "--text-column",
            "text",
            "--output",
            str(output),
            *extra,
        ]
    )


def check_output(output: Path) -> None:
    table = pq.read_table(output).to_pandas()
    assert list(table.columns) == ["id", *REPORT_LABEL_COLUMNS, "report_label_evidence"]
    assert table["id"].tolist() == REPORTS["id"].tolist()
    assert table["report_label_pleural_effusion"].iloc[0] == 1
    assert pd.isna(table["report_label_pleural_effusion"].iloc[1])
    assert table["report_label_pneumothorax"].iloc[0] == 0
    assert table["report_label_pneumonia"].iloc[1] == -1
    # No text: every label null, never "no finding".
    assert table.loc[2, list(REPORT_LABEL_COLUMNS)].isna().all()
    # The same text, the same labels; "rule out" in the indication is a question.
    assert table.loc[3, list(REPORT_LABEL_COLUMNS)].equals(table.loc[0, list(REPORT_LABEL_COLUMNS)])
    assert table["report_label_no_finding"].iloc[4] == 1
    assert pd.isna(table["report_label_pneumonia"].iloc[4])
    evidence = list(table["report_label_evidence"].iloc[1])
    assert [(e["observation"], e["value"]) for e in evidence] == [("pneumonia", -1)]
    assert "pneumonia" in evidence[0]["sentence"]


def test_labels_a_csv_row_by_row(reports_csv, tmp_path, capsys):
    output = tmp_path / "out" / "labels.parquet"
    assert label(reports_csv, output) == 0
    assert "5 reports" in capsys.readouterr().out
    check_output(output)


def test_labels_a_parquet_file_row_by_row(tmp_path):
    source = tmp_path / "reports.parquet"
    REPORTS.to_parquet(source, index=False)
    output = tmp_path / "labels.parquet"
    assert label(source, output) == 0
    check_output(output)


def test_agreement_with_the_users_labels_joined_by_id(reports_csv, tmp_path, capsys):
    labels = tmp_path / "labels.csv"
    labels.write_text(AGREEING)
    assert label(reports_csv, tmp_path / "out.parquet", "--agreement", str(labels)) == 0
    out = capsys.readouterr().out
    assert "on 3 reports" in out
    scores = {
        line[:18].strip(): line[18:].strip() for line in out.splitlines() if " F1 " in line + " "
    }
    assert scores["mention F1"] == "1.000"
    assert scores["negation F1"] == "1.000"
    assert scores["uncertainty F1"] == "1.000"
    assert scores["no finding F1"] == "1.000"


def test_agreement_shows_disagreement(reports_csv, tmp_path, capsys):
    labels = tmp_path / "labels.csv"
    labels.write_text("id,Pleural Effusion,Pneumonia\nr1,0.0,\nr2,,1.0\n")
    assert label(reports_csv, tmp_path / "out.parquet", "--agreement", str(labels)) == 0
    scores = {
        line[:18].strip(): line[18:].strip()
        for line in capsys.readouterr().out.splitlines()
        if "F1" in line
    }
    assert scores["mention F1"] == "1.000"
    assert scores["positive F1"] == "0.000"


@pytest.mark.parametrize(
    ("change", "names"),
    [
        ({"input": "missing.csv"}, ["missing.csv", "no such file"]),
        ({"input": "reports.txt"}, ["reports.txt", "not a CSV or Parquet"]),
        ({"text_column": "report"}, ["no column 'report'", "--text-column"]),
        ({"agreement": "missing-labels.csv"}, ["missing-labels.csv", "no such file"]),
        ({"agreement": "no-id.csv"}, ["no column 'id'", "--id-column"]),
        ({"agreement": "bad-value.csv"}, ["bad-value.csv", "row 2", "'Edema'", "'yes'"]),
        ({"agreement": "no-observation.csv"}, ["no observation column"]),
        ({"agreement": "other-ids.csv"}, ["no id of the reports"]),
    ],
)
def test_user_errors_are_one_line_with_exit_2(reports_csv, tmp_path, capsys, change, names):
    (tmp_path / "reports.txt").write_text("text\nx\n")
    (tmp_path / "no-id.csv").write_text("report,Edema\nr1,1\n")
    (tmp_path / "bad-value.csv").write_text("id,Edema\nr1,yes\n")
    (tmp_path / "no-observation.csv").write_text("id,comment\nr1,fine\n")
    (tmp_path / "other-ids.csv").write_text("id,Edema\nx9,1\n")
    options = {"input": reports_csv.name, "text_column": "text", **change}
    argv = [
        "label-reports",
        "--input",
        str(tmp_path / options["input"]),
        "--text-column",
        options["text_column"],
        "--output",
        str(tmp_path / "out.parquet"),
    ]
    if "agreement" in options:
        argv += ["--agreement", str(tmp_path / options["agreement"])]
    assert main(argv) == 2
    err = one_line_error(capsys)
    assert err.startswith("radharmony label-reports: error:")
    for name in names:
        assert name in err
    assert not (tmp_path / "out.parquet").exists()


def test_the_output_format_follows_its_suffix(reports_csv, tmp_path):
    assert label(reports_csv, tmp_path / "out.csv") == 0
    table = pd.read_csv(tmp_path / "out.csv")
    assert list(table.columns) == ["id", *REPORT_LABEL_COLUMNS, "report_label_evidence"]
    assert table["id"].tolist() == REPORTS["id"].tolist()
    assert table["report_label_pleural_effusion"].iloc[0] == 1
    evidence = json.loads(table["report_label_evidence"].iloc[1])
    assert [(e["observation"], e["value"]) for e in evidence] == [("pneumonia", -1)]
    assert label(reports_csv, tmp_path / "out.parquet") == 0
    check_output(tmp_path / "out.parquet")


@pytest.mark.parametrize(
    ("input_text", "output", "names"),
    [
        ("id,text\nr1,No effusion.\n", "out.json", ["out.json", ".parquet", ".csv"]),
        ("id,text\nr1,No effusion.\n", "out", ["suffix"]),
        ("", "out.parquet", ["reports.csv", "empty"]),
        ("id,text\n", "out.parquet", ["reports.csv", "no rows"]),
    ],
)
def test_a_wrong_output_or_empty_input_is_one_line(tmp_path, capsys, input_text, output, names):
    source = tmp_path / "reports.csv"
    source.write_text(input_text)
    assert label(source, tmp_path / output) == 2
    err = one_line_error(capsys)
    for name in names:
        assert name in err
    assert not (tmp_path / output).exists()


def test_many_reports_print_progress(tmp_path, capsys, monkeypatch):
    from radharmony_pipeline.operations import label_reports

    monkeypatch.setattr(label_reports, "PROGRESS_EVERY", 2)
    source = tmp_path / "many.csv"
    texts = [f"Small left effusion number {i}." for i in range(5)]
    pd.DataFrame({"id": range(5), "text": texts}).to_csv(source, index=False)
    assert label(source, tmp_path / "out.parquet") == 0
    lines = [line for line in capsys.readouterr().err.splitlines() if "labelled" in line]
    assert lines == [f"labelled {n} of 5 distinct reports" for n in (2, 4, 5)]
    table = pq.read_table(tmp_path / "out.parquet").to_pandas()
    assert table["report_label_pleural_effusion"].eq(1).all()
