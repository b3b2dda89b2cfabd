"""A table's Great Expectations suite as a check result, shared by every suite check."""

from typing import Any

import dagster as dg
import pandas as pd
import pyarrow as pa

from ...processing.storage.store import OutputPath
from ...processing.tables.suite_reports import SuiteReport
from ...processing.tables.suite_validation import KeptReports, StoredTable, Validator
from ...sources import declared_schema
from ..io_managers import stored_table
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


def kept_validation(validator: Validator, root: OutputPath, partition: str) -> Validator:
    """`validator` for the tables not validated before (KeptReports)."""
    return KeptReports(validator, root, partition, stored_in(partition))


def stored_in(partition: str) -> StoredTable:
    """How the partition's table files hold a frame (see KeptReports); columns its table does
    not declare (derived by a check for its suite) follow as they are."""

    def as_stored(frame: pd.DataFrame, table: str) -> pa.Table:
        schema = declared_schema(table)
        derived = [c for c in frame.columns if schema is not None and c not in schema.names]
        stored = stored_table(frame.drop(columns=derived), table, partition)
        extras = pa.Table.from_pandas(frame[derived], preserve_index=False)
        for name in derived:
            stored = stored.append_column(name, extras[name])
        return stored

    return as_stored


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
