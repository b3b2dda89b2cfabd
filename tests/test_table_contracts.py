"""Each table's columns are declared once: the job rows, frames, manifest columns and a
dataset's own extras all follow the declaration in table_schemas.py."""

from __future__ import annotations

import dataclasses
import pickle
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pytest

from radharmony_pipeline.processing.corpus.parents import PARENT_IDENTITY
from radharmony_pipeline.processing.jobs.image_jobs import ImageRow, image_table
from radharmony_pipeline.processing.jobs.mask_jobs import MaskRow, mask_table
from radharmony_pipeline.processing.storage import output_layout as layout
from radharmony_pipeline.processing.tables.manifest import PARTITION_MANIFEST_COLUMNS
from radharmony_pipeline.processing.tables.table_schemas import (
    CORPUS_WIDE_COLUMNS,
    IMAGES,
    INDEX_COLUMNS,
    LABELS,
    MASKS,
    PARTITION_COLUMNS,
    RAW_INDEX,
    STRING,
    TABLE_SCHEMAS,
    UNIFIED_MANIFEST,
    SchemaMismatchError,
    col,
    conform,
    extra,
)
from radharmony_pipeline.sources import SOURCE_TYPES, declared_schema
from radharmony_pipeline.vocabulary import LABEL_COLUMNS


def _own_columns(schema) -> list[str]:
    return [name for name in schema.names if name not in PARTITION_COLUMNS]


def test_job_rows_hold_the_declared_columns_then_their_working_fields():
    working = ["decoded", "input_key"]
    assert [f.name for f in dataclasses.fields(ImageRow)] == [*_own_columns(IMAGES), *working]
    assert [f.name for f in dataclasses.fields(MaskRow)] == [*_own_columns(MASKS), "written"]


def test_an_error_row_is_null_where_it_knows_nothing_and_is_written_as_declared():
    row = ImageRow(image_id="d/x", size=224, tensor_index=3, resize="letterbox", error="bad")
    row.status = "error"
    # Rows travel to worker processes and back.
    assert pickle.loads(pickle.dumps(row)) == row
    frame = image_table([row])
    assert frame.loc[0, "orig_height"] is pd.NA and not frame.loc[0, "decoded"]
    frame = frame.drop(columns=["decoded", "input_key"])
    table = conform(frame, IMAGES, {"dataset": "d", "split": "train"})
    assert table.schema.names == IMAGES.names
    assert table.column("tensor_index").to_pylist() == [3]
    assert table.column("error").to_pylist() == ["bad"]


def test_empty_tables_have_the_declared_pandas_types():
    masks = mask_table([])
    assert list(masks.columns) == [*_own_columns(MASKS), "written"]
    assert str(masks["height"].dtype) == "Int64" and str(masks["mask_path"].dtype) == "string"
    assert (
        conform(masks.drop(columns="written"), MASKS, {"dataset": "d", "split": "s"}).num_rows == 0
    )


def test_a_partitions_manifest_is_every_declared_column_but_the_corpus_wide_ones():
    assert [*PARTITION_MANIFEST_COLUMNS, *CORPUS_WIDE_COLUMNS] == UNIFIED_MANIFEST.names


def test_a_datasets_own_column_goes_before_status_with_its_own_arrow_schema():
    grade = extra("toy_grade", STRING, "A toy dataset's own grade")
    extended = LABELS.with_extras([grade, grade])
    assert extended.names.index("toy_grade") == LABELS.names.index("status")
    assert extended.names.count("toy_grade") == 1
    assert "toy_grade" in extended.arrow().names and "toy_grade" not in LABELS.arrow().names
    # Already declared: nothing changes; a required column from a dataset is refused.
    assert LABELS.with_extras([LABELS.column("report")]) is LABELS
    with pytest.raises(ValueError, match="extras"):
        LABELS.with_extras([col("toy_grade", STRING, "required")])
    with pytest.raises(SchemaMismatchError, match="toy_grade"):
        conform(pd.DataFrame({"image_id": ["d/x"], "toy_grade": ["x"]}), LABELS)


