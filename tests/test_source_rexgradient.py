"""ReXGradient reader: per-image rows from study JSON, views, reports, ages, dates, NaN tokens."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from radharmony_pipeline.sources.rexgradient import age_in_years, format_report
from radharmony_pipeline.synthetic.rexgradient import VIEW_POSITIONS
from radharmony_pipeline.vocabulary import LABEL_COLUMNS


def _studies(tiny_root, file_split):
    path = tiny_root / "rexgradient" / "download" / "metadata"
    return json.loads((path / f"{file_split}_metadata_view_position.json").read_text())


@pytest.mark.parametrize(
    ("split", "file_split"), [("train", "train"), ("val", "valid"), ("test", "test")]
)
def test_one_row_per_image_path(open_tiny, tiny_root, split, file_split):
    source = open_tiny("rexgradient")
    tables = source.read_split(split)
    studies = _studies(tiny_root, file_split)
    index = tables.index
    assert len(index) == sum(len(s["ImagePath"]) for s in studies.values())
    expected = json.loads((tiny_root / "rexgradient" / "expected_counts.json").read_text())
    assert source.count_metrics(tables) == expected["splits"][split]
    assert not index["image_path"].str.startswith("..").any()
    for relative in index["image_path"]:
        assert (source.image_dir(split) / relative).is_file()
    assert index["image_id"].is_unique
    assert (index["image_format"] == "png").all()
    first = next(iter(studies.values()))
    row = index.iloc[0]
    assert row["patient_id"] == first["PatientID"]
    assert row["study_id"] == first["StudyInstanceUid"]
    assert row["accession_number"] == first["AccessionNumber"]
    assert row["image_id"] == "rexgradient/" + first["ImagePath"][0].rsplit("/", 1)[1][:-4]


def test_raw_json_has_bare_nan_tokens(tiny_root):
    text = (
        tiny_root / "rexgradient" / "download" / "metadata" / "train_metadata_view_position.json"
    ).read_text()
    assert ": NaN" in text


def test_views_are_normalized_with_short_lists_padded(open_tiny, tiny_root):
    index = pd.concat(
        open_tiny("rexgradient").read_split(s).index for s in ("train", "val", "test")
    )
    assert set(index["view_position"]) <= {"PA", "AP", "LATERAL", "LL", "OTHER", "UNKNOWN"}
    raw_to_norm = dict(
        zip(index["view_position_raw"].fillna("<null>"), index["view_position"], strict=True)
    )
    expectations = {
        "POSTERO_ANTERIOR": "PA",
        "LAO": "OTHER",
        "RAO": "OTHER",
        "N/A": "UNKNOWN",
        "AP (KUB)": "OTHER",
        "<null>": "UNKNOWN",
        "PA": "PA",
        "LL": "LL",
    }
    seen = {raw: norm for raw, norm in expectations.items() if raw in raw_to_norm}
    assert "<null>" in seen and len(seen) >= 4
    for raw, norm in seen.items():
        assert raw_to_norm[raw] == norm, raw


def test_reports_skip_empty_sections_and_are_null_not_none(open_tiny, tiny_root):
    labels = pd.concat(
        open_tiny("rexgradient").read_split(s).labels for s in ("train", "val", "test")
    )
    assert labels["report"].isna().any(), "the generator writes a study with no report"
    reports = labels["report"].dropna()
    assert not reports.isin(["None", "nan", "NaN", ""]).any()
    assert not reports.str.contains(r"(?m)^[A-Z]+:\n(?:None|NaN|nan)?(?:\n\n|$)").any()
    assert reports.str.contains("FINDINGS:\n").any()
    assert labels[list(LABEL_COLUMNS)].isna().all().all()


def test_format_report_orders_sections_with_headers():
    assert format_report(["Cough", None, "Clear lungs.", "Normal."]) == (
        "INDICATION:\nCough\n\nFINDINGS:\nClear lungs.\n\nIMPRESSION:\nNormal."
    )
    assert format_report([None, None, "Small effusion.", None]) == "FINDINGS:\nSmall effusion."
    assert format_report([None, None, None, None]) is None


def test_ages_in_years_for_every_dicom_unit():
    ages = age_in_years(pd.Series(["014Y", "007M", "003W", "002D", "", None, "12X"]))
    assert ages.iloc[0] == 14
    assert ages.iloc[1] == pytest.approx(7 / 12)
    assert ages.iloc[2] == pytest.approx(21 / 365.25)
    assert ages.iloc[3] == pytest.approx(2 / 365.25)
    assert ages.iloc[4:].isna().all()


def test_demographics_and_study_dates(open_tiny, tiny_root):
    index = open_tiny("rexgradient").read_split("train").index
    studies = _studies(tiny_root, "train")
    by_study = {s["StudyInstanceUid"]: s for s in studies.values()}
    for _, row in index.iterrows():
        study = by_study[row["study_id"]]
        assert row["patient_age"] == study["PatientAge"]
        assert row["study_date"].strftime("%Y%m%d") == str(study["StudyDate"])
        assert row["patient_sex"] == study["PatientSex"]
    assert index["patient_age_years"].notna().all()


def test_every_documented_view_spelling_is_normalized():
    from radharmony_pipeline.sources.views import normalize_view_positions

    # The spellings ReXGradient's metadata holds (the generator writes the same), then others.
    raw = pd.Series([*VIEW_POSITIONS, "", " pa ", "frontal", "lateral"], dtype="string")
    assert normalize_view_positions(raw).tolist() == [
        "PA",
        "AP",
        "LATERAL",
        "LL",
        "PA",
        "OTHER",
        "OTHER",
        "UNKNOWN",
        "UNKNOWN",
        "OTHER",
        "UNKNOWN",
        "UNKNOWN",
        "PA",
        "UNKNOWN",
        "LATERAL",
    ]
