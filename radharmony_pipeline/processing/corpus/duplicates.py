"""Near-duplicate groups of a corpus (one row per member), the train/test pairs inside them,
and the manifest's `duplicate_group` with the loader's filters on it."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import pandas as pd

from radharmony_pipeline.processing.imaging.perceptual_hash import (
    DEFAULT_RADIUS,
    group_fingerprints,
    hamming,
    hashes_to_words,
)
from radharmony_pipeline.processing.tables.table_schemas import NEAR_DUPLICATES, pandas_dtype

KINDS = ("identical_file", "identical_pixels", "near")

NEAR_DUPLICATE_COLUMNS: tuple[str, ...] = tuple(NEAR_DUPLICATES.names)
# Counts every member has (never null): plain integers, empty table or not.
_COUNTS = {"group_size": "int64", "distance_to_representative": "int64"}


def near_duplicate_members(images: pd.DataFrame, radius: int = DEFAULT_RADIUS) -> pd.DataFrame:
    """One row per image that has a near duplicate: its group and how it relates to it.

    `images` needs `image_id, dataset, split, image_path, perceptual_hash, pixels_sha256,
    source_sha256` (rows of usable images). The representative is the group's smallest
    `image_id`; `group_splits` lists `<dataset>.<split>` keys. A member's `kind` is the
    strongest tie it has inside its group: `identical_file` (same source bytes as another
    member), `identical_pixels` (same resized pixels), else `near`.
    """
    usable = images.dropna(subset=["perceptual_hash"]).reset_index(drop=True)
    grouping = group_fingerprints(hashes_to_words(usable["perceptual_hash"]), radius)
    members = usable.loc[grouping.group >= 0].copy()
    if members.empty:
        return _empty_members()
    members["component"] = grouping.group[grouping.group >= 0]
    members["partition"] = members["dataset"] + "." + members["split"]
    members = members.sort_values(["component", "image_id"]).reset_index(drop=True)
    by_component = members.groupby("component", sort=False)
    first = by_component["image_id"].transform("first")
    representative_hash = by_component["perceptual_hash"].transform("first")
    members["representative_id"] = first
    members["group_id"] = [_group_id(image_id) for image_id in first]
    members["group_size"] = by_component["image_id"].transform("size").astype("int64")
    spans = by_component.agg(
        group_datasets=("dataset", lambda s: sorted(set(s))),
        group_splits=("partition", lambda s: sorted(set(s))),
    )
    members = members.join(spans, on="component")
    members["distance_to_representative"] = hamming(
        hashes_to_words(members["perceptual_hash"]), hashes_to_words(representative_hash)
    )
    members["kind"] = _kinds(members)
    ordered = members.sort_values(["group_id", "image_id"]).reset_index(drop=True)
    return ordered[list(NEAR_DUPLICATE_COLUMNS)].astype(_COUNTS)


def _kinds(members: pd.DataFrame) -> list[str]:
    same_file = members.groupby(["component", "source_sha256"])["image_id"].transform("size") > 1
    same_pixels = members.groupby(["component", "pixels_sha256"])["image_id"].transform("size") > 1
    return [
        "identical_file" if file else "identical_pixels" if pixels else "near"
        for file, pixels in zip(same_file, same_pixels, strict=True)
    ]


def _group_id(representative_id: str) -> str:
    # Named after its representative so a group keeps its id when unrelated images change.
    return "dup-" + hashlib.sha1(representative_id.encode()).hexdigest()[:12]


def _empty_members() -> pd.DataFrame:
    frame = pd.DataFrame({column: pd.Series([], dtype=object) for column in NEAR_DUPLICATE_COLUMNS})
    return frame.astype({c.name: pandas_dtype(c.type) for c in NEAR_DUPLICATES.columns} | _COUNTS)


@dataclass(frozen=True)
class SplitLeak:
    """Two images of one group, one in a train split and one in a test split."""

    train_id: str
    test_id: str
    group_id: str
    identical: bool


def train_test_leaks(members: pd.DataFrame) -> list[SplitLeak]:
    """Train/test pairs inside groups; `identical` when both are the same file or pixels.

    One pair per (group, test image): the train member it is identical to if any (looked up
    by digest), else the group's first train member, so a group of n costs O(n), never n².
    """
    leaks = []
    for group_id, group in members.groupby("group_id", sort=True):
        train = group[group["split"] == "train"]
        test = group[group["split"] == "test"]
        if train.empty or test.empty:
            continue
        by_file = dict(zip(train["source_sha256"][::-1], train["image_id"][::-1], strict=True))
        by_pixels = dict(zip(train["pixels_sha256"][::-1], train["image_id"][::-1], strict=True))
        first_train = str(train["image_id"].iloc[0])
        for test_id, source_sha, pixels_sha in zip(
            test["image_id"], test["source_sha256"], test["pixels_sha256"], strict=True
        ):
            twin = by_file.get(source_sha) or by_pixels.get(pixels_sha)
            leaks.append(
                SplitLeak(str(twin or first_train), str(test_id), str(group_id), twin is not None)
            )
    return leaks


def partition_pair_counts(members: pd.DataFrame) -> dict[str, int]:
    """Groups spanning more than one partition, counted per pair of partitions they join."""
    counts: dict[str, int] = {}
    for splits in members.drop_duplicates("group_id")["group_splits"]:
        keys = sorted(splits)
        for i, left in enumerate(keys):
            for right in keys[i + 1 :]:
                pair = f"{left} ~ {right}"
                counts[pair] = counts.get(pair, 0) + 1
    return dict(sorted(counts.items()))


def count_test_images_with_train_duplicate(members: pd.DataFrame, dataset: str) -> int:
    """Test images of `dataset` whose group also holds a train image of the same dataset."""
    own = members[members["dataset"] == dataset]
    train_groups = set(own.loc[own["split"] == "train", "group_id"])
    return int(((own["split"] == "test") & own["group_id"].isin(train_groups)).sum())


def with_duplicate_groups(manifest: pd.DataFrame, members: pd.DataFrame) -> pd.DataFrame:
    """The manifest with `duplicate_group`: the image's near-duplicate group id, else null."""
    groups = dict(zip(members["image_id"], members["group_id"], strict=True))
    return manifest.assign(
        duplicate_group=pd.Series(manifest["image_id"].map(groups), dtype="string")
    )


def without_cross_split_groups(manifest: pd.DataFrame) -> pd.DataFrame:
    """Rows whose duplicate group has no member in another split (of any dataset)."""
    grouped = manifest.dropna(subset=["duplicate_group"])
    splits = grouped.groupby("duplicate_group")["split"].nunique()
    spanning = set(splits[splits > 1].index)
    return manifest[~manifest["duplicate_group"].isin(spanning).fillna(False).to_numpy(bool)]


def one_per_duplicate_group(manifest: pd.DataFrame) -> pd.DataFrame:
    """Rows with each duplicate group reduced to its smallest `image_id` (others untouched)."""
    keep = np.array(manifest["duplicate_group"].isna(), dtype=bool)
    grouped = manifest.loc[~keep].sort_values("image_id")
    first = grouped.drop_duplicates("duplicate_group").index
    keep[manifest.index.get_indexer(first)] = True
    return manifest[keep]
