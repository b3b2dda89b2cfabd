"""Results of the checks a stage evaluates in its own step (check_specs), on its tables in
memory: no extra process, step or Parquet read, and each still its own check in the UI."""

from collections.abc import Callable, Iterator

import dagster as dg


def selected_results(
    specs: list[dg.AssetCheckSpec],
    selected: set[dg.AssetCheckKey],
    evaluate: dict[str, Callable[[], dg.AssetCheckResult]],
) -> Iterator[dg.AssetCheckResult]:
    """The results of the selected specs only (a run may deselect checks), in spec order."""
    for spec in specs:
        if spec.key in selected:
            yield as_spec_result(spec, evaluate[spec.name]())


def as_spec_result(spec: dg.AssetCheckSpec, result: dg.AssetCheckResult) -> dg.AssetCheckResult:
    """`result` addressed to `spec`, as a step with several checks must yield it."""
    return dg.AssetCheckResult(
        asset_key=spec.asset_key,
        check_name=spec.name,
        passed=result.passed,
        severity=result.severity,
        metadata=result.metadata,
        description=result.description,
    )
