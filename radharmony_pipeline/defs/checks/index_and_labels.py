"""Checks on `raw_index` and `labels`, run inside their step on the tables it has just built.

They are `check_specs` of the `raw_index_and_labels` multi-asset: each is still its own check in
the UI, with its own name, severity and blocking flag, but it costs no extra process, step or
Parquet read (design notes: "Checks in the step").
"""

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from functools import partial

import dagster as dg
import pandas as pd

from ...processing.tables.suite_validation import PendingReport, Validator
from ...sources import DatasetSource, SplitTables
from ...sources.counts import MASK_METRICS, compare_counts, is_dataset_metric
from ...vocabulary import LABEL_COLUMNS, STATUS_ERROR, STATUS_OK
from ..partitions import blocking_partition_check
from ..row_errors import error_rows_check, row_errors_result
from .counts import comparison_result
from .expectations import report_result, suite_check
from .in_step import StepCheck, specs_of, step_results

RAW_INDEX = dg.AssetKey("raw_index")
LABELS = dg.AssetKey("labels")


@dataclass(frozen=True)
class _IndexAndLabelsStep:
    source: DatasetSource
    split: str
    tables: SplitTables
    metrics: dict[str, int]
    strict: bool
    # The suite validations start_suites started, by check name.
    suites: Mapping[str, PendingReport]


@dataclass(frozen=True)
class _SuiteCheck:
    """A check that validates a GX suite: its spec, and the table and arguments validated."""

    spec: dg.AssetCheckSpec
    validated: Callable[[SplitTables], tuple]


_SUITE_CHECKS = (
    _SuiteCheck(
        suite_check(
            RAW_INDEX,
            "unique non-null image_id/image_key, non-empty paths, known "
            "formats, splits and normalized view positions, positive source sizes.",
        ),
        lambda tables: (_usable(tables.index), "raw_index"),
    ),
    _SuiteCheck(
        suite_check(
            LABELS,
            "unique image_id, every label_* column in {0, 1, null}, report never the string "
            '"None".',
        ),
        lambda tables: (_usable(tables.labels), "labels", LABEL_COLUMNS),
    ),
)


def _suite_result(name: str, step: _IndexAndLabelsStep) -> dg.AssetCheckResult:
    return report_result(step.suites[name]())


CHECKS: list[StepCheck[_IndexAndLabelsStep]] = [
    StepCheck(
        blocking_partition_check(
            "counts_match_documentation",
            asset=LABELS,
            additional_deps=[RAW_INDEX],
            description=(
                "Images, patients, studies, negatives, segmentation entries, annotations and "
                "per-class image counts of the partition equal the dataset documentation's "
                "figures (a root's expected_counts.json replaces them). A short count blocks "
                "downstream stages."
            ),
        ),
        lambda step: _counts(step.source, step.split, step.tables, step.metrics, step.strict),
    ),
    *(StepCheck(suite.spec, partial(_suite_result, suite.spec.name)) for suite in _SUITE_CHECKS),
    StepCheck(
        error_rows_check(RAW_INDEX),
        lambda step: row_errors_result(step.tables.index, step.strict),
    ),
]
CHECK_SPECS = specs_of(CHECKS)


def suites_selected(selected: set[dg.AssetCheckKey]) -> bool:
    """Whether the run asks for any of the step's suite checks."""
    return bool(_selected_suites(selected))


def start_suites(
    selected: set[dg.AssetCheckKey], validator: Validator, tables: SplitTables
) -> dict[str, PendingReport]:
    """The selected suite checks' validations, started now: in a helper process they run
    while the step writes its outputs."""
    return {
        suite.spec.name: validator.submit(*suite.validated(tables))
        for suite in _selected_suites(selected)
    }


def _selected_suites(selected: set[dg.AssetCheckKey]) -> list[_SuiteCheck]:
    return [suite for suite in _SUITE_CHECKS if suite.spec.key in selected]


def check_results(
    selected: set[dg.AssetCheckKey],
    source: DatasetSource,
    split: str,
    tables: SplitTables,
    metrics: dict[str, int],
    strict: bool,
    suites: Mapping[str, PendingReport],
) -> Iterator[dg.AssetCheckResult]:
    """The result of every selected check, computed from the tables in memory; the suites'
    from the validations `start_suites` started."""
    step = _IndexAndLabelsStep(source, split, tables, metrics, strict, suites)
    yield from step_results(CHECKS, selected, step)


def _usable(table: pd.DataFrame) -> pd.DataFrame:
    # Error rows (reported by raw_index_error_rows) may lack a path or size by nature.
    return table[table["status"] == STATUS_OK]


def _counts(
    source: DatasetSource,
    split: str,
    tables: SplitTables,
    found: dict[str, int],
    strict: bool,
) -> dg.AssetCheckResult:
    expected = source.expected_counts()
    wanted = {
        k: v
        for k, v in expected.for_split(split).items()
        if k not in MASK_METRICS and not is_dataset_metric(k)
    }
    index = tables.index
    errors = int((index["status"] == STATUS_ERROR).sum()) if "status" in index else 0
    return comparison_result(
        source, split, expected.origin, compare_counts(wanted, found), found, errors, strict
    )
