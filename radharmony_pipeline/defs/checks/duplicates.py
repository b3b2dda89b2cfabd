"""Checks on `near_duplicates`: the same radiograph on both sides of a split, or in two
datasets. Identical images across train and test block (an evaluation leak); near ones warn."""

import dagster as dg
import pandas as pd

from ...processing.corpus.duplicates import (
    count_test_images_with_train_duplicate,
    partition_pair_counts,
    train_test_leaks,
)
from ...processing.storage.output_layout import NEAR_DUPLICATE_SHEET
from ...processing.storage.store import exists
from ...sources import SOURCE_TYPES
from ..resources import OutputsResource

EXAMPLES = 20


def _spanning(members: pd.DataFrame) -> dict:
    """Figures every duplicate check reports: groups across splits and across datasets."""
    groups = members.drop_duplicates("group_id")
    across_splits = groups[groups["group_splits"].map(len) > 1]
    across_datasets = groups[groups["group_datasets"].map(len) > 1]
    return {
        "groups": len(groups),
        "groups_across_partitions": len(across_splits),
        "groups_across_datasets": len(across_datasets),
        "groups_per_partition_pair": dg.MetadataValue.json(partition_pair_counts(members)),
        # Per dataset with both splits (ChestX-Det's card calls its figure unquantifiable).
        **{
            f"{key}_test_images_with_near_duplicate_in_train": (
                count_test_images_with_train_duplicate(members, key)
            )
            for key, source in SOURCE_TYPES.items()
            if {"train", "test"} <= set(source.splits)
        },
    }


def _sheet(outputs: OutputsResource) -> dict:
    path = outputs.root() / NEAR_DUPLICATE_SHEET
    return {"examples": dg.MetadataValue.path(str(path))} if exists(path) else {}


@dg.asset_check(
    asset="near_duplicates",
    blocking=True,
    description="No image identical (same file or same pixels) in a train split and a test "
    "split (any datasets): that is an evaluation leak. Each leak names both images.",
)
def no_identical_images_across_train_and_test(
    near_duplicates: pd.DataFrame, outputs: OutputsResource
) -> dg.AssetCheckResult:
    leaks = [leak for leak in train_test_leaks(near_duplicates) if leak.identical]
    pairs = [f"train {leak.train_id} = test {leak.test_id}" for leak in leaks]
    return dg.AssetCheckResult(
        passed=not leaks,
        metadata={
            "identical_train_test_pairs": len(leaks),
            "pairs": dg.MetadataValue.json(pairs[:EXAMPLES]),
            **_spanning(near_duplicates),
            **_sheet(outputs),
        },
        description="; ".join(pairs[:5]) + (" …" if len(pairs) > 5 else "")
        if leaks
        else "no identical image in both a train and a test split",
    )


@dg.asset_check(
    asset="near_duplicates",
    description="Near-duplicate groups spanning splits or datasets (warning): counts per pair "
    "of partitions, example pairs, and for each dataset with a train and a test split how "
    "many test images have a near duplicate in its train split (for ChestX-Det, the number "
    "its card calls unquantifiable).",
)
def near_duplicates_across_splits(
    near_duplicates: pd.DataFrame, outputs: OutputsResource
) -> dg.AssetCheckResult:
    leaks = [leak for leak in train_test_leaks(near_duplicates) if not leak.identical]
    figures = _spanning(near_duplicates)
    pairs = [f"train {leak.train_id} ~ test {leak.test_id}" for leak in leaks]
    return dg.AssetCheckResult(
        passed=figures["groups_across_partitions"] == 0,
        severity=dg.AssetCheckSeverity.WARN,
        metadata={
            "near_train_test_pairs": len(leaks),
            "pairs": dg.MetadataValue.json(pairs[:EXAMPLES]),
            **figures,
            **_sheet(outputs),
        },
        description=f"{figures['groups_across_partitions']} groups span partitions "
        f"({figures['groups_across_datasets']} span datasets); {len(leaks)} near train/test "
        "pairs",
    )
