"""A table's Great Expectations suite as a check result, shared by every suite check."""

from typing import Any

import dagster as dg
import pandas as pd

from ...processing.storage.store import OutputPath
from ...processing.tables.suite_reports import SuiteReport
from ...processing.tables.suite_validation import InProcessValidation, KeptReports, Validator
from ..partitions import blocking_partition_check


def suite_check(asset: dg.AssetKey, description: str) -> dg.AssetCheckSpec:
    """`<asset>_suite`: the table's GX suite, run in its step; blocking (a failure is ERROR)."""
    return blocking_partition_check(
        f"{asset.to_user_string()}_suite", asset=asset, description=f"GX suite: {description}"
    )


def suite_result(
    validator: Validator, table: pd.DataFrame, suite: str, *arguments: Any
) -> dg.AssetCheckResult:
    """`table` validated against the suite of that name (processing/tables/suites.py)."""
    return report_result(validator.submit(table, suite, *arguments)())


def kept_validation(root: OutputPath, partition: str) -> Validator:
    """Validation in this process, of tables not validated before (KeptReports)."""
    return KeptReports(InProcessValidation(), root, partition)


def report_result(report: SuiteReport) -> dg.AssetCheckResult:
    """A suite's report as its check's result: every failed expectation with its count and
    sample values."""
    summary = report.summary()
    return dg.AssetCheckResult(
        passed=report.success,
        severity=dg.AssetCheckSeverity.ERROR,
        metadata={
            "suite": report.suite,
            "evaluated": summary["evaluated"],
            "failed": summary["failed"],
            "failures": dg.MetadataValue.json(summary["failures"]),
        },
        description="; ".join(f.expectation for f in report.failures) or "all expectations met",
    )
