"""Great Expectations suites on the table assets: ids, paths, value sets, never "None"."""

import dagster as dg
import pandas as pd

from ...processing.expectations import (
    SuiteReport,
    labels_expectations,
    raw_index_expectations,
    validate_table,
)
from ...processing.vocabulary import LABEL_COLUMNS
from ..partitions import dataset_split_partitions


def suite_result(report: SuiteReport) -> dg.AssetCheckResult:
    """Check result listing every failed expectation with its count and sample values."""
    summary = report.summary()
    return dg.AssetCheckResult(
        passed=report.success,
        severity=dg.AssetCheckSeverity.ERROR,
        metadata={
            "suite": report.suite,
            "evaluated": len(report.outcomes),
            "failed": len(report.failures),
            "failures": dg.MetadataValue.json(summary["failures"]),
        },
        description="; ".join(f.expectation for f in report.failures) or "all expectations met",
    )


@dg.asset_check(
    asset="raw_index",
    partitions_def=dataset_split_partitions,
    blocking=True,
    description="GX suite: unique non-null image_id/image_key, non-empty paths, known formats, "
    "splits and normalized view positions, positive source sizes.",
)
def raw_index_suite(raw_index: pd.DataFrame) -> dg.AssetCheckResult:
    # Error rows (reported by raw_index_error_rows) may lack a path or size by nature.
    usable = raw_index[raw_index["status"] == "ok"] if "status" in raw_index else raw_index
    return suite_result(validate_table(usable, "raw_index", raw_index_expectations()))


@dg.asset_check(
    asset="labels",
    partitions_def=dataset_split_partitions,
    blocking=True,
    description="GX suite: unique image_id, every label_* column in {0, 1, null}, report never "
    'the string "None".',
)
def labels_suite(labels: pd.DataFrame) -> dg.AssetCheckResult:
    usable = labels[labels["status"] == "ok"] if "status" in labels else labels
    return suite_result(validate_table(usable, "labels", labels_expectations(LABEL_COLUMNS)))
