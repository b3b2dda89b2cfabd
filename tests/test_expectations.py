"""Behavioural tests for radharmony_pipeline.processing.expectations (GX-backed validation).

The GX context is process-wide, so only the first validation pays the import/context cost.
"""

from __future__ import annotations

import json

import pandas as pd
import pytest

from radharmony_pipeline.processing import expectations as ex

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


def failed_names(report: ex.SuiteReport) -> list[str]:
    return [outcome.expectation for outcome in report.failures]


def outcome_of(report: ex.SuiteReport, expectation: ex.Expectation) -> ex.ExpectationOutcome:
    matches = [o for o in report.outcomes if o.expectation == expectation.describe()]
    assert len(matches) == 1, expectation.describe()
    return matches[0]


# ---------------------------------------------------------------- valid tables


def test_valid_raw_index_passes_every_expectation() -> None:
    suite = ex.raw_index_expectations()
    report = ex.validate_table(raw_index_frame(), "raw_index", suite)
    assert report.success, report.summary()
    assert len(report.outcomes) == len(suite)
    assert [o.expectation for o in report.outcomes] == [e.describe() for e in suite]
    assert all(o.unexpected_sample == () for o in report.outcomes)


def test_valid_labels_passes_every_expectation() -> None:
    suite = ex.labels_expectations(LABELS)
    report = ex.validate_table(labels_frame(), "labels", suite)
    assert report.success, report.summary()
    assert report.summary() == {
        "suite": "labels",
        "evaluated": len(suite),
        "failed": 0,
        "failures": [],
    }


def test_pandas3_default_str_and_object_columns_pass() -> None:
    df = raw_index_frame().astype({"dataset": "str", "image_key": "object", "split": "str"})
    assert ex.validate_table(df, "raw_index", ex.raw_index_expectations()).success


def test_nullable_int8_with_nulls_passes_in_set() -> None:
    df = pd.DataFrame({"label_x": pd.array([None, 1, None, 0, None], dtype="Int8")})
    report = ex.validate_table(df, "s", [ex.in_set("label_x", (0, 1))])
    assert report.success
    assert report.outcomes[0].unexpected_count == 0


def test_validation_does_not_modify_the_input_frame() -> None:
    df = raw_index_frame()
    before = df.copy()
    ex.validate_table(df, "raw_index", ex.raw_index_expectations())
    pd.testing.assert_frame_equal(df, before)


# ---------------------------------------------------------------- violations

RAW_VIOLATIONS = [
    ("duplicate image_id", "image_id", 3, "nih/0", ex.unique("image_id"), 2),
    ("null image_path", "image_path", 1, None, ex.non_empty_string("image_path"), 1),
    ("empty image_path", "image_path", 2, "", ex.non_empty_string("image_path"), 1),
    (
        "bad view position",
        "view_position",
        0,
        "SUPINE",
        ex.in_set("view_position", ex.VIEW_POSITIONS),
        1,
    ),
    (
        "bad image_key char",
        "image_key",
        4,
        "nih 4.png",
        ex.matches_regex("image_key", ex.IMAGE_KEY_REGEX),
        1,
    ),
    ("height too small", "source_height", 1, 0, ex.between("source_height", 1, 100_000), 1),
    ("width too large", "source_width", 0, 100_001, ex.between("source_width", 1, 100_000), 1),
    ("bad image format", "image_format", 3, "tiff", ex.in_set("image_format", ex.IMAGE_FORMATS), 1),
]


@pytest.mark.parametrize(
    ("column", "row", "value", "expected", "count"),
    [case[1:] for case in RAW_VIOLATIONS],
    ids=[case[0] for case in RAW_VIOLATIONS],
)
def test_raw_index_violation_fails_exactly_one_expectation(
    column: str, row: int, value: object, expected: ex.Expectation, count: int
) -> None:
    df = raw_index_frame()
    df.loc[row, column] = value
    report = ex.validate_table(df, "raw_index", ex.raw_index_expectations())
    assert not report.success
    assert failed_names(report) == [expected.describe()]
    outcome = report.failures[0]
    assert outcome.unexpected_count == count
    assert value in outcome.unexpected_sample


def test_bad_split_fails_in_set_only() -> None:
    df = raw_index_frame()
    df.loc[0, "split"] = "validation"
    report = ex.validate_table(df, "raw_index", ex.raw_index_expectations())
    assert failed_names(report) == [ex.in_set("split", ex.SPLITS).describe()]
    assert report.failures[0].unexpected_sample == ("validation",)


def test_null_view_position_fails_not_null_only() -> None:
    df = raw_index_frame()
    df.loc[2, "view_position"] = None
    report = ex.validate_table(df, "raw_index", ex.raw_index_expectations())
    assert failed_names(report) == [ex.not_null("view_position").describe()]
    assert report.failures[0].unexpected_count == 1
    assert report.failures[0].unexpected_sample == (None,)


