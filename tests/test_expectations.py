"""The pipeline's Great Expectations suites (processing/tables/suites.py) validated by GX, and the
translation of GX's results into check metadata (processing/tables/validation.py).

The GX context is process-wide, so only the first validation pays the import/context cost.
"""

from __future__ import annotations

import json

import great_expectations.expectations as gxe
import pandas as pd
import pytest

from radharmony_pipeline.processing.tables import suites, validation
from radharmony_pipeline.processing.tables.validation import describe, validate

LABELS = ("label_atelectasis", "label_cardiomegaly", "label_no_finding")


def raw_index_frame() -> pd.DataFrame:
    """A valid raw index using the dtypes the pipeline writes (nullable ints, strings, lists)."""
    n = 5
    return pd.DataFrame(
        {
            "image_id": pd.array([f"nih/{i}" for i in range(n)], dtype="string"),
            "image_key": [f"nih_{i}.png" for i in range(n)],
            "dataset": ["nih"] * n,
            "split": ["train", "train", "val", "test", "train"],
            "patient_id": pd.array(["p1", "p1", "p2", None, "p3"], dtype="string"),
            "study_id": [None] * n,
            "image_path": [f"images/{i}.png" for i in range(n)],
            "image_format": ["png", "png", "jpg", "dcm", "png"],
            "view_position": ["PA", "AP", "LATERAL", "LL", "UNKNOWN"],
            "view_position_raw": ["PA", "AP", "LAT", "LL", None],
            "source_height": pd.array([1024, 2048, None, 1, 100_000], dtype="Int64"),
            "source_width": pd.array([1024, None, 3000, 1, 512], dtype="Int64"),
            # Dataset-specific extras: not validated, must not upset GX.
            "boxes": [[1.0, 2.0], [], None, [3.0], [4.0, 5.0]],
            "follow_up": pd.array([0, 1, None, 2, 3], dtype="Int16"),
        }
    )


def labels_frame() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "image_id": pd.array(["a", "b", "c", "d"], dtype="string"),
            "report": pd.array(["clear lungs", None, "effusion", None], dtype="string"),
            "label_atelectasis": pd.array([0, 1, None, 0], dtype="Int8"),
            "label_cardiomegaly": pd.array([None, None, None, None], dtype="Int8"),
            "label_no_finding": pd.array([1, 0, 0, None], dtype="Int8"),
            "findings": [["x"], [], None, ["y", "z"]],
        }
    )


def failed_names(report: validation.SuiteReport) -> list[str]:
    return [outcome.expectation for outcome in report.failures]


def outcome_of(
    report: validation.SuiteReport, expectation: gxe.Expectation
) -> validation.ExpectationOutcome:
    matches = [o for o in report.outcomes if o.expectation == describe(expectation)]
    assert len(matches) == 1, describe(expectation)
    return matches[0]


# ---------------------------------------------------------------- valid tables


def test_valid_raw_index_passes_every_expectation() -> None:
    suite = suites.raw_index()
    report = validate(raw_index_frame(), "raw_index", suite)
    assert report.success, report.summary()
    assert [o.expectation for o in report.outcomes] == [describe(e) for e in suite]
    assert all(o.unexpected_sample == () for o in report.outcomes)
    assert all(o.unexpected_count == 0 for o in report.outcomes)


def test_valid_labels_passes_every_expectation() -> None:
    suite = suites.labels(LABELS)
    report = validate(labels_frame(), "labels", suite)
    assert report.success, report.summary()
    assert report.summary() == {
        "suite": "labels",
        "evaluated": len(suite),
        "failed": 0,
        "failures": [],
    }


def test_pandas_default_str_and_object_columns_pass() -> None:
    df = raw_index_frame().astype({"dataset": "str", "image_key": "object", "split": "str"})
    assert validate(df, "raw_index", suites.raw_index()).success


def test_nullable_int8_with_nulls_passes_in_set() -> None:
    df = pd.DataFrame({"label_x": pd.array([None, 1, None, 0, None], dtype="Int8")})
    report = validate(df, "s", suites.binary_labels(["label_x"]))
    assert report.success
    assert report.outcomes[0].unexpected_count == 0


