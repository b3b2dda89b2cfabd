"""The `<stage>_error_rows` check that every stage runs in its own step."""

import dagster as dg

from ..partitions import blocking_partition_check

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
