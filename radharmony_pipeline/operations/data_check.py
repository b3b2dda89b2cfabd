"""`radharmony check-data`: each partition's download checked the way the pipeline will
resolve it (resource config, variables, data root)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from ..defs.assets.source_files import dataset_configured
from ..defs.resources import DatasetsResource
from ..settings import unreadable_limit
from ..sources import parse_partition_key, partition_keys
from ..sources.preflight import UNUSABLE, PartitionReport, check_partition


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
