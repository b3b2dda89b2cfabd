"""docs/tables.md is generated from the declared schemas and committed up to date."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from radharmony_pipeline.processing.tables.table_schemas import TABLE_SCHEMAS, TableSchema, col
from radharmony_pipeline.processing.tables.tables_doc import PAGE, main, render, table_section

REPOSITORY = Path(__file__).resolve().parent.parent


def test_the_committed_page_is_what_the_schemas_say():
    committed = (REPOSITORY / PAGE).read_text()
    assert committed == render(), "docs/tables.md is stale: run `make docs` and commit it"


def test_every_declared_column_is_on_the_page_with_its_type():
    page = render()
    for schema in TABLE_SCHEMAS.values():
        section = page.split(f"## `{schema.name}`\n", 1)[1].split("\n## ", 1)[0]
        rows = [line for line in section.splitlines() if line.startswith("| `")]
        assert [row.split("`")[1] for row in rows] == schema.names, schema.name


def test_a_new_column_changes_the_page():
    schema = TABLE_SCHEMAS["bboxes"]
    grown = TableSchema(schema.name, (*schema.columns, col("angle", pa.float32(), "Tilt a|b")))
    section = table_section(grown)
    assert section.splitlines()[-1] == "| `angle` | `float` | Tilt a\\|b |"
    assert section != table_section(schema)


def test_the_script_writes_the_page_under_the_folder_given(tmp_path):
    (tmp_path / "docs").mkdir()
    assert main([str(tmp_path)]) == 0
    assert (tmp_path / PAGE).read_text() == render()
