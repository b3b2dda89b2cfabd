"""Checks on `images`, run inside its step on the table it has just built (check_specs)."""

from collections.abc import Iterator
from dataclasses import dataclass

import dagster as dg
import pandas as pd

from ..row_errors import error_rows_check, row_errors_result
from .in_step import StepCheck, specs_of, step_results


@dataclass(frozen=True)
class _ImagesStep:
    images: pd.DataFrame
    strict: bool


CHECKS: list[StepCheck[_ImagesStep]] = [
    StepCheck(
        error_rows_check(dg.AssetKey("images")),
        lambda step: row_errors_result(step.images, step.strict),
    ),
]
CHECK_SPECS = specs_of(CHECKS)


def check_results(
    selected: set[dg.AssetCheckKey], images: pd.DataFrame, strict: bool
) -> Iterator[dg.AssetCheckResult]:
    """The result of every selected check, computed from the table in memory."""
    yield from step_results(CHECKS, selected, _ImagesStep(images, strict))
