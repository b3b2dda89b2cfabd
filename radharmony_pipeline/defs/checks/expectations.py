"""A Great Expectations suite report as a check result, shared by every suite check."""

import dagster as dg

from ...processing.expectations import (
    SuiteReport,
)


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