def test_validation_does_not_modify_the_input_frame() -> None:
    df = raw_index_frame()
    before = df.copy()
    validate(df, "raw_index", suites.raw_index())
    pd.testing.assert_frame_equal(df, before)


# ---------------------------------------------------------------- violations

VIEWS = gxe.ExpectColumnValuesToBeInSet(
    column="view_position", value_set=list(suites.VIEW_POSITIONS)
)
FORMATS = gxe.ExpectColumnValuesToBeInSet(
    column="image_format", value_set=list(suites.IMAGE_FORMATS)
)
RAW_VIOLATIONS = [
    (
        "duplicate image_id",
        "image_id",
        3,
        "nih/0",
        gxe.ExpectColumnValuesToBeUnique(column="image_id"),
        2,
    ),
    ("null image_path", "image_path", 1, None, suites.non_empty_text("image_path")[0], 1),
    ("empty image_path", "image_path", 2, "", suites.non_empty_text("image_path")[1], 1),
    ("bad view position", "view_position", 0, "SUPINE", VIEWS, 1),
    (
        "bad image_key char",
        "image_key",
        4,
        "nih 4.png",
        gxe.ExpectColumnValuesToMatchRegex(column="image_key", regex=suites.IMAGE_KEY_REGEX),
        1,
    ),
    ("height too small", "source_height", 1, 0, suites.image_side("source_height"), 1),
    ("width too large", "source_width", 0, 100_001, suites.image_side("source_width"), 1),
    ("bad image format", "image_format", 3, "tiff", FORMATS, 1),
]


@pytest.mark.parametrize(
    ("column", "row", "value", "expected", "count"),
    [case[1:] for case in RAW_VIOLATIONS],
    ids=[case[0] for case in RAW_VIOLATIONS],
)
def test_raw_index_violation_fails_exactly_one_expectation(
    column: str, row: int, value: object, expected: gxe.Expectation, count: int
) -> None:
    df = raw_index_frame()
    df.loc[row, column] = value
    report = validate(df, "raw_index", suites.raw_index())
    assert not report.success
    assert failed_names(report) == [describe(expected)]
    outcome = report.failures[0]
    assert outcome.unexpected_count == count
    assert value in outcome.unexpected_sample


def test_bad_split_fails_in_set_only() -> None:
    df = raw_index_frame()
    df.loc[0, "split"] = "validation"
    report = validate(df, "raw_index", suites.raw_index())
    expected = gxe.ExpectColumnValuesToBeInSet(column="split", value_set=list(suites.SPLITS))
    assert failed_names(report) == [describe(expected)]
    assert report.failures[0].unexpected_sample == ("validation",)


def test_null_view_position_fails_not_null_only() -> None:
    df = raw_index_frame()
    df.loc[2, "view_position"] = None
    report = validate(df, "raw_index", suites.raw_index())
    assert failed_names(report) == [
        describe(gxe.ExpectColumnValuesToNotBeNull(column="view_position"))
    ]
    assert report.failures[0].unexpected_count == 1
    assert report.failures[0].unexpected_sample == (None,)


def test_label_value_two_fails_that_label_only() -> None:
    df = labels_frame()
    df.loc[1, "label_no_finding"] = 2
    report = validate(df, "labels", suites.labels(LABELS))
    assert failed_names(report) == [describe(suites.binary_labels(["label_no_finding"])[0])]
    assert report.failures[0].unexpected_count == 1
    assert report.failures[0].unexpected_sample == (2,)


@pytest.mark.parametrize("text", ["None", "nan", "NaN", ""])
def test_stringified_null_report_fails(text: str) -> None:
    df = labels_frame()
    df.loc[3, "report"] = text
    report = validate(df, "labels", suites.labels(LABELS))
    assert failed_names(report) == [describe(suites.labels(LABELS)[-1])]
    assert report.failures[0].unexpected_count == 1
    assert report.failures[0].unexpected_sample == (text,)


