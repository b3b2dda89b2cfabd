"""Dataset readers: one module per dataset, each a DatasetSource; no Dagster here."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from ..processing.storage.retry_policy import DEFAULT_RETRY_POLICY, RetryPolicy
from ..processing.tables.table_schemas import LABELS, TABLE_SCHEMAS, TableSchema
from .base import DatasetSource, SplitTables
from .chestx_det import ChestXDetSource
from .chexlocalize import CheXlocalizeSource
from .counts import ExpectedCounts
from .errors import DatasetLayoutError, MetadataError, SourceError
from .location import SourceLocation, data_root
from .ms_cxr import MsCxrSource
from .rexgradient import ReXGradientSource

SOURCE_TYPES: dict[str, type[DatasetSource]] = {
    source.key: source
    for source in (CheXlocalizeSource, MsCxrSource, ChestXDetSource, ReXGradientSource)
}


def declared_schema(table: str) -> TableSchema | None:
    """The table's declared schema with the columns registered datasets add to it."""
    schema = TABLE_SCHEMAS.get(table)
    if schema is LABELS:
        return schema.with_extras([c for s in SOURCE_TYPES.values() for c in s.label_extras])
    return schema


def partition_keys() -> list[str]:
    """`<dataset>.<split>` for every split that exists; there is no dataset × split grid."""
    return [f"{key}.{split}" for key, source in SOURCE_TYPES.items() for split in source.splits]


def parse_partition_key(partition_key: str) -> tuple[str, str]:
    dataset, _, split = partition_key.partition(".")
    if dataset not in SOURCE_TYPES or split not in SOURCE_TYPES[dataset].splits:
        raise ValueError(f"unknown partition {partition_key!r}; known: {partition_keys()}")
    return dataset, split


def open_source(
    dataset: str,
    location: SourceLocation | None = None,
    environ: Mapping[str, str] = MappingProxyType({}),
    retry_policy: RetryPolicy = DEFAULT_RETRY_POLICY,
) -> DatasetSource:
    """The reader for `dataset`: explicit location first, then the variables of `environ`
    (the caller's environment, handed down as a value; none by default), then the data root;
    object-store requests follow `retry_policy`."""
    source_type = SOURCE_TYPES[dataset]
    resolved = (location or SourceLocation()).with_environment(
        source_type.env_vars, environ, retry_policy
    )
    return source_type(resolved, data_root(environ, retry_policy))


__all__ = [
    "SOURCE_TYPES",
    "CheXlocalizeSource",
    "ChestXDetSource",
    "DatasetLayoutError",
    "DatasetSource",
    "ExpectedCounts",
    "MetadataError",
    "MsCxrSource",
    "ReXGradientSource",
    "SourceError",
    "SourceLocation",
    "SplitTables",
    "open_source",
    "parse_partition_key",
    "partition_keys",
]
