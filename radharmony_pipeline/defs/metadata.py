"""Materialization metadata shared by every table asset: column schema and row count."""

import dagster as dg
import pandas as pd

from ..processing.tables.reasons import error_reasons
from ..processing.tables.table_schemas import SCHEMA_VERSION, TableSchema
from ..vocabulary import STATUS_ERROR


def column_type(series: pd.Series) -> str:
    """A readable type: pandas dtype, or `list<...>` for list-valued object columns."""
    if series.dtype == object:
        sample = series.dropna()
        if len(sample) and isinstance(sample.iloc[0], list):
            return "list"
        return "string" if len(sample) and isinstance(sample.iloc[0], str) else "object"
    return str(series.dtype)


def table_schema(frame: pd.DataFrame) -> dg.TableSchema:
    return dg.TableSchema(
        columns=[dg.TableColumn(name=str(name), type=column_type(frame[name])) for name in frame]
    )


def declared_column_schema(schema: TableSchema) -> dg.TableSchema:
    """The declared columns with their Arrow types and descriptions, as the UI shows them."""
    return dg.TableSchema(
        columns=[
            dg.TableColumn(
                name=column.name,
                type=str(column.type),
                description=column.description,
            )
            for column in schema.columns
        ]
    )


def table_metadata(frame: pd.DataFrame, schema: TableSchema | None = None) -> dict:
    """The standard keys the UI shows as a table's columns and row count (the declared
    schema, with descriptions, for tables that have one)."""
    columns = declared_column_schema(schema) if schema is not None else table_schema(frame)
    metadata = {
        "dagster/column_schema": dg.MetadataValue.table_schema(columns),
        "dagster/row_count": dg.MetadataValue.int(len(frame)),
    }
    if schema is not None:
        metadata["schema_version"] = SCHEMA_VERSION
    return metadata


def definition_metadata(schema: TableSchema) -> dict:
    """Asset-definition metadata: the declared columns show before anything is materialized."""
    return {"dagster/column_schema": dg.MetadataValue.table_schema(declared_column_schema(schema))}


def status_counts(table: pd.DataFrame) -> dict[str, int]:
    """Rows by status, and error rows by reason."""
    counts = {str(k): int(v) for k, v in table["status"].value_counts().items()}
    errors = error_reasons(table.loc[table["status"] == STATUS_ERROR, "error"])
    counts.update({f"error: {reason}": n for reason, n in errors.items()})
    return counts


def table_code_version(stage_code_version: str) -> str:
    """A stage's code version joined with the table schema version: a changed declaration
    marks the tables stale (eager automation rebuilds them) without changing the keys of the
    PNG files the stage writes, so those are not rewritten."""
    return f"{stage_code_version}+schema{SCHEMA_VERSION}"
