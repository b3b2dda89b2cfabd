"""`radharmony check-data` and the `source_files` observation: each partition's download
checked the way the pipeline will resolve it (resource config, variables, data root)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from ..processing import source_store
from ..processing.settings import unreadable_limit
from ..sources import SOURCE_TYPES, SourceError, parse_partition_key, partition_keys
from ..sources.preflight import UNUSABLE, PartitionReport, check_partition
from .resources import DatasetsResource, SourceLocationConfig


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
        return source_store.is_dir(datasets.source(dataset).root)
    except SourceError:
        return True  # something is there, unreadable: report it


def check_partitions(
    datasets: DatasetsResource,
    partitions: Sequence[str] | None = None,
    environ: Mapping[str, str] = os.environ,
) -> list[PartitionReport]:
    limit = unreadable_limit(environ)
    reports = []
    configured: dict[str, bool] = {}
    for partition in partitions or partition_keys():
        dataset, split = parse_partition_key(partition)
        if dataset not in configured:
            configured[dataset] = dataset_configured(datasets, dataset, environ)
        reports.append(check_partition(datasets.source(dataset), split, configured[dataset], limit))
    return reports


def any_unusable(reports: Sequence[PartitionReport]) -> bool:
    return any(report.status == UNUSABLE for report in reports)
