"""Suites validated in a helper process (processing/tables/suite_validation.py): the same
reports as in this process, in any order asked, and a helper that dies fails its suites."""

from __future__ import annotations

import os
import signal
import threading
import time

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deadline import within
from test_expectations import LABELS, labels_frame, raw_index_frame

from radharmony_pipeline.defs.checks.expectations import stored_in
from radharmony_pipeline.defs.io_managers import read_table_file, stored_table
from radharmony_pipeline.processing.tables.suite_reports import unfinished_report
from radharmony_pipeline.processing.tables.suite_validation import (
    HELPER_SOURCE_BYTES,
    InProcessValidation,
    KeptReports,
    SuiteValidation,
    ValidationProcess,
    validate_suite,
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
    run = SuiteValidation()
    try:
        validator = run.for_source(source_bytes)
        assert isinstance(validator, kind)
        report = validator.submit(labels_frame(), "labels", LABELS)()
    finally:
        run.close()
    assert report.success, report.summary()
    if isinstance(validator, ValidationProcess):
        assert validator.exit_code is not None, "the helper outlived its run"


def senders_alive() -> int:
    """Helpers whose thread still sends them tables (one per helper not yet closed)."""
    return sum(thread.name == "validation-sender" for thread in threading.enumerate())


@pytest.mark.slow
def test_a_run_keeps_one_helper_for_every_later_table_until_it_dies():
    run = SuiteValidation()
    senders_before = senders_alive()
    try:
        assert isinstance(run.validator(), InProcessValidation), "no large source yet"
        helper = run.for_source(HELPER_SOURCE_BYTES)
        assert run.for_source(HELPER_SOURCE_BYTES) is helper, "a second helper started"
        assert run.for_source(0) is helper and run.validator() is helper
        assert run.validator().submit(labels_frame(), "labels", LABELS)().success
        os.kill(helper.pid, signal.SIGKILL)
        with within(60, "the killed helper's end"):
            while helper.exit_code is None:
                time.sleep(0.01)
        assert isinstance(run.validator(), InProcessValidation), "a dead helper was chosen"
        replacement = run.for_source(HELPER_SOURCE_BYTES)
        assert isinstance(replacement, ValidationProcess) and replacement is not helper
        assert senders_alive() == senders_before + 1, "the dead helper was not closed"
    finally:
        run.close()
    assert replacement.exit_code is not None, "close() left the helper running"


def as_arrow(frame: pd.DataFrame, _table: str) -> pa.Table:
    """The frame as it is, for the tests of frames no table declares."""
    return pa.Table.from_pandas(frame, preserve_index=False)


class CountingValidation:
    """In-process validation that counts the tables it validates."""

    def __init__(self) -> None:
        self.validated: list[str] = []

    def submit(self, frame: pd.DataFrame, suite: str, *arguments):
        self.validated.append(suite)
        return InProcessValidation().submit(frame, suite, *arguments)


def test_a_kept_report_is_given_back_only_for_the_same_table_and_suite(tmp_path):
    _index, labels = broken_tables()
    counting = CountingValidation()
    kept = KeptReports(counting, tmp_path, "nih.train", as_arrow)
    first = kept.submit(labels, "labels", LABELS)()
    # The same values in a new frame: the kept report, no validation.
    again = kept.submit(labels.copy(), "labels", LABELS)()
    assert counting.validated == ["labels"]
    assert again == first and not again.success
    # Another partition's report is its own; so is one of a changed table or other arguments.
    KeptReports(counting, tmp_path, "nih.val", as_arrow).submit(labels, "labels", LABELS)()
    changed = labels.copy()
    changed.loc[1, "label_cardiomegaly"] = 1
    assert kept.submit(changed, "labels", LABELS)().success
    kept.submit(changed, "labels", LABELS[:2])()
    assert counting.validated == ["labels"] * 4
    # The last report of each suite is kept, whatever came before.
    kept.submit(changed, "labels", LABELS[:2])()
    assert len(counting.validated) == 4


def test_a_table_read_back_from_its_file_is_given_its_kept_report(tmp_path):
    index, _labels = broken_tables()
    # A table that fits its declaration, in a partition that exists.
    index = index.drop(columns=["boxes", "follow_up"]).assign(
        dataset="chestx_det", split="train", status="ok", error=None
    )
    counting = CountingValidation()
    kept = KeptReports(counting, tmp_path, "chestx_det.train", stored_in("chestx_det.train"))
    first = kept.submit(index, "raw_index")()
    # As the next run's re-used stage gives it: read back from the file the IO manager writes
    # (other dtypes, the declared columns the frame lacked).
    file = tmp_path / "raw_index.parquet"
    pq.write_table(stored_table(index, "raw_index", "chestx_det.train"), file)
    read_back = read_table_file(file)
    assert list(read_back.columns) != list(index.columns)
    assert kept.submit(read_back, "raw_index")() == first
    assert counting.validated == ["raw_index"]
    # A changed value is validated again, read back or not.
    read_back.loc[0, "view_position"] = "LATERAL"
    kept.submit(read_back, "raw_index")()
    assert counting.validated == ["raw_index", "raw_index"]


class DyingValidation:
    """A helper that dies before it reports."""

    def submit(self, frame: pd.DataFrame, suite: str, *arguments):
        return lambda: unfinished_report(suite, "the validation process ended")


def test_an_unfinished_or_unreadable_report_is_validated_again(tmp_path):
    died = KeptReports(DyingValidation(), tmp_path, "nih.train", as_arrow).submit(
        labels_frame(), "labels", LABELS
    )()
    assert not died.finished and not died.success
    assert not list(tmp_path.rglob("*.json"))
    counting = CountingValidation()
    kept = KeptReports(counting, tmp_path, "nih.train", as_arrow)
    kept.submit(labels_frame(), "labels", LABELS)()
    (stored,) = tmp_path.rglob("labels.json")
    stored.write_text('{"key": ')  # cut short
    assert kept.submit(labels_frame(), "labels", LABELS)().success
    assert counting.validated == ["labels", "labels"]
