"""Checks on `raw_index` and `labels`, run inside their step on the tables it has just built.

They are `check_specs` of the `raw_index_and_labels` multi-asset: each is still its own check in
the UI, with its own name, severity and blocking flag, but it costs no extra process, step or
Parquet read (design notes: "Checks in the step").
"""

from collections.abc import Callable, Iterator, Mapping
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
from .in_step import selected_results

RAW_INDEX = dg.AssetKey("raw_index")
LABELS = dg.AssetKey("labels")

CHECK_SPECS = [
    blocking_partition_check(
        "counts_match_documentation",
        asset=LABELS,
        additional_deps=[RAW_INDEX],
        description=(
            "Images, patients, studies, negatives, segmentation entries, annotations and "
            "per-class image counts of the partition equal the dataset documentation's figures "
            "(a root's expected_counts.json replaces them). A short count blocks downstream "
            "stages."
        ),
    ),
    suite_check(
        RAW_INDEX,
        "unique non-null image_id/image_key, non-empty paths, known "
        "formats, splits and normalized view positions, positive source sizes.",
    ),
    suite_check(
        LABELS,
        'unique image_id, every label_* column in {0, 1, null}, report never the string "None".',
    ),
    error_rows_check(RAW_INDEX),
]


# The checks that validate a GX suite: the table and arguments each one validates.
_SUITE_TABLES: dict[str, Callable[[SplitTables], tuple]] = {
    "raw_index_suite": lambda tables: (_usable(tables.index), "raw_index"),
    "labels_suite": lambda tables: (_usable(tables.labels), "labels", LABEL_COLUMNS),
}


def suites_selected(selected: set[dg.AssetCheckKey]) -> bool:
    """Whether the run asks for any of the step's suite checks."""
    return bool(_selected_suites(selected))


def start_suites(
    selected: set[dg.AssetCheckKey], validator: Validator, tables: SplitTables
) -> dict[str, PendingReport]:
    """The selected suite checks' validations, started now: in a helper process they run
    while the step writes its outputs."""
    return {
        name: validator.submit(*_SUITE_TABLES[name](tables)) for name in _selected_suites(selected)
    }


def _selected_suites(selected: set[dg.AssetCheckKey]) -> list[str]:
    return [s.name for s in CHECK_SPECS if s.name in _SUITE_TABLES and s.key in selected]


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
    evaluate: dict[str, Callable[[], dg.AssetCheckResult]] = {
        "counts_match_documentation": lambda: _counts(source, split, tables, metrics, strict),
        **{name: partial(_suite_result, suites, name) for name in _SUITE_TABLES},
        "raw_index_error_rows": lambda: row_errors_result(tables.index, strict),
    }
    yield from selected_results(CHECK_SPECS, selected, evaluate)


def _suite_result(suites: Mapping[str, PendingReport], name: str) -> dg.AssetCheckResult:
    return report_result(suites[name]())


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