def test_box_edges_must_be_ordered_on_both_axes() -> None:
    boxes = pd.DataFrame(
        {
            "image_id": ["a", "b", "c", "d"],
            "label": ["nodule"] * 4,
            "x_min": [0.1, 0.5, 0.3, 0.2],
            "x_max": [0.2, 0.4, 0.3, 0.5],
            "y_min": [0.1, 0.2, 0.3, 0.4],
            "y_max": [0.2, 0.3, 0.4, 0.5],
            "w_px": [1, 2, 3, 4],
            "h_px": [1, 2, 3, 4],
        }
    )
    suite = [
        e for e in suites.bboxes() if isinstance(e, gxe.ExpectColumnPairValuesAToBeGreaterThanB)
    ]
    report = validate(boxes, "boxes", suite)
    # Row 1 (min > max) and row 2 (min == max) fail on x; y is fine.
    assert [o.success for o in report.outcomes] == [True, False]
    outcome = report.failures[0]
    assert outcome.unexpected_count == 2
    assert set(outcome.unexpected_sample) == {(0.4, 0.5), (0.3, 0.3)}


def test_box_pairs_with_a_null_edge_skip_the_row() -> None:
    boxes = pd.DataFrame(
        {
            "x_min": pd.array([0.1, None, 0.3], dtype="Float64"),
            "x_max": pd.array([0.2, 0.5, 0.1], dtype="Float64"),
        }
    )
    pair = gxe.ExpectColumnPairValuesAToBeGreaterThanB(
        column_A="x_max", column_B="x_min", ignore_row_if="either_value_is_missing"
    )
    (outcome,) = validate(boxes, "s", [pair]).outcomes
    assert not outcome.success and outcome.unexpected_count == 1


def test_non_empty_text_counts_nulls_and_empties_separately() -> None:
    df = pd.DataFrame({"path": pd.Series(["a", "", None, "b", None], dtype="str")})
    nulls, empties = validate(df, "s", suites.non_empty_text("path")).outcomes
    assert (nulls.success, nulls.unexpected_count) == (False, 2)
    assert (empties.success, empties.unexpected_count, empties.unexpected_sample) == (
        False,
        1,
        ("",),
    )


def test_column_set_names_the_missing_columns() -> None:
    df = raw_index_frame()
    report = validate(
        df,
        "s",
        [
            gxe.ExpectTableColumnsToMatchSet(column_set=["dataset"], exact_match=False),
            gxe.ExpectTableColumnsToMatchSet(column_set=["a", "dataset"], exact_match=False),
        ],
    )
    assert [o.success for o in report.outcomes] == [True, False]
    assert report.outcomes[1].unexpected_sample == ("a",)
    assert report.outcomes[1].unexpected_count == 1


def test_an_exact_column_set_sees_the_whole_table() -> None:
    df = raw_index_frame()
    exact = gxe.ExpectTableColumnsToMatchSet(column_set=["image_id", "dataset"], exact_match=True)
    (outcome,) = validate(df, "s", [exact]).outcomes
    assert not outcome.success
    assert "image_key" in outcome.unexpected_sample


# ---------------------------------------------------------------- errors never pass


def test_missing_column_is_a_failed_outcome_naming_it() -> None:
    df = labels_frame().drop(columns=["report"])
    suite = suites.labels(LABELS)
    report = validate(df, "labels", suite)
    assert not report.success
    failures = {o.expectation: o for o in report.failures}
    assert set(failures) == {describe(suite[0]), describe(suite[-1])}
    for outcome in failures.values():
        assert any("report" in str(value) for value in outcome.unexpected_sample)


def test_gx_exception_is_a_failed_outcome_with_its_message() -> None:
    # GX raises inside metric resolution when comparing strings with numeric bounds.
    column_max = gxe.ExpectColumnMaxToBeBetween(column="dataset", min_value=1, max_value=2)
    unique = gxe.ExpectColumnValuesToBeUnique(column="image_id")
    report = validate(raw_index_frame(), "s", [column_max, unique])
    bad, good = report.outcomes
    assert not bad.success and good.success
    assert bad.unexpected_count is None
    assert any("not supported" in str(message) for message in bad.unexpected_sample)
    assert not report.success


