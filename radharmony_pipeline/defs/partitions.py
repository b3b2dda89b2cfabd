"""The ten `<dataset>.<split>` partitions (static: the splits that exist, not a grid)."""

import dagster as dg

from ..sources import partition_keys

dataset_split_partitions = dg.StaticPartitionsDefinition(partition_keys())

# Who answers for the stages in the UI (asset owners).
OWNERS = ["team:radharmony"]