def test_label_value_two_fails_that_label_only() -> None:
    df = labels_frame()
    df.loc[1, "label_no_finding"] = 2
    report = ex.validate_table(df, "labels", ex.labels_expectations(LABELS))
    assert failed_names(report) == [ex.in_set("label_no_finding", (0, 1)).describe()]
    assert report.failures[0].unexpected_count == 1
    assert report.failures[0].unexpected_sample == (2,)


@pytest.mark.parametrize("text", ["None", "nan", "NaN", ""])
def test_stringified_null_report_fails(text: str) -> None:
    df = labels_frame()
    df.loc[3, "report"] = text
    report = ex.validate_table(df, "labels", ex.labels_expectations(LABELS))
    assert failed_names(report) == [ex.not_in_set("report", ex.NULL_LIKE_STRINGS).describe()]
    assert report.failures[0].unexpected_count == 1
    assert report.failures[0].unexpected_sample == (text,)


def test_pair_check_flags_box_min_not_below_max() -> None:
    boxes = pd.DataFrame(
        {
            "x_min": pd.array([10.0, 50.0, 30.0, None], dtype="Float64"),
            "x_max": pd.array([20.0, 40.0, 30.0, 5.0], dtype="Float64"),
            "y_min": pd.array([1, 2, 3, 4], dtype="Int64"),
            "y_max": pd.array([2, 3, 4, None], dtype="Int64"),
        }
    )
    suite = [ex.pair_a_less_than_b("x_min", "x_max"), ex.pair_a_less_than_b("y_min", "y_max")]
    report = ex.validate_table(boxes, "boxes", suite)
    # Row 1 (min > max) and row 2 (min == max) fail; row 3 has a null and is skipped.
    assert failed_names(report) == [suite[0].describe()]
    outcome = report.failures[0]
    assert outcome.unexpected_count == 2
    assert set(outcome.unexpected_sample) == {(40.0, 50.0), (30.0, 30.0)}


def test_pair_with_nullable_ints_and_no_row_skipping_does_not_raise() -> None:
    # GX compares pd.NA directly here unless the frame is converted first.
    df = pd.DataFrame(
        {"a": pd.array([1, None, 3], dtype="Int64"), "b": pd.array([2, 2, 4], dtype="Int64")}
    )
    expectation = ex.Expectation(
        "ExpectColumnPairValuesAToBeGreaterThanB",
        {"column_A": "b", "column_B": "a", "ignore_row_if": "neither"},
    )
    outcome = ex.validate_table(df, "s", [expectation]).outcomes[0]
    assert not outcome.success
    assert outcome.unexpected_count == 1  # the null row cannot satisfy b > a
    assert all(isinstance(value, tuple) for value in outcome.unexpected_sample)


def test_non_empty_string_counts_nulls_and_empties_together() -> None:
    df = pd.DataFrame({"path": pd.Series(["a", "", None, "b", None], dtype="str")})
    outcome = ex.validate_table(df, "s", [ex.non_empty_string("path")]).outcomes[0]
    assert not outcome.success
    assert outcome.unexpected_count == 3
    assert set(outcome.unexpected_sample) == {"", None}


def test_columns_exist_names_the_missing_ones() -> None:
    df = raw_index_frame()
    report = ex.validate_table(
        df, "s", [ex.columns_exist(["dataset"]), ex.columns_exist(["a", "dataset"])]
    )
    assert [o.success for o in report.outcomes] == [True, False]
    assert report.outcomes[1].unexpected_sample == ("a",)
    assert report.outcomes[1].unexpected_count == 1


# ---------------------------------------------------------------- errors never pass


def test_missing_column_is_a_failed_outcome_naming_it() -> None:
    df = labels_frame().drop(columns=["report"])
    report = ex.validate_table(df, "labels", ex.labels_expectations(LABELS))
    assert not report.success
    failures = {o.expectation: o for o in report.failures}
    assert set(failures) == {
        ex.columns_exist(("image_id", "report", *LABELS)).describe(),
        ex.not_in_set("report", ex.NULL_LIKE_STRINGS).describe(),
    }
    for outcome in failures.values():
        assert any("report" in str(value) for value in outcome.unexpected_sample)


def test_missing_pair_column_is_a_failed_outcome() -> None:
    df = pd.DataFrame({"x_min": [1.0]})
    outcome = ex.validate_table(df, "s", [ex.pair_a_less_than_b("x_min", "x_max")]).outcomes[0]
    assert not outcome.success
    assert outcome.unexpected_sample == ("missing column: x_max",)


def test_gx_exception_is_a_failed_outcome_with_its_message() -> None:
    # GX raises inside metric resolution when comparing strings with numeric bounds.
    df = raw_index_frame()
    column_max = ex.Expectation(
        "ExpectColumnMaxToBeBetween", {"column": "dataset", "min_value": 1, "max_value": 2}
    )
    report = ex.validate_table(df, "s", [column_max, ex.unique("image_id")])
    bad, good = report.outcomes
    assert not bad.success and good.success
    assert bad.unexpected_count is None
    assert any("not supported" in str(message) for message in bad.unexpected_sample)
    assert not report.success


