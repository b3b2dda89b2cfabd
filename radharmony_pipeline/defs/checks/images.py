"""Checks on `images`, run inside its step on the table it has just built (check_specs)."""

from collections.abc import Iterator

import dagster as dg
import pandas as pd

from ..row_errors import error_rows_check, row_errors_result
from .in_step import selected_results

CHECK_SPECS = [error_rows_check(dg.AssetKey("images"))]


def check_results(
    selected: set[dg.AssetCheckKey], images: pd.DataFrame, strict: bool
) -> Iterator[dg.AssetCheckResult]:
    """The result of every selected check, computed from the table in memory."""
    evaluate = {"images_error_rows": lambda: row_errors_result(images, strict)}
    yield from selected_results(CHECK_SPECS, selected, evaluate)
