"""Per-row errors of the stage tables: strict mode fails the step, otherwise they are reported.

One bad image never sinks a partition. Its row is kept with `status = error` and
a reason naming the file, the entry and the field; the rest is built. Strict mode (resource
config `strict`, or RADHARMONY_STRICT=1) fails the step on the first error row instead, with
that row's message.
"""

import dagster as dg
import pandas as pd

from ..processing.tables.reasons import error_causes
from ..vocabulary import STATUS_ERROR
from .metadata import status_counts
from .partitions import blocking_partition_check

EXAMPLES = 20


def fail_if_strict(table: pd.DataFrame, strict: bool, stage: str) -> None:
    """In strict mode, raise the first error row's message as the step's failure."""
    if not strict or "status" not in table:
        return
    errors = table.loc[table["status"] == STATUS_ERROR, "error"]
    if len(errors):
        raise dg.Failure(
            description=str(errors.iloc[0]),
            metadata={
                "stage": stage,
                "error_rows": len(errors),
                "strict": "RADHARMONY_STRICT / resource `run_settings.strict` is on; turn it off "
                "to keep error rows and build the rest",
            },
        )


def fail_if_mostly_unreadable(table: pd.DataFrame, limit: float, stage: str, fix: str) -> None:
    """Fail the step when more than `limit` of the rows are errors for one reason (a wrong
    root, a missing decoder): that is a broken partition, not a few bad files."""
    if "status" not in table or table.empty:
        return
    errors = table.loc[table["status"] == STATUS_ERROR, "error"].astype(str)
    reasons = error_causes(errors)
    if not reasons:
        return
    reason, count = max(reasons.items(), key=lambda item: item[1])
    if count / len(table) > limit:
        raise dg.Failure(
            description=f"{stage}: {count} of {len(table)} images failed for one reason: "
            f"{reason} (e.g. {errors.iloc[0]}). {fix}",
            metadata={"stage": stage, "error_rows": len(errors), "limit": limit},
        )


def row_errors_result(table: pd.DataFrame, strict: bool) -> dg.AssetCheckResult:
    """Passes when no row is an error; a warning listing reasons unless strict mode is on."""
    errors = table.loc[table["status"] == STATUS_ERROR, "error"].astype(str)
    return dg.AssetCheckResult(
        passed=errors.empty,
        severity=dg.AssetCheckSeverity.ERROR if strict else dg.AssetCheckSeverity.WARN,
        metadata={
            "error_rows": len(errors),
            "status": dg.MetadataValue.json(status_counts(table)),
            "examples": dg.MetadataValue.json(errors.head(EXAMPLES).tolist()),
        },
        description=(
            f"{len(errors)} error row(s); first: {errors.iloc[0]}"
            if len(errors)
            else "no error rows"
        ),
    )


ROW_ERRORS_DESCRIPTION = (
    "Rows with status `error` (the reason names the file, the entry and the field), counted "
    "by reason. A warning, so the good rows still flow; blocks downstream in strict mode "
    "(RADHARMONY_STRICT=1)."
)


def error_rows_check(asset: dg.AssetKey) -> dg.AssetCheckSpec:
    """`<asset>_error_rows`: blocking, so that in strict mode its ERROR stops downstream."""
    return blocking_partition_check(
        f"{asset.to_user_string()}_error_rows", asset=asset, description=ROW_ERRORS_DESCRIPTION
    )
