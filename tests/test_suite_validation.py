"""Suites validated in a helper process (processing/tables/suite_validation.py): the same
reports as in this process, in any order asked, and a helper that dies fails its suites."""

from __future__ import annotations

import os
import signal

import pandas as pd
import pytest
from deadline import within
from test_expectations import LABELS, labels_frame, raw_index_frame

from radharmony_pipeline.processing.tables.suite_validation import (
    HELPER_SOURCE_BYTES,
    InProcessValidation,
    ValidationProcess,
    validate_suite,
)
from radharmony_pipeline.processing.tables.suite_validation import (
    suite_validation as choose_validation,
)


def broken_tables() -> tuple[pd.DataFrame, pd.DataFrame]:
    """A raw index with a duplicate id and a view outside the vocabulary, labels with a 2."""
    index = raw_index_frame()
    index.loc[3, "image_id"] = "nih/0"
    index.loc[1, "view_position"] = "SUPINE"
    labels = labels_frame()
    labels["label_cardiomegaly"] = pd.array([None, 2, None, 1], dtype="Int8")
    return index, labels


@pytest.mark.slow
def test_the_helper_reports_what_this_process_reports_in_any_order_asked():
    index, labels = broken_tables()
    helper = ValidationProcess()
    try:
        with within(180, "three validations in the helper"):
            pending_index = helper.submit(index, "raw_index")
            pending_unknown = helper.submit(labels, "no_such_suite")
            pending_labels = helper.submit(labels, "labels", LABELS)
            # Asked in another order: each earlier reply is kept for its own request.
            from_helper = {"labels": pending_labels(), "raw_index": pending_index()}
            unknown = pending_unknown()
    finally:
        helper.close()
    here = {
        "raw_index": validate_suite(index, "raw_index"),
        "labels": validate_suite(labels, "labels", LABELS),
    }
    assert from_helper == here
    assert not from_helper["raw_index"].success and not from_helper["labels"].success
    assert {o.expectation.split("(")[0] for o in from_helper["raw_index"].failures} == {
        "expect_column_values_to_be_unique",
        "expect_column_values_to_be_in_set",
    }
    # A suite the helper cannot build fails on its own; the helper went on to the next.
    assert not unknown.success
    assert "KeyError" in unknown.outcomes[0].unexpected_sample[0]
    assert helper.exit_code is not None


def test_a_helper_that_dies_fails_the_suite_with_its_exit_code():
    helper = ValidationProcess()
    try:
        pending = helper.submit(labels_frame(), "labels", LABELS)
        os.kill(helper.pid, signal.SIGKILL)
        with within(60, "the report of a dead helper"):
            report = pending()
    finally:
        with within(60, "closing a dead helper"):
            helper.close()
    assert not report.success
    (outcome,) = report.outcomes
    assert outcome.expectation == "labels validation"
    assert f"pid {helper.pid}" in outcome.unexpected_sample[0]
    assert f"exit code {-signal.SIGKILL}" in outcome.unexpected_sample[0]


@pytest.mark.parametrize("owed", [0, 1])
def test_closing_a_helper_stops_it_at_once_without_waiting_for_gx(owed):
    """Closed while it is still importing GX (a step that failed reading, or one that stops
    before its reports): killed, not waited for."""
    helper = ValidationProcess()
    for _ in range(owed):
        helper.submit(labels_frame(), "labels", LABELS)
    with within(3, "closing a helper that is still importing GX"):
        helper.close()
    assert helper.exit_code == -signal.SIGKILL


@pytest.mark.slow
def test_a_table_that_cannot_be_sent_fails_its_suite_with_the_reason():
    frame = pd.DataFrame({"image_id": ["a"], "report": [lambda: None]})  # not picklable
    helper = ValidationProcess()
    try:
        with within(60, "the report of an unsendable table"):
            report = helper.submit(frame, "labels", LABELS)()
    finally:
        helper.close()
    assert not report.success
    assert "could not be sent to the validation process" in report.outcomes[0].unexpected_sample[0]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("source_bytes", "kind"),
    [(0, InProcessValidation), (HELPER_SOURCE_BYTES - 1, InProcessValidation),
     (HELPER_SOURCE_BYTES, ValidationProcess)],
)  # fmt: skip
def test_only_a_large_source_gets_a_helper(source_bytes, kind):
    with choose_validation(source_bytes) as validator:
        assert isinstance(validator, kind)
        report = validator.submit(labels_frame(), "labels", LABELS)()
    assert report.success, report.summary()
    if isinstance(validator, ValidationProcess):
        assert validator.exit_code is not None, "the helper outlived its block"
