"""`expected_counts.json`: the counts a generated root really holds, replacing documented ones."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from radharmony_pipeline.synthetic.files import write_text

EXPECTED_COUNTS_NAME = "expected_counts.json"
METRICS = (
    "images",
    "patients",
    "studies",
    "images_with_segmentation",
    "images_with_masks",
    "annotations",
    "negatives",
    "uncertain_labels",
    "entries_without_the_10_pathologies",
    "rgba_images",
)
CLASS_METRIC_PREFIXES = ("class_images.", "class_annotations.", "overlap.")
SPLITS = ("train", "val", "test")

Counts = Mapping[str, int]


def write_expected_counts(
    root: Path, dataset: str, splits: Mapping[str, Counts], total: Counts
) -> Path:
    """Write `root/expected_counts.json` after checking split keys and metric names."""
    for split, counts in splits.items():
        if split not in SPLITS:
            raise ValueError(f"split key {split!r} is not one of {', '.join(SPLITS)}")
        _check_metrics(counts)
    _check_metrics(total)
    document = {
        "dataset": dataset,
        "splits": {split: dict(counts) for split, counts in splits.items()},
        "total": dict(total),
    }
    path = root / EXPECTED_COUNTS_NAME
    write_text(path, json.dumps(document, indent=2) + "\n")
    return path


def summed(splits: Mapping[str, Counts], metrics: tuple[str, ...]) -> dict[str, int]:
    """Totals of additive `metrics` over disjoint splits."""
    return {metric: sum(counts[metric] for counts in splits.values()) for metric in metrics}


def _check_metrics(counts: Counts) -> None:
    for name, value in counts.items():
        if name not in METRICS and not name.startswith(CLASS_METRIC_PREFIXES):
            raise ValueError(
                f"unknown metric {name!r}; allowed: {', '.join(METRICS)} and "
                f"{'<class>, '.join(CLASS_METRIC_PREFIXES)}<class>"
            )
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"metric {name!r} must be a non-negative int, got {value!r}")