def test_a_failure_of_the_whole_validation_fails_every_expectation(monkeypatch) -> None:
    class Broken:
        def __init__(self, **_):
            raise RuntimeError("context store unavailable")

    monkeypatch.setattr(validation, "Validator", Broken)
    suite = suites.labels(LABELS)
    report = validate(labels_frame(), "labels", suite)
    assert len(report.failures) == len(suite)
    assert report.failures[0].unexpected_sample == ("RuntimeError: context store unavailable",)


def test_numeric_bounds_on_text_fail_every_non_null_value() -> None:
    df = raw_index_frame()
    (outcome,) = validate(df, "s", [suites.image_side("dataset")]).outcomes
    assert not outcome.success
    assert outcome.unexpected_sample  # GX's error message: never a pass


def test_duplicate_expectations_each_get_an_outcome_in_order() -> None:
    unique = gxe.ExpectColumnValuesToBeUnique(column="image_id")
    suite = [unique, gxe.ExpectColumnValuesToNotBeNull(column="dataset"), unique]
    report = validate(raw_index_frame(), "s", suite)
    assert [o.expectation for o in report.outcomes] == [describe(e) for e in suite]
    assert report.success


# ---------------------------------------------------------------- reporting


def test_summary_is_json_serializable_and_lists_failures() -> None:
    df = raw_index_frame()
    df.loc[0, "source_height"] = 0
    df.loc[1, "image_id"] = "nih/0"
    pair = gxe.ExpectColumnPairValuesAToBeGreaterThanB(
        column_A="source_height", column_B="source_width", ignore_row_if="either_value_is_missing"
    )
    suite = [*suites.raw_index(), pair]
    summary = validate(df, "raw_index", suite).summary()
    decoded = json.loads(json.dumps(summary, allow_nan=False))
    assert decoded["suite"] == "raw_index"
    assert decoded["evaluated"] == len(suite)
    assert decoded["failed"] == len(decoded["failures"]) == 3
    for failure in decoded["failures"]:
        assert set(failure) == {"expectation", "unexpected_count", "unexpected_sample"}
        assert len(failure["unexpected_sample"]) <= validation.SAMPLE_SIZE


def test_sample_is_capped_and_plain_python() -> None:
    df = pd.DataFrame({"v": pd.array(range(100), dtype="Int64")})
    between = gxe.ExpectColumnValuesToBeBetween(
        column="v", min_value=0, max_value=10, strict_max=True
    )
    (outcome,) = validate(df, "s", [between]).outcomes
    assert outcome.unexpected_count == 90
    assert len(outcome.unexpected_sample) == validation.SAMPLE_SIZE
    assert all(type(value) is int for value in outcome.unexpected_sample)


def test_describe_names_the_expectation_and_its_arguments() -> None:
    assert (
        describe(gxe.ExpectColumnValuesToBeUnique(column="image_id"))
        == "expect_column_values_to_be_unique(column=image_id)"
    )
    assert describe(suites.image_side("w")) == (
        "expect_column_values_to_be_between(column=w, max_value=100000.0, min_value=1.0)"
    )


def test_validation_prints_nothing(capfd: pytest.CaptureFixture[str]) -> None:
    validate(raw_index_frame(), "raw_index", suites.raw_index())
    captured = capfd.readouterr()
    assert captured.out == "" and captured.err == ""  # no tqdm progress bars


def test_every_suite_builds_and_names_its_table() -> None:
    assert set(suites.SUITES) == {"raw_index", "labels", "masks", "bboxes", "unified_manifest"}
    for name, build in suites.SUITES.items():
        arguments = (LABELS,) if name in ("labels", "unified_manifest") else ()
        assert all(isinstance(e, gxe.Expectation) for e in build(*arguments)), name
