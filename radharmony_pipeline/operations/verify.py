"""`radharmony verify`: each partition's outputs against what was recorded when they were
written (the table checksums in the instance's materializations, the PNGs' own keys), checked
on the stages' executor."""

from __future__ import annotations

from collections.abc import Sequence

import dagster as dg

from ..defs.io_managers import TABLE_CHECKSUM
from ..processing.execution.cluster import Executor, LocalPool
from ..processing.execution.parallel import Progress
from ..processing.storage.integrity import (
    PARTITION_TABLES,
    Mismatch,
    verify_partitions,
    withdraw_packed_keys,
)
from ..processing.storage.output_layout import mask_folder
from ..processing.storage.packed_rows import DEFAULT_WINDOW_BYTES
from ..processing.storage.store import OutputPath, exists, remove

# Without an executor, verify runs in this process (a library call, a test).
IN_THIS_PROCESS = LocalPool(1)


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
    root: OutputPath,
    partitions: Sequence[str],
    instance: dg.DagsterInstance | None,
    executor: Executor = IN_THIS_PROCESS,
    on_progress: Progress | None = None,
    window_bytes: int = DEFAULT_WINDOW_BYTES,
) -> list[Mismatch]:
    """Every mismatch under `root` for `partitions`, the files checked on `executor` with
    packed arrays read `window_bytes` at a time (on_progress(outputs checked, outputs)).

    A partition with a damaged image or packed array has its array's key record withdrawn,
    so that its next materialize checks every image and repairs exactly what is damaged
    instead of trusting the headers. A damaged native mask or export shard is removed (a
    reader then fails on it instead of reading garbage), and the next materialize of its
    stage or export writes exactly it again."""
    checksums = {
        partition: recorded_table_checksums(instance, partition) if instance else {}
        for partition in partitions
    }
    mismatches = []
    for found in verify_partitions(root, checksums, executor, on_progress, window_bytes):
        if found.pixels_damaged():
            withdraw_packed_keys(root, found.partition)
        for mask in _native_masks(root, found.partition, found.mismatches):
            remove(mask)
        mismatches += found.mismatches
        for shard, problem in found.damaged_shards:
            remove(shard)
            mismatches.append(Mismatch(str(shard), f"{problem}; removed, re-export to repair"))
    return mismatches


def _native_masks(root: OutputPath, partition: str, mismatches: Sequence[Mismatch]) -> list:
    """The damaged native-resolution masks among `mismatches` that still exist (the masks
    stage re-uses its table only while every mask it names is there)."""
    prefix = f"{root}/"
    folder = f"{mask_folder(partition)}/"
    relative = (m.path[len(prefix) :] for m in mismatches if m.path.startswith(prefix))
    return [root / path for path in relative if path.startswith(folder) and exists(root / path)]
