"""What a suite's validation found, as plain values: the form check metadata is built from,
and the form a validation in another process sends back (no Great Expectations needed)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SAMPLE_SIZE = 5
"""Offending values kept per expectation."""


@dataclass(frozen=True)
class ExpectationOutcome:
    """One expectation's result, reduced to JSON-friendly values."""

    expectation: str
    success: bool
    unexpected_count: int | None
    unexpected_sample: tuple  # up to SAMPLE_SIZE offending values, or GX's error message

    def to_dict(self) -> dict[str, Any]:
        return {
            "expectation": self.expectation,
            "unexpected_count": self.unexpected_count,
            "unexpected_sample": [
                list(v) if isinstance(v, tuple) else v for v in self.unexpected_sample
            ],
        }


@dataclass(frozen=True)
class SuiteReport:
    """Every outcome of one suite on one table, in the suite's order."""

    suite: str
    outcomes: tuple[ExpectationOutcome, ...]
    # False for a validation that never ended (unfinished_report): nothing to keep or re-use.
    finished: bool = True

    @property
    def success(self) -> bool:
        return all(outcome.success for outcome in self.outcomes)

    @property
    def failures(self) -> tuple[ExpectationOutcome, ...]:
        return tuple(outcome for outcome in self.outcomes if not outcome.success)

    def summary(self) -> dict[str, Any]:
        """JSON-friendly digest: suite name, counts and the failed outcomes."""
        return {
            "suite": self.suite,
            "evaluated": len(self.outcomes),
            "failed": len(self.failures),
            "failures": [outcome.to_dict() for outcome in self.failures],
        }

    def to_json(self) -> dict[str, Any]:
        """Every outcome as plain values: what `from_json` reads back."""
        return {
            "suite": self.suite,
            "outcomes": [
                {"success": outcome.success, **outcome.to_dict()} for outcome in self.outcomes
            ],
        }

    @classmethod
    def from_json(cls, stored: dict[str, Any]) -> SuiteReport:
        return cls(
            stored["suite"],
            tuple(
                ExpectationOutcome(
                    outcome["expectation"],
                    outcome["success"],
                    outcome["unexpected_count"],
                    tuple(outcome["unexpected_sample"]),
                )
                for outcome in stored["outcomes"]
            ),
        )


def unfinished_report(suite: str, reason: str) -> SuiteReport:
    """The report of a validation that never ended: one failed outcome saying why, so that a
    suite nobody could run can never read as passed."""
    outcome = ExpectationOutcome(f"{suite} validation", False, None, (reason,))
    return SuiteReport(suite, (outcome,), finished=False)
