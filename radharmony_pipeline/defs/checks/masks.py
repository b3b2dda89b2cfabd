"""Checks on `masks`, run inside its step on the table it has just built (check_specs):
documented counts, the GX suite, positives without a mask, error rows."""

from collections.abc import Iterator
from dataclasses import dataclass

import dagster as dg
import pandas as pd

from ...processing.storage.output_layout import mask_folder
from ...processing.storage.store import OutputPath, listing
from ...processing.tables.suite_validation import Validator
from ...sources import DatasetSource
from ...sources.counts import MASK_METRICS, compare_counts
from ...vocabulary import STATUS_ERROR, STATUS_OK, UNION_CLASS
from ..partitions import blocking_partition_check, dataset_split_partitions
from ..row_errors import error_rows_check, row_errors_result
from .counts import comparison_result
from .expectations import suite_check, suite_result
from .in_step import StepCheck, specs_of, step_results

MASKS = dg.AssetKey("masks")
# Ids written into a warning's description; the metadata lists up to 200.
_IDS_IN_DESCRIPTION = 10


@dataclass(frozen=True)
class _MasksStep:
    source: DatasetSource
    split: str
    # masks, labels and raw_index of the partition, in memory.
    tables: dict[str, pd.DataFrame]
    root: OutputPath
    strict: bool
    validator: Validator

    @property
    def masks(self) -> pd.DataFrame:
        return self.tables["masks"]

    @property
    def partition(self) -> str:
        return f"{self.source.key}.{self.split}"


CHECKS: list[StepCheck[_MasksStep]] = [
    StepCheck(
        blocking_partition_check(
            "masks_match_documentation",
            asset=MASKS,
            description="Images with at least one class mask and per-class image counts equal "
            "the documented figures (CheXlocalize test: 499 of 668). Error rows are reported "
            "by masks_error_rows.",
        ),
        lambda step: _counts(step.source, step.split, step.masks, step.strict),
    ),
    StepCheck(
        dg.AssetCheckSpec(
            "positives_without_masks",
            asset=MASKS,
            additional_deps=[dg.AssetKey("labels")],
            partitions_def=dataset_split_partitions,
            description="Images with a positive localizable label but no mask. The ones the "
            "dataset's documentation names (CheXlocalize: patient65086_study1_view1_frontal) "
            "pass and are listed in the metadata; any other warns, with its id in this "
            "description.",
        ),
        lambda step: _positives_without_masks(step.source, step.tables),
    ),
    StepCheck(
        suite_check(
            MASKS,
            "class-mask area fractions in (0, 1], union fractions in [0, 1], "
            "every mask file exists, classes in the vocabulary.",
        ),
        lambda step: suite_result(
            step.validator,
            _with_derived_columns(step.masks, step.root, step.partition),
            "masks",
        ),
    ),
    StepCheck(error_rows_check(MASKS), lambda step: row_errors_result(step.masks, step.strict)),
]
CHECK_SPECS = specs_of(CHECKS)


def check_results(
    selected: set[dg.AssetCheckKey],
    source: DatasetSource,
    split: str,
    tables: dict[str, pd.DataFrame],
    root: OutputPath,
    strict: bool,
    validator: Validator,
) -> Iterator[dg.AssetCheckResult]:
    """The result of every selected check, from `tables` (masks, labels, raw_index) in memory;
    the suite's table goes to `validator` (kept_validation)."""
    step = _MasksStep(source, split, tables, root, strict, validator)
    yield from step_results(CHECKS, selected, step)


def _counts(
    source: DatasetSource, split: str, masks: pd.DataFrame, strict: bool
) -> dg.AssetCheckResult:
    ok = masks[masks["status"] == STATUS_OK]
    classes = ok[ok["mask_class"] != UNION_CLASS]
    found = {
        "images_with_masks": int(classes["image_id"].nunique()),
        **{
            f"class_images.{name}": int(n)
            for name, n in classes.groupby("mask_class")["image_id"].nunique().items()
        },
    }
    expected = source.expected_counts()
    wanted = {
        metric: value
        for metric, value in expected.for_split(split).items()
        if metric in MASK_METRICS or metric.startswith("class_images.")
    }
    errors = int(masks.loc[masks["status"] == STATUS_ERROR, "image_id"].nunique())
    comparisons = compare_counts(wanted, found)
    return comparison_result(source, split, expected.origin, comparisons, found, errors, strict)


def _positives_without_masks(
    source: DatasetSource, tables: dict[str, pd.DataFrame]
) -> dg.AssetCheckResult:
    masks, labels, raw_index = tables["masks"], tables["labels"], tables["raw_index"]
    localizable = [f"label_{name}" for name in source.mask_classes]
    if not localizable or masks.empty:
        return dg.AssetCheckResult(passed=True, metadata={"note": "dataset has no masks"})
    masked = set(masks.loc[masks["mask_class"] != UNION_CLASS, "image_id"])
    eligible = raw_index.loc[source.localizable_images(raw_index).to_numpy(), "image_id"]
    positive = labels[labels[localizable].eq(1).any(axis=1) & labels["image_id"].isin(eligible)]
    missing = sorted(set(positive["image_id"]) - masked)
    documented = {f"{source.key}/{native}" for native in source.documented_unmasked_positives}
    expected = [image_id for image_id in missing if image_id in documented]
    unexpected = [image_id for image_id in missing if image_id not in documented]
    metadata = {
        "documented_exceptions": dg.MetadataValue.json(expected),
        "unexpected": len(unexpected),
        "unexpected_image_ids": dg.MetadataValue.json(unexpected[:200]),
    }
    if not unexpected:
        described = f" (documented exception: {', '.join(expected)})" if expected else ""
        return dg.AssetCheckResult(
            passed=True,
            metadata=metadata,
            description=f"every positive localizable image has a mask{described}",
        )
    shown = ", ".join(unexpected[:_IDS_IN_DESCRIPTION])
    more = len(unexpected) - _IDS_IN_DESCRIPTION
    return dg.AssetCheckResult(
        passed=False,
        severity=dg.AssetCheckSeverity.WARN,
        metadata=metadata,
        description=f"{len(unexpected)} image(s) with a positive localizable label have no mask "
        f"beyond the documented exceptions: {shown}" + (f" and {more} more" if more > 0 else ""),
    )


def _with_derived_columns(masks: pd.DataFrame, root: OutputPath, partition: str) -> pd.DataFrame:
    """The columns the suite checks beyond the table: whether each mask file exists, the area
    of class masks (not unions) and the (image, class) pair."""
    # One listing of the partition's folder, not one request per mask on object storage.
    folder = mask_folder(partition)
    listed = {f"{folder}/{name}" for name in listing(root / folder)}
    return masks.assign(
        mask_file_exists=masks["mask_path"].map(lambda path: path in listed, na_action="ignore"),
        class_area_fraction=masks["area_fraction"].where(masks["mask_class"] != UNION_CLASS),
        image_class=masks["image_id"] + "/" + masks["mask_class"],
    )
