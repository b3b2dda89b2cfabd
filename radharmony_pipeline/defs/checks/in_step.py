"""Results of the checks a stage evaluates in its own step (check_specs), on its tables in
memory: no extra process, step or Parquet read, and each still its own check in the UI.

A `StepCheck` holds its spec and the function that evaluates it, so a check's name is written
once, in its spec: there is no second table keyed by name to fall out of step with it.
"""

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

import dagster as dg

# What a stage's step hands its checks: the tables it built and the settings they need.
StepInputs = TypeVar("StepInputs")


@dataclass(frozen=True)
class StepCheck(Generic[StepInputs]):
    """One check a stage evaluates in its step: its spec, and its result from the step's
    inputs."""

    spec: dg.AssetCheckSpec
    evaluate: Callable[[StepInputs], dg.AssetCheckResult]


def specs_of(checks: Sequence[StepCheck]) -> list[dg.AssetCheckSpec]:
    """The specs a stage's asset declares (its `check_specs`), in order."""
    return [check.spec for check in checks]


def step_results(
    checks: Sequence[StepCheck[StepInputs]],
    selected: set[dg.AssetCheckKey],
    inputs: StepInputs,
) -> Iterator[dg.AssetCheckResult]:
    """The results of the selected checks only (a run may deselect checks), in spec order."""
    for check in checks:
        if check.spec.key in selected:
            yield as_spec_result(check.spec, check.evaluate(inputs))


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
