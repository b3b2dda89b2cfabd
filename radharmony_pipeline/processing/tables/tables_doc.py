"""docs/tables.md, rendered from the declared table schemas (`make docs` writes it; a test
fails when the committed page differs from what the schemas say)."""

from __future__ import annotations

import sys
from pathlib import Path

import pyarrow as pa

from radharmony_pipeline.processing.tables.table_schemas import (
    PARTITION_COLUMNS,
    SCHEMA_VERSION,
    TABLE_SCHEMAS,
    TableSchema,
)

PAGE = Path("docs") / "tables.md"

HEADER = f"""# Tables

<!-- Generated from radharmony_pipeline/processing/tables/table_schemas.py by `make docs`; do not
edit by hand (tests/test_tables_doc.py fails when this page is stale). -->

Every table's columns, in file order, as declared once in
`radharmony_pipeline/processing/tables/table_schemas.py` (schema version {SCHEMA_VERSION}). The IO
manager writes every partition of a table with exactly these columns and types, so a table
folder reads whole in pandas, pyarrow, DuckDB or Polars. A column marked *extra* belongs to
some datasets only and is null in the other datasets' partitions. Partitioned tables (one
file per `<dataset>.<split>`) carry `{"` and `".join(PARTITION_COLUMNS)}` in every row.
"""


def type_name(type_: pa.DataType) -> str:
    """The Arrow type as a reader sees it: `list<string>` rather than pyarrow's field syntax."""
    if pa.types.is_list(type_) or pa.types.is_large_list(type_):
        return f"list<{type_name(type_.value_type)}>"
    return str(type_)


def table_section(schema: TableSchema) -> str:
    lines = [
        f"## `{schema.name}`",
        "",
        f"{len(schema.columns)} columns.",
        "",
        "| column | type | description |",
        "|---|---|---|",
    ]
    for column in schema.columns:
        extra = "" if column.required else " *(extra)*"
        description = column.description.replace("|", "\\|")
        lines.append(f"| `{column.name}` | `{type_name(column.type)}` | {description}{extra} |")
    return "\n".join(lines)


def render() -> str:
    sections = [table_section(schema) for schema in TABLE_SCHEMAS.values()]
    return "\n\n".join([HEADER.rstrip(), *sections]) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Write the page under the repository folder given (default: the current folder)."""
    args = sys.argv[1:] if argv is None else argv
    target = Path(args[0] if args else ".") / PAGE
    target.write_text(render())
    print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
