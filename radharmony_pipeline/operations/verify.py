"""`radharmony verify`: each partition's outputs against what was recorded when they were
written (the table checksums in the instance's materializations, the PNGs' own keys)."""

from __future__ import annotations

from collections.abc import Sequence

import dagster as dg

from ..defs.io_managers import TABLE_CHECKSUM
from ..processing.storage.integrity import (
    PARTITION_TABLES,
    Mismatch,
    damaged_export_shards,
    verify_partition,
    withdraw_packed_keys,
)
from ..processing.storage.store import OutputPath, remove


def recorded_table_checksums(instance: dg.DagsterInstance, partition: str) -> dict[str, str | None]:
    """The SHA-256 of each table file as its latest materialization of `partition` recorded
    it (None for a table materialized before checksums were recorded, or never)."""
    checksums: dict[str, str | None] = {}
    for name in PARTITION_TABLES:
        records = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=dg.AssetKey(name), asset_partitions=[partition]),
            limit=1,
        ).records
        value = records[0].asset_materialization.metadata.get(TABLE_CHECKSUM) if records else None
        checksums[name] = getattr(value, "value", None)
    return checksums


def verify_outputs(
    root: OutputPath, partitions: Sequence[str], instance: dg.DagsterInstance | None
) -> list[Mismatch]:
    """Every mismatch under `root` for `partitions`. A partition with a damaged image or
    packed array has its array's key record withdrawn, so that its next materialize checks
    every image and repairs exactly what is damaged instead of trusting the headers. A
    damaged export shard is removed (a reader then fails on it instead of reading garbage),
    and the next materialize of that export writes exactly it again."""
    mismatches = []
    for partition in partitions:
        checksums = recorded_table_checksums(instance, partition) if instance else {}
        found = verify_partition(root, partition, checksums)
        if any(not m.path.endswith(".parquet") for m in found):
            withdraw_packed_keys(root, partition)
        mismatches += found
        for shard, problem in damaged_export_shards(root, partition):
            remove(shard)
            mismatches.append(Mismatch(str(shard), f"{problem}; removed, re-export to repair"))
    return mismatches
