"""The decorator of a per-partition stage whose checks run in its own step."""

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import dagster as dg

from ..processing.tables.table_schemas import TableSchema
from .automation import REBUILD_WHEN_CHANGED
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
        outs={
            name: dg.AssetOut(
                is_required=False,
                owners=OWNERS,
                group_name=group,
                automation_condition=REBUILD_WHEN_CHANGED,
                code_version=table_code_version(code_version),
                metadata=definition_metadata(table),
                **out,
            )
        },
        ins=ins,
        deps=deps,
        partitions_def=dataset_split_partitions,
        check_specs=check_specs,
        can_subset=True,
        pool=pool,
    )
