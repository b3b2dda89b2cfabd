"""Checks on `masks`: documented counts, GX suite, and the unsegmented positives.

`bboxes`' checks run in its step: checks/bboxes.py.
"""

import dagster as dg
import pandas as pd

from ...processing.storage import listing
from ...sources import parse_partition_key
from ...sources.counts import MASK_METRICS, compare_counts
from ..partitions import dataset_split_partitions
from ..resources import DatasetsResource, OutputsResource
from .counts import comparison_result
from .expectations import suite_result

# Ids written into a warning's description; the metadata lists up to 200.
_IDS_IN_DESCRIPTION = 10


@dg.asset_check(
    asset="masks",
    partitions_def=dataset_split_partitions,
    blocking=True,
    description="Images with at least one class mask and per-class image counts equal the "
    "documented figures (CheXlocalize test: 499 of 668). Error rows are reported by "
    "masks_error_rows.",
)
def masks_match_documentation(
    context: dg.AssetCheckExecutionContext, masks: pd.DataFrame, datasets: DatasetsResource
) -> dg.AssetCheckResult:
    dataset, split = parse_partition_key(context.partition_key)
    source = datasets.source(dataset)
    ok = masks[masks["status"] == "ok"]
    classes = ok[ok["mask_class"] != "any"]
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
    errors = int(masks.loc[masks["status"] == "error", "image_id"].nunique())
    comparisons = compare_counts(wanted, found)
    return comparison_result(
        source, split, expected.origin, comparisons, found, errors, datasets.strict
    )


@dg.asset_check(
    asset="masks",
    partitions_def=dataset_split_partitions,
    description="Images with a positive localizable label but no mask. The ones the dataset's "
    "documentation names (CheXlocalize: patient65086_study1_view1_frontal) pass and are listed "
    "in the metadata; any other warns, with its id in this description.",
    additional_ins={"labels": dg.AssetIn("labels"), "raw_index": dg.AssetIn("raw_index")},
)
def positives_without_masks(
    context: dg.AssetCheckExecutionContext,
    masks: pd.DataFrame,
    labels: pd.DataFrame,
    raw_index: pd.DataFrame,
    datasets: DatasetsResource,
) -> dg.AssetCheckResult:
    dataset, _ = parse_partition_key(context.partition_key)
    source = datasets.source(dataset)
    localizable = [f"label_{name}" for name in source.mask_classes]
    if not localizable or masks.empty:
        return dg.AssetCheckResult(passed=True, metadata={"note": "dataset has no masks"})
    masked = set(masks.loc[masks["mask_class"] != "any", "image_id"])
    eligible = raw_index.loc[source.localizable_images(raw_index).to_numpy(), "image_id"]
    positive = labels[labels[localizable].eq(1).any(axis=1) & labels["image_id"].isin(eligible)]
    missing = sorted(set(positive["image_id"]) - masked)
    documented = {f"{dataset}/{native}" for native in source.documented_unmasked_positives}
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


@dg.asset_check(
    asset="masks",
    partitions_def=dataset_split_partitions,
    blocking=True,
    description="GX suite: class-mask area fractions in (0, 1], union fractions in [0, 1], "
    "every mask file exists, classes in the vocabulary.",
)
def masks_suite(masks: pd.DataFrame, outputs: OutputsResource) -> dg.AssetCheckResult:
    root = outputs.root()
    # One listing of the partition's folder, not one request per mask on object storage.
    partitions = {path.split("/")[1] for path in masks["mask_path"].dropna()}
    listed = {
        f"masks/{partition}/{name}"
        for partition in partitions
        for name in listing(root / "masks" / partition)
    }
    exists = masks["mask_path"].map(lambda path: path in listed, na_action="ignore")
    table = masks.assign(
        mask_file_exists=exists,
        class_area_fraction=masks["area_fraction"].where(masks["mask_class"] != "any"),
        image_class=masks["image_id"] + "/" + masks["mask_class"],
    )
    return suite_result(table, "masks")
