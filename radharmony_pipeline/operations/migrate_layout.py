"""`radharmony migrate-layout`: an output root written before per-image outputs were sharded,
moved into shard folders partition by partition (files renamed, nothing decoded), with the
table checksums `radharmony verify` compares against recorded anew in the instance."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import dagster as dg

from ..defs.io_managers import TABLE_CHECKSUM
from ..processing.storage.layout_migration import (
    STAGES,
    MigrationResult,
    RewrittenTable,
    migrate_stage_outputs,
)
from ..processing.storage.store import OutputPath

# Written into the materialization that records a rewritten table's new checksum.
MIGRATED_DESCRIPTION = (
    "The same rows with their file paths rewritten into shard folders by "
    "`radharmony migrate-layout` (nothing decoded); the rest of the metadata is the previous "
    "materialization's."
)


def migrate_output_root(
    root: OutputPath,
    partitions: Sequence[str],
    instance: dg.DagsterInstance | None,
    report: Callable[[str], None],
) -> list[MigrationResult]:
    """Every stage's outputs of every partition moved into shard folders (an interrupted
    migration finished), each change reported through `report`. With an instance, every table
    rewritten gets a materialization carrying its new checksum, so that `verify` keeps
    telling a damaged table from a migrated one."""
    results = []
    for partition in partitions:
        for stage in STAGES:  # masks, then the images whose union masks they are
            result = migrate_stage_outputs(root, stage, partition)
            if instance is not None:
                for table in result.rewritten:
                    record_rewritten_table(instance, table)
            if result.changed:
                report(result.describe())
            results.append(result)
    return results


def record_rewritten_table(instance: dg.DagsterInstance, table: RewrittenTable) -> None:
    """Report the rewritten table as materialized anew: its latest materialization's metadata
    with the new file checksum."""
    key = dg.AssetKey(table.table)
    partitions = [table.partition] if table.partition is not None else None
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=key, asset_partitions=partitions), limit=1
    ).records
    previous = dict(records[0].asset_materialization.metadata) if records else {}
    instance.report_runless_asset_event(
        dg.AssetMaterialization(
            asset_key=key,
            partition=table.partition,
            description=MIGRATED_DESCRIPTION,
            metadata={**previous, TABLE_CHECKSUM: table.sha256},
        )
    )
