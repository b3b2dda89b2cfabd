"""Checks on `bboxes`, run inside its step on the table it has just built (check_specs).

Like raw_index/labels (checks/index_and_labels.py): separate checks in the UI, no extra
process, step or Parquet read.
"""

from collections.abc import Iterator
from dataclasses import dataclass

import dagster as dg
import pandas as pd

from ...processing.tables.suite_validation import Validator
from ...sources import DatasetSource
from ...sources.counts import compare_counts
from ...vocabulary import STATUS_ERROR, STATUS_OK
from ..partitions import blocking_partition_check
from ..row_errors import error_rows_check, row_errors_result
from .counts import comparison_result
from .expectations import suite_check, suite_result
from .in_step import StepCheck, specs_of, step_results

BBOXES = dg.AssetKey("bboxes")


@dataclass(frozen=True)
class _BboxesStep:
    source: DatasetSource
    split: str
    bboxes: pd.DataFrame
    strict: bool
    validator: Validator


CHECKS: list[StepCheck[_BboxesStep]] = [
    StepCheck(
        blocking_partition_check(
            "bboxes_match_documentation",
            asset=BBOXES,
            description="Box rows equal the documented annotations of the split. Degenerate "
            "and malformed boxes are reported by bboxes_error_rows.",
        ),
        lambda step: _counts(step.source, step.split, step.bboxes, step.strict),
    ),
    StepCheck(
        suite_check(
            BBOXES,
            "coordinates in [0, 1], y_min < y_max and x_min < x_max for "
            "valid boxes, labels in the unified vocabulary.",
        ),
        lambda step: suite_result(
            step.validator, step.bboxes[step.bboxes["status"] == STATUS_OK], "bboxes"
        ),
    ),
    StepCheck(error_rows_check(BBOXES), lambda step: row_errors_result(step.bboxes, step.strict)),
]
CHECK_SPECS = specs_of(CHECKS)


def check_results(
    selected: set[dg.AssetCheckKey],
    source: DatasetSource,
    split: str,
    bboxes: pd.DataFrame,
    strict: bool,
    validator: Validator,
) -> Iterator[dg.AssetCheckResult]:
    """The result of every selected check, computed from the table in memory."""
    yield from step_results(CHECKS, selected, _BboxesStep(source, split, bboxes, strict, validator))


def _counts(
    source: DatasetSource, split: str, bboxes: pd.DataFrame, strict: bool
) -> dg.AssetCheckResult:
    expected = source.expected_counts()
    found = {"boxes": len(bboxes)}
    wanted = {}
    if source.has_boxes and "annotations" in expected.for_split(split):
        wanted["boxes"] = expected.for_split(split)["annotations"]
    errors = int((bboxes["status"] == STATUS_ERROR).sum())
    return comparison_result(
        source, split, expected.origin, compare_counts(wanted, found), found, errors, strict
    )
