"""`source_files`: the downloaded files of each partition, observed for changes."""

import os
from collections.abc import Mapping

import dagster as dg

from ...processing.storage.output_layout import source_snapshot
from ...processing.storage.source_snapshot import (
    ABSENT,
    SourceSnapshot,
    compare,
    describe_changes,
    hash_annotation_files,
    load_snapshot,
    save_snapshot,
)
from ...processing.storage.source_store import is_dir
from ...sources import SOURCE_TYPES, SourceError, parse_partition_key
from ...sources.base import DatasetSource
from ...sources.preflight import PartitionReport, check_partition
from ..groups import SOURCES
from ..partitions import dataset_split_partitions
from ..resources import DatasetsResource, OutputsResource, SourceLocationConfig
from ..run_settings import RunSettingsResource

# The tag Dagster reads a source's data version from (what `DataVersionsByPartition` writes).
DATA_VERSION_TAG = "dagster/data_version"
# File names listed per kind of change in the metadata (the counts are always complete).
NAMES_SHOWN = 20


def observe_partition(source: DatasetSource, split: str) -> SourceSnapshot:
    """Hash the split's annotation files and list its images (size + mtime, no pixels)."""
    annotations = hash_annotation_files(source.annotation_files(split), source.root)
    try:
        base = source.image_dir(split)
        if not is_dir(base):
            return SourceSnapshot(annotations, {}, f"absent: {base}")
        return SourceSnapshot(annotations, source.image_states(split))
    except SourceError as exc:
        return SourceSnapshot(annotations, {}, f"unreadable: {exc}")


def check_metadata(report: PartitionReport) -> dict[str, dg.MetadataValue]:
    """The preflight's verdict first (`check_data`), then its full report and problems."""
    return {
        "check_data": dg.MetadataValue.text(report.summary()),
        "check_data_report": dg.MetadataValue.md("```\n" + "\n".join(report.lines()) + "\n```"),
        "check_data_problems": dg.MetadataValue.json(
            [problem.describe() for problem in report.problems]
        ),
    }


def observation_metadata(
    current: SourceSnapshot, previous: SourceSnapshot | None
) -> dict[str, dg.MetadataValue]:
    """What changed since last time (first, as the UI lists it), then what was observed."""
    if previous is None:
        annotations = images = None
        summary = "first observation (nothing to compare)"
    else:
        annotations = compare(previous.annotations, current.annotations)
        images = compare(previous.images, current.images)
        summary = describe_changes(annotations, images)
    metadata: dict[str, dg.MetadataValue] = {
        "changes": dg.MetadataValue.text(summary),
        "annotation_files": dg.MetadataValue.json(dict(current.annotations)),
        "images": dg.MetadataValue.int(len(current.images)),
    }
    if current.image_tree_problem:
        metadata["image_tree_problem"] = dg.MetadataValue.text(current.image_tree_problem)
    missing = [name for name, digest in current.annotations.items() if digest == ABSENT]
    if missing:
        metadata["annotation_files_missing"] = dg.MetadataValue.json(missing)
    if annotations is None or images is None:
        return metadata
    metadata["annotation_files_changed"] = dg.MetadataValue.json(
        {
            "added": annotations.added,
            "removed": annotations.removed,
            "modified": annotations.modified,
        }
    )
    for kind in ("added", "removed", "modified"):
        names = getattr(images, kind)
        metadata[f"images_{kind}"] = dg.MetadataValue.int(len(names))
        if names:
            metadata[f"images_{kind}_names"] = dg.MetadataValue.json(names[:NAMES_SHOWN])
    return metadata


SOURCE_KINDS = ("jpeg", "png", "dicom", "json", "csv")


@dg.observable_source_asset(
    partitions_def=dataset_split_partitions,
    group_name=SOURCES,
    description=(
        "The dataset files as downloaded. Each partition's data version hashes its annotation "
        "files' content and fingerprints its image tree (names, sizes, modification times), "
        "so a re-download or a replaced image marks exactly that partition as changed. Each "
        "observation lists the annotation files with their hashes, the image count, and what "
        "was added, removed or modified since the previous observation (`changes`), and what "
        "`radharmony check-data` finds (`check_data`: images present, problems and fixes)."
    ),
    # Observable sources take kinds as tags (the `kinds=` argument is not kept for them).
    tags={"stage": "sources", **{f"dagster/kind/{kind}": "" for kind in SOURCE_KINDS}},
)
def source_files(
    context: dg.AssetExecutionContext,
    datasets: DatasetsResource,
    outputs: OutputsResource,
    run_settings: RunSettingsResource,
) -> dg.DataVersionsByPartition:
    changed = []
    limit = run_settings.unreadable_limit
    configured: dict[str, bool] = {}
    for partition_key in dataset_split_partitions.get_partition_keys():
        dataset, split = parse_partition_key(partition_key)
        source = datasets.source(dataset)
        current = observe_partition(source, split)
        if dataset not in configured:
            configured[dataset] = dataset_configured(datasets, dataset)
        # What `radharmony check-data` says about the partition, where the user looks first.
        check = check_partition(source, split, configured[dataset], limit)
        path = outputs.root() / source_snapshot(partition_key)
        previous = load_snapshot(path)
        version = current.data_version()
        # Logged here rather than returned: `DataVersionsByPartition` carries no metadata, and
        # the observation a user opens should say what it saw and what changed.
        context.log_event(
            dg.AssetObservation(
                asset_key=context.asset_key,
                partition=partition_key,
                tags={DATA_VERSION_TAG: version},
                metadata={**check_metadata(check), **observation_metadata(current, previous)},
            )
        )
        if current != previous:  # an unchanged tree's snapshot stays as it is, unwritten
            save_snapshot(current, path)
        if previous is not None and previous.data_version() != version:
            changed.append(partition_key)
    context.log.info(
        f"observed {len(dataset_split_partitions.get_partition_keys())} partitions; "
        f"changed since the previous observation: {', '.join(changed) or 'none'}"
    )
    # Every observation is already logged above, with its data version.
    return dg.DataVersionsByPartition({})


def dataset_configured(
    datasets: DatasetsResource, dataset: str, environ: Mapping[str, str] = os.environ
) -> bool:
    """Whether the user pointed the pipeline at this dataset: its resource config or a
    variable is set, or its folder is under the data root."""
    config = getattr(datasets, dataset, None) or SourceLocationConfig()
    if any(config.model_dump().values()):
        return True
    if any(environ.get(var) for var in SOURCE_TYPES[dataset].env_vars.values()):
        return True
    try:
        return is_dir(datasets.source(dataset).root)
    except SourceError:
        return True  # something is there, unreadable: report it