def test_the_registry_adds_a_registered_datasets_label_extras(monkeypatch):
    source = next(iter(SOURCE_TYPES.values()))
    grade = extra("toy_grade", STRING, "A toy dataset's own grade")
    assert "toy_grade" not in declared_schema("labels").names
    monkeypatch.setattr(source, "label_extras", (grade,))
    assert "toy_grade" in declared_schema("labels").names
    assert declared_schema("masks") is MASKS


def test_the_layout_names_each_output_under_the_root():
    root = Path("/out")
    assert layout.table_file(root, "masks", "a.train") == root / "tables/masks/a.train.parquet"
    assert layout.root_of_table_file(layout.table_file(root, "unified_manifest")) == root
    packed = root / layout.packed_images("a.train")
    assert layout.packed_keys(packed) == root / "images/a.train.npy.keys.json"
    assert layout.resized_union_mask("a.train", "k").startswith(
        layout.resized_image_folder("a.train")
    )
    assert layout.image_mask_folder("a.train", "k").startswith(layout.mask_folder("a.train") + "/")


def test_declarations_agree_with_the_vocabulary_and_the_index_contract():
    assert tuple(RAW_INDEX.names[: len(INDEX_COLUMNS)]) == INDEX_COLUMNS
    for table in ("labels", "unified_manifest"):
        assert set(LABEL_COLUMNS) <= set(TABLE_SCHEMAS[table].names)
    # duplicate_group and the parent identity are joined from near_duplicates and
    # parent_provenance after the partitions are assembled.
    assert tuple(TABLE_SCHEMAS["unified_manifest"].names) == (
        *PARTITION_MANIFEST_COLUMNS,
        "duplicate_group",
        *PARENT_IDENTITY,
    )


def test_a_frame_that_does_not_fit_names_the_column_and_both_types():
    frame = pd.DataFrame({"image_id": ["a/1"], "box_index": ["first"], "label": ["mass"]})
    with pytest.raises(SchemaMismatchError) as error:
        conform(frame, TABLE_SCHEMAS["bboxes"], {"dataset": "a", "split": "b"})
    message = str(error.value)
    assert "bboxes.box_index" in message and "int64" in message and "string" in message


def test_a_fractional_value_in_an_integer_column_is_refused_not_truncated():
    frame = pd.DataFrame({"image_id": ["a/1"], "box_index": [1.5]})
    with pytest.raises(SchemaMismatchError, match=r"box_index.*int64.*float64"):
        conform(frame, TABLE_SCHEMAS["bboxes"], {"dataset": "a", "split": "b"})


def test_an_undeclared_column_is_refused_with_where_to_declare_it():
    frame = pd.DataFrame({"image_id": ["a/1"], "surprise": [1]})
    with pytest.raises(SchemaMismatchError, match=r"surprise.*table_schemas\.py"):
        conform(frame, TABLE_SCHEMAS["images"])


def test_extras_are_typed_nulls_and_nullable_ints_stay_ints():
    frame = pd.DataFrame(
        {
            "image_id": ["a/1", "a/2"],
            "report": [None, "text"],
            "label_text": [[], ["x", None]],
            **{
                c: pd.array([1, None], dtype="Int8")
                for c in TABLE_SCHEMAS["labels"].names
                if c.startswith("label_") and c != "label_text"
            },
            "status": ["ok", "ok"],
            "error": [None, None],
        }
    )
    table = conform(frame, TABLE_SCHEMAS["labels"], {"dataset": "d", "split": "train"})
    assert table.schema.field("num_boxes").type == pa.int32()
    assert table.column("num_boxes").null_count == 2
    back = table.to_pandas()
    assert str(back["label_atelectasis"].dtype) == "Int8"
    assert back["label_atelectasis"].isna().tolist() == [False, True]
    assert str(back["is_negative"].dtype) == "boolean"
