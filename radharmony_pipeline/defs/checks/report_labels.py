"""Checks on `report_labels`, run inside its step on the table it has just built (check_specs):
every image with a report has its row, and the reports in which nothing is mentioned stay few.
"""

from collections.abc import Iterator
from dataclasses import dataclass

import dagster as dg
import pandas as pd

from ...processing.reports.report_table import UNMENTIONED_REPORTS_LIMIT, unmentioned_share
from ...processing.tables.membership import is_in
from ..partitions import blocking_partition_check, dataset_split_partitions
from .in_step import StepCheck, specs_of, step_results

REPORT_LABELS = dg.AssetKey("report_labels")
# Examples named in a failed check's metadata: enough to look at, never all of them.
_EXAMPLES = 10


@dataclass(frozen=True)
class _ReportLabelsStep:
    table: pd.DataFrame
    # The images that should have a row.
    expected_ids: pd.Series


CHECKS: list[StepCheck[_ReportLabelsStep]] = [
    StepCheck(
        blocking_partition_check(
            "report_labels_cover_reports",
            asset=REPORT_LABELS,
            additional_deps=[dg.AssetKey("labels")],
            description=(
                "Every image with report labels to give — a report text in `labels` (report "
                "rules), or a study MIMIC-CXR's CheXpert file labels — has exactly one row."
            ),
        ),
        lambda step: _coverage(step.table, step.expected_ids),
    ),
    StepCheck(
        dg.AssetCheckSpec(
            "unmentioned_reports_within_limit",
            asset=REPORT_LABELS,
            partitions_def=dataset_split_partitions,
            description=(
                f"At most {UNMENTIONED_REPORTS_LIMIT:.0%} of the partition's distinct reports "
                "mention no observation at all (every report_label_* but no finding null): more "
                "means the texts are not chest report findings or the labeler misses the "
                "corpus's phrasing. A warning."
            ),
        ),
        lambda step: _unmentioned(step.table),
    ),
]
CHECK_SPECS = specs_of(CHECKS)


def check_results(
    selected: set[dg.AssetCheckKey], table: pd.DataFrame, expected_ids: pd.Series
) -> Iterator[dg.AssetCheckResult]:
    """The result of every selected check, computed from the table in memory;
    `expected_ids` are the images that should have a row."""
    yield from step_results(CHECKS, selected, _ReportLabelsStep(table, expected_ids))


def _coverage(table: pd.DataFrame, expected_ids: pd.Series) -> dg.AssetCheckResult:
    ids = table["image_id"].astype("string")
    missing = expected_ids[~is_in(expected_ids, ids)]
    repeated = ids[ids.duplicated()]
    unexpected = ids[~is_in(ids, expected_ids)]
    problems = {
        "without a row": missing,
        "with several rows": repeated,
        "with a row but nothing to label": unexpected,
    }
    found = {what: len(ids_) for what, ids_ in problems.items()}
    metadata = {
        "expected_images": len(expected_ids),
        "rows": len(table),
        **{what: count for what, count in found.items()},
    }
    for what, ids_ in problems.items():
        if len(ids_):
            metadata[f"examples {what}"] = dg.MetadataValue.json(
                [str(i) for i in ids_.head(_EXAMPLES)]
            )
    failures = [f"{count} image(s) {what}" for what, count in found.items() if count]
    return dg.AssetCheckResult(
        passed=not failures,
        metadata=metadata,
        description="; ".join(failures) or f"{len(expected_ids)} images, one row each",
    )


def _unmentioned(table: pd.DataFrame) -> dg.AssetCheckResult:
    unmentioned, reports = unmentioned_share(table)
    share = unmentioned / reports if reports else 0.0
    return dg.AssetCheckResult(
        passed=share <= UNMENTIONED_REPORTS_LIMIT,
        severity=dg.AssetCheckSeverity.WARN,
        metadata={
            "distinct_reports": reports,
            "unmentioned_reports": unmentioned,
            "share": dg.MetadataValue.float(round(share, 4)),
            "limit": dg.MetadataValue.float(UNMENTIONED_REPORTS_LIMIT),
        },
        description=(
            f"{unmentioned} of {reports} distinct reports ({share:.1%}) mention no observation; "
            f"limit {UNMENTIONED_REPORTS_LIMIT:.0%}"
        ),
    )
