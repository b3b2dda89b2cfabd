"""The decorators of a per-partition stage whose checks run in its own step and of a table
over the whole corpus, and what a stage does on the way in and out."""

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import dagster as dg

from ..processing.storage.layout_migration import migrate_stage_outputs
from ..processing.storage.store import OutputPath
from ..processing.tables.table_schemas import TableSchema
from .automation import REBUILD_WHEN_CHANGED, REBUILD_WHEN_PARTITIONS_SETTLE
from .metadata import definition_metadata, table_code_version
from .partitions import OWNERS, dataset_split_partitions

# The pool `masks` and `images` share: their per-image work fills the machine's cores.
HEAVY_POOL = "heavy_image_work"


def checked_stage(
    name: str,
    group: str,
    table: TableSchema,
    code_version: str,
    check_specs: list[dg.AssetCheckSpec],
    ins: Mapping[str, dg.AssetIn] | None = None,
    deps: Sequence[str] = (),
    pool: str | None = None,
    **out: Any,
) -> Callable[..., dg.AssetsDefinition]:
    """A stage of one asset in `group`, rebuilt when its inputs change, with
    `table`'s declared schema. `ins` are loaded before the stage runs; `deps` are tables it
    reads itself, only when it needs them.

    A multi-asset of one output, only so its checks can be deselected (`can_subset`): a plain
    `@asset` must run every check in its `check_specs`. `out` holds the rest of its `AssetOut`
    (description, kinds); the output is optional within its own step.
    """
    return dg.multi_asset(
        outs={name: stage_out(table, group, code_version, **out)},
        ins=ins,
        deps=deps,
        partitions_def=dataset_split_partitions,
        check_specs=check_specs,
        can_subset=True,
        pool=pool,
    )


def stage_out(table: TableSchema, group: str, code_version: str, **out: Any) -> dg.AssetOut:
    """A per-partition stage's output in `group` with `table`'s declared schema, rebuilt when
    its inputs change and optional within its own step; `out` holds the rest of its
    `AssetOut` (description, kinds)."""
    return dg.AssetOut(
        is_required=False,
        **_table_asset(table, group, code_version, REBUILD_WHEN_CHANGED),
        **out,
    )


def corpus_table(
    table: TableSchema,
    group: str,
    code_version: str,
    description: str,
    ins: Mapping[str, dg.AssetIn] | None = None,
    kinds: frozenset[str] = frozenset({"parquet", "pandas"}),
) -> Callable[..., dg.AssetsDefinition]:
    """A table over the whole corpus in `group`, with `table`'s declared schema, rebuilt once
    the partitions it reads (`ins`) have settled."""
    return dg.asset(
        name=table.name,
        ins=ins,
        description=description,
        kinds=set(kinds),
        **_table_asset(table, group, code_version, REBUILD_WHEN_PARTITIONS_SETTLE),
    )


def _table_asset(
    table: TableSchema, group: str, code_version: str, automation: dg.AutomationCondition
) -> dict[str, Any]:
    """What every asset holding a declared table states: its owners and group, its schema as
    definition metadata, its code version joined with the schema's, when it is rebuilt."""
    return {
        "owners": OWNERS,
        "group_name": group,
        "metadata": definition_metadata(table),
        "code_version": table_code_version(code_version),
        "automation_condition": automation,
    }


def selected_output(
    context: dg.AssetExecutionContext, name: str, value: Any, metadata: Mapping[str, Any]
) -> Iterator[dg.Output]:
    """The stage's output `name`, unless the run selected only its checks."""
    if dg.AssetKey(name) in context.selected_asset_keys:
        yield dg.Output(value, output_name=name, metadata=metadata)


def output_root_in_shards(
    context: dg.AssetExecutionContext, root: OutputPath, stage: str
) -> OutputPath:
    """`root`, with this partition's files of `stage` in a root of the flat layout first moved
    into shard folders: renamed, nothing computed again."""
    migrated = migrate_stage_outputs(root, stage, context.partition_key)
    if migrated.changed:
        context.log.info(migrated.describe())
    return root
