"""`source_files`: the downloaded files of each partition, observed for changes."""

import dagster as dg

from ...processing.fingerprint import combined_version, file_sha256, tree_fingerprint
from ...sources import SourceError, parse_partition_key
from ...sources.base import DatasetSource
from ..partitions import dataset_split_partitions
from ..resources import DatasetsResource


def partition_version(source: DatasetSource, split: str) -> str:
    """Content hash of the annotation files + fingerprint of the image tree of one split."""
    parts = []
    for path in source.annotation_files(split):
        parts.append(file_sha256(path) if path.is_file() else f"absent:{path}")
    try:
        base = source.image_dir(split)
        parts.append(
            tree_fingerprint(source.image_files(split), base) if base.is_dir() else f"absent:{base}"
        )
    except SourceError as exc:
        parts.append(f"unreadable:{exc}")
    return combined_version(parts)


SOURCE_KINDS = ("jpeg", "png", "dicom", "json", "csv")


@dg.observable_source_asset(
    partitions_def=dataset_split_partitions,
    group_name="sources",
    description=(
        "The dataset files as downloaded. Each partition's data version hashes its annotation "
        "files' content and fingerprints its image tree (names, sizes, modification times), "
        "so a re-download or a replaced image marks exactly that partition as changed."
    ),
    # Observable sources take kinds as tags (the `kinds=` argument is not kept for them).
    tags={"stage": "sources", **{f"dagster/kind/{kind}": "" for kind in SOURCE_KINDS}},
)
def source_files(
    context: dg.AssetExecutionContext, datasets: DatasetsResource
) -> dg.DataVersionsByPartition:
    versions = {}
    for partition_key in dataset_split_partitions.get_partition_keys():
        dataset, split = parse_partition_key(partition_key)
        versions[partition_key] = partition_version(datasets.source(dataset), split)
    context.log.info(f"observed {len(versions)} partitions")
    return dg.DataVersionsByPartition(versions)
