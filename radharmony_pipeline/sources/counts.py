"""Expected counts for a dataset: the documented numbers, or a root's expected_counts.json."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field

from ..processing.storage import source_store
from ..processing.storage.source_store import SourcePath
from .errors import MetadataError

EXPECTED_COUNTS_FILE = "expected_counts.json"
# Figures only the masks stage can measure; the labels check leaves them to it.
MASK_METRICS = ("images_with_masks",)
# Figures measured over a whole dataset's outputs (masks, source files) once every split is
# in the manifest; per-partition checks leave them to the dataset-level check.
DATASET_METRIC_PREFIXES = ("overlap.", "rgba_images")


def is_dataset_metric(metric: str) -> bool:
    return metric.startswith(DATASET_METRIC_PREFIXES)


@dataclass(frozen=True)
class ExpectedCounts:
    """Per-split and dataset-total figures, keyed by metric name (`images`, `patients`, ...)."""

    origin: str
    splits: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    total: Mapping[str, int] = field(default_factory=dict)

    def for_split(self, split: str) -> Mapping[str, int]:
        return self.splits.get(split, {})


def load_expected_counts(root: SourcePath, documented: ExpectedCounts) -> ExpectedCounts:
    """The root's expected_counts.json when present (it replaces the documented numbers)."""
    path = root / EXPECTED_COUNTS_FILE
    if not source_store.is_file(path):
        return documented
    try:
        data = json.loads(source_store.read_source_bytes(path))
        splits = {
            split: {metric: int(value) for metric, value in metrics.items()}
            for split, metrics in data.get("splits", {}).items()
        }
        total = {metric: int(value) for metric, value in data.get("total", {}).items()}
    except (ValueError, AttributeError, TypeError) as exc:
        raise MetadataError(
            path,
            "whole file",
            f"not a valid expected-counts file ({exc})",
            'Expected {"splits": {split: {metric: int}}, "total": {metric: int}}, '
            "or delete the file to check against the documented counts",
        ) from exc
    return ExpectedCounts(origin=str(path), splits=splits, total=total)


@dataclass(frozen=True)
class CountComparison:
    metric: str
    expected: int
    found: int | None

    @property
    def matches(self) -> bool:
        return self.found == self.expected


def compare_counts(expected: Mapping[str, int], found: Mapping[str, int]) -> list[CountComparison]:
    """One comparison per expected metric; a metric the data cannot yield is found=None."""
    return [CountComparison(metric, value, found.get(metric)) for metric, value in expected.items()]
