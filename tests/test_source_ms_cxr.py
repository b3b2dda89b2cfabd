"""MS-CXR reader: per-file extensions over JPG/DICOM/mixed trees, ids, phrases, positives only."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from radharmony_pipeline.sources.ms_cxr import CSV_NAME
from radharmony_pipeline.synthetic import generate_datasets
from radharmony_pipeline.vocabulary import LABEL_COLUMNS


@pytest.fixture(scope="module")
def boxes(tiny_root):
    return pd.read_csv(tiny_root / "ms-cxr" / CSV_NAME, dtype={"dicom_id": str})


def test_csv_is_the_real_column_order(boxes):
    # As the MS-CXR release documents MS_CXR_Local_Alignment_v1.1.0.csv, not the constant the
    # generator writes from.
    assert ",".join(boxes.columns) == (
        "dicom_id,category_name,label_text,path,x,y,w,h,image_width,image_height,split"
    )
    assert set(boxes["split"]) == {"train", "val", "test"}


@pytest.mark.parametrize("split", ["train", "val", "test"])
def test_one_row_per_image_with_ids_from_the_path(open_tiny, tiny_root, boxes, split):
    source = open_tiny("ms_cxr")
    tables = source.read_split(split)
    index, labels = tables.index, tables.labels
    mine = boxes[boxes["split"] == split]
    assert sorted(index["image_id"]) == sorted("ms_cxr/" + mine["dicom_id"].unique())
    expected = json.loads((tiny_root / "ms-cxr" / "expected_counts.json").read_text())
    assert len(index) == expected["splits"][split]["images"]
    assert labels["num_boxes"].sum() == len(mine) == expected["splits"][split]["annotations"]
    first = mine.drop_duplicates("dicom_id").set_index("dicom_id")
    for _, row in index.iterrows():
        csv_row = first.loc[row["image_id"].removeprefix("ms_cxr/")]
        parts = csv_row["path"].split("/")
        assert row["patient_id"] == parts[2][1:] and row["study_id"] == parts[3][1:]
        assert row["image_path"].rsplit(".", 1)[0] == csv_row["path"][len("files/") : -len(".jpg")]
        assert (row["source_width"], row["source_height"]) == (
            csv_row["image_width"],
            csv_row["image_height"],
        )
        assert (source.image_dir(split) / row["image_path"]).is_file()
        assert row["image_path"].endswith("." + row["image_format"])


def test_mixed_tree_has_both_formats_decided_per_file(open_tiny):
    formats = pd.concat(open_tiny("ms_cxr").read_split(s).index for s in ("train", "val", "test"))
    assert set(formats["image_format"]) == {"jpg", "dcm"}


@pytest.mark.parametrize("mimic_format", ["jpg", "dcm"])
def test_single_format_trees(tmp_path, open_tiny, mimic_format):
    generate_datasets(
        tmp_path, scale="tiny", seed=3, datasets=["ms_cxr"], mimic_format=mimic_format
    )
    index = open_tiny("ms_cxr", root=tmp_path).read_split("train").index
    assert (index["image_format"] == mimic_format).all()


def test_phrases_and_positive_only_unified_labels(open_tiny, boxes):
    labels = open_tiny("ms_cxr").read_split("train").labels
    train = boxes[boxes["split"] == "train"]
    multi_box = train.groupby(["dicom_id", "label_text"]).size()
    assert (multi_box > 1).any(), "the generator must write multi-box phrases"
    for _, row in labels.iterrows():
        mine = train[train["dicom_id"] == row["image_id"].removeprefix("ms_cxr/")]
        # One phrase per CSV row (per box), duplicates kept: parallel to the boxes.
        assert list(row["label_text"]) == list(mine["label_text"])
        categories = {c.lower().replace(" ", "_") for c in mine["category_name"]}
        for column in LABEL_COLUMNS:
            value = row[column]
            if column.removeprefix("label_") in categories:
                assert value == 1
            else:
                # Absence of a phrase is not a negative finding.
                assert pd.isna(value), column
        assert row["pneumothorax"] == int("pneumothorax" in categories)