def test_numeric_bounds_on_text_fail_every_non_null_value() -> None:
    df = raw_index_frame()
    (outcome,) = ex.validate_table(df, "s", [ex.between("dataset", 1, 2)]).outcomes
    assert not outcome.success
    assert outcome.unexpected_count == len(df)
    assert outcome.unexpected_sample[0] == "nih"


def test_unknown_expectation_kind_raises() -> None:
    with pytest.raises(ValueError, match="ExpectNothing"):
        ex.validate_table(raw_index_frame(), "s", [ex.Expectation("ExpectNothing", {})])


def test_duplicate_expectations_each_get_an_outcome_in_order() -> None:
    suite = [ex.unique("image_id"), ex.not_null("dataset"), ex.unique("image_id")]
    report = ex.validate_table(raw_index_frame(), "s", suite)
    assert [o.expectation for o in report.outcomes] == [e.describe() for e in suite]
    assert report.success


# ---------------------------------------------------------------- reporting


def test_summary_is_json_serializable_and_lists_failures() -> None:
    df = raw_index_frame()
    df.loc[0, "source_height"] = 0
    df.loc[1, "image_id"] = "nih/0"
    suite = [*ex.raw_index_expectations(), ex.pair_a_less_than_b("source_width", "source_height")]
    summary = ex.validate_table(df, "raw_index", suite).summary()
    decoded = json.loads(json.dumps(summary, allow_nan=False))
    assert decoded["suite"] == "raw_index"
    assert decoded["evaluated"] == len(suite)
    assert decoded["failed"] == len(decoded["failures"]) == 3
    for failure in decoded["failures"]:
        assert set(failure) == {"expectation", "unexpected_count", "unexpected_sample"}
        assert len(failure["unexpected_sample"]) <= ex.SAMPLE_SIZE


def test_sample_is_capped_and_plain_python() -> None:
    df = pd.DataFrame({"v": pd.array(range(100), dtype="Int64")})
    outcome = ex.validate_table(df, "s", [ex.between("v", 0, 10, strict_max=True)]).outcomes[0]
    assert outcome.unexpected_count == 90
    assert len(outcome.unexpected_sample) == ex.SAMPLE_SIZE
    assert all(type(value) is int for value in outcome.unexpected_sample)


def test_describe_and_expectation_value_semantics() -> None:
    assert ex.unique("image_id").describe() == "ExpectColumnValuesToBeUnique(column=image_id)"
    assert ex.in_set("split", ["a", "b"]) == ex.in_set("split", ("a", "b"))
    assert len({ex.not_null("a"), ex.not_null("a")}) == 1
    with pytest.raises(TypeError):
        ex.unique("a").kwargs["column"] = "b"  # type: ignore[index]


def test_validation_prints_nothing(capfd: pytest.CaptureFixture[str]) -> None:
    ex.validate_table(raw_index_frame(), "raw_index", ex.raw_index_expectations())
    captured = capfd.readouterr()
    assert captured.out == "" and captured.err == ""  # no tqdm progress bars


def test_expectations_evaluated_in_pandas_agree_with_great_expectations():
    """The vectorized path reports the same offenders as GX would, nulls skipped alike."""
    frame = pd.DataFrame(
        {
            "image_id": pd.array(["a", "b", "a", None, "c", "c", "c"], dtype="string"),
            "report": ["x", "None", None, "", "nan", "ok", "NaN"],
            "image_key": ["k.png", "bad key", None, "k2", "", "k/3", "k4"],
            "label": pd.array([0, 1, None, 2, -1, 1, 0], dtype="Int8"),
            "height": pd.array([1, 0, 5, None, 100_001, 7, 1], dtype="Int64"),
            "fraction": [0.0, 0.5, 1.0, None, 1.5, -0.1, 0.2],
        }
    )
    suite = [
        ex.unique("image_id"),
        ex.not_null("image_id"),
        ex.not_in_set("report", ex.NULL_LIKE_STRINGS),
        ex.matches_regex("image_key", ex.IMAGE_KEY_REGEX),
        ex.columns_exist(("image_id", "report", "missing_column")),
        ex.in_set("label", (0, 1)),
        ex.between("height", 1, ex.MAX_IMAGE_SIDE),
        ex.between("fraction", 0, 1, strict_min=True),
    ]
    fast = [ex._run_pandas(frame, expectation) for expectation in suite]
    reference = ex._run_gx(frame, "reference", dict(enumerate(suite)))
    for index, outcome in enumerate(fast):
        assert (outcome.success, outcome.unexpected_count) == (
            reference[index].success,
            reference[index].unexpected_count,
        ), outcome.expectation
    assert [o.unexpected_count for o in fast] == [5, 1, 4, 3, 1, 2, 2, 3]
