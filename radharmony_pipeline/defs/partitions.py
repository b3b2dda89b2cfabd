"""The ten `<dataset>.<split>` partitions (static: the splits that exist, not a grid)."""

import dagster as dg

from ..sources import partition_keys

dataset_split_partitions = dg.StaticPartitionsDefinition(partition_keys())

# Who answers for the stages in the UI (asset owners).
OWNERS = ["team:radharmony"]


def every_partition_of(*assets: str) -> dict[str, dg.AssetIn]:
    """Inputs that read every materialized partition of `assets` (as `{partition: table}`), for
    the stages that join the whole corpus; partitions not built yet are left out."""
    return {
        name: dg.AssetIn(
            name,
            partition_mapping=dg.AllPartitionMapping(),
            metadata={"allow_missing_partitions": True},
        )
        for name in assets
    }


def blocking_partition_check(
    name: str, asset: dg.AssetKey, description: str, **options
) -> dg.AssetCheckSpec:
    """A check a stage evaluates in its own step: per partition, and blocking (its severity
    decides whether downstream stages wait)."""
    return dg.AssetCheckSpec(
        name,
        asset=asset,
        blocking=True,
        partitions_def=dataset_split_partitions,
        description=description,
        **options,
    )
