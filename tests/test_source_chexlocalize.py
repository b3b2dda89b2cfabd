"""CheXlocalize reader on tiny synthetic data: rows, ids, paths, views, labels, segmentation."""

from __future__ import annotations

import csv
import json

import pandas as pd
import pytest
from PIL import Image

from radharmony_pipeline.vocabulary import LABEL_COLUMNS


@pytest.fixture(scope="module")
def expected(tiny_root):
    return json.loads((tiny_root / "chexlocalize" / "expected_counts.json").read_text())


def _csv_rows(tiny_root, split):
    with open(tiny_root / "chexlocalize" / "CheXpert" / f"{split}_labels.csv", newline="") as f:
        return list(csv.DictReader(f))


def _segmentations(tiny_root, split):
    path = tiny_root / "chexlocalize" / "CheXlocalize" / f"gt_segmentations_{split}.json"
    return json.loads(path.read_text())


@pytest.mark.parametrize("split", ["val", "test"])
def test_one_row_per_csv_row_with_ids_and_relative_paths(open_tiny, tiny_root, expected, split):
    source = open_tiny("chexlocalize")
    tables = source.read_split(split)
    rows = _csv_rows(tiny_root, split)
    index = tables.index
    assert len(index) == len(rows) == expected["splits"][split]["images"]
    assert index["image_id"].is_unique and index["image_key"].is_unique
    assert (
        index["image_id"]
        .str.match(r"^chexlocalize/patient\d+_study\d+_view\d+_(frontal|lateral)$")
        .all()
    )
    assert index["image_key"].str.match(r"^[A-Za-z0-9._-]+$").all()
    assert (index["dataset"] == "chexlocalize").all() and (index["split"] == split).all()
    # Every prefix up to the split folder is stripped, whatever the CSV's form.
    assert (
        index["image_path"].str.match(r"^patient\d+/study\d+/view\d+_(frontal|lateral)\.jpg$").all()
    )
    for relative in index["image_path"]:
        assert (source.image_dir(split) / relative).is_file()
    assert (
        index["patient_id"] + "_" + index["image_path"].str.split("/").str[1] == index["study_id"]
    ).all()
    assert index["patient_id"].nunique() == expected["splits"][split]["patients"]
    assert (index["image_format"] == "jpg").all()
    assert list(tables.labels["image_id"]) == list(index["image_id"])


def test_val_csv_uses_full_header_and_prefix(tiny_root):
    rows = _csv_rows(tiny_root, "val")
    assert "Sex" in rows[0] and "AP/PA" in rows[0]
    assert rows[0]["Path"].startswith("CheXpert-v1.0/valid/")


def test_views_come_from_file_name_and_projection(open_tiny, tiny_root):
    for split in ("val", "test"):
        index = open_tiny("chexlocalize").read_split(split).index
        lateral = index["image_path"].str.endswith("_lateral.jpg")
        assert lateral.any() and (~lateral).any()
        assert (index.loc[lateral, "view_position"] == "LATERAL").all()
    val = open_tiny("chexlocalize").read_split("val").index
    val_rows = {r["Path"].split("valid/")[1]: r for r in _csv_rows(tiny_root, "val")}
    for _, row in val[~val["image_path"].str.endswith("_lateral.jpg")].iterrows():
        assert row["view_position"] == (val_rows[row["image_path"]]["AP/PA"] or "UNKNOWN")
    test = open_tiny("chexlocalize").read_split("test").index
    frontal = test[test["image_path"].str.endswith("_frontal.jpg")]
    # The test CSV has no AP/PA column: a frontal film's projection is unknown, not invented.
    assert (frontal["view_position"] == "UNKNOWN").all()
    assert (frontal["view_position_raw"] == "frontal").all()


def test_segmentation_entries_sizes_and_the_documented_quirk(open_tiny, tiny_root, expected):
    source = open_tiny("chexlocalize")
    tables = source.read_split("test")
    index, labels = tables.index, tables.labels
    entries = _segmentations(tiny_root, "test")
    native_ids = index["image_id"].str.removeprefix("chexlocalize/")
    assert list(labels["has_segmentation"]) == list(native_ids.isin(entries))
    assert (
        labels["has_segmentation"].sum() == expected["splits"]["test"]["images_with_segmentation"]
    )
    for _, row in index[labels["has_segmentation"]].iterrows():
        with Image.open(source.image_dir("test") / row["image_path"]) as image:
            assert (row["source_height"], row["source_width"]) == (image.height, image.width)
    assert index.loc[~labels["has_segmentation"], "source_height"].isna().all()
    localizable = [
        "label_atelectasis",
        "label_cardiomegaly",
        "label_consolidation",
        "label_edema",
        "label_enlarged_cardiomediastinum",
        "label_lung_lesion",
        "label_lung_opacity",
        "label_pleural_effusion",
        "label_pneumothorax",
        "label_support_devices",
    ]
    frontal = index["image_path"].str.endswith("_frontal.jpg")
    positive = labels[localizable].eq(1).any(axis=1)
    quirk = labels.loc[frontal & positive & ~labels["has_segmentation"], "image_id"]
    assert len(quirk) == 1


def test_labels_map_one_to_one_and_leave_other_classes_null(open_tiny, tiny_root):
    labels = open_tiny("chexlocalize").read_split("test").labels
    rows = _csv_rows(tiny_root, "test")
    assert list(labels["pleural_effusion"]) == [int(float(r["Pleural Effusion"])) for r in rows]
    chexpert = [
        "no_finding",
        "enlarged_cardiomediastinum",
        "cardiomegaly",
        "lung_opacity",
        "lung_lesion",
        "edema",
        "consolidation",
        "pneumonia",
        "atelectasis",
        "pneumothorax",
        "pleural_effusion",
        "pleural_other",
        "fracture",
        "support_devices",
    ]
    for name in chexpert:
        assert labels[f"label_{name}"].equals(labels[name].rename(f"label_{name}"))
        assert labels[f"label_{name}"].notna().all()
    others = [c for c in LABEL_COLUMNS if c.removeprefix("label_") not in chexpert]
    assert len(others) == 7 and labels[others].isna().all().all()
    assert all(str(labels[c].dtype) == "Int8" for c in LABEL_COLUMNS)
    assert labels["report"].isna().all()
    assert labels["label_text"].map(len).eq(0).all()


def test_uncertain_values_are_kept_natively_and_null_in_unified(tiny_copy, open_tiny):
    path = tiny_copy / "chexlocalize" / "CheXpert" / "test_labels.csv"
    table = pd.read_csv(path)
    table.loc[0, "Edema"] = -1.0
    table.loc[1, "Edema"] = None
    table.to_csv(path, index=False)
    labels = open_tiny("chexlocalize", root=tiny_copy).read_split("test").labels
    assert labels.loc[0, "edema"] == -1 and pd.isna(labels.loc[0, "label_edema"])
    assert pd.isna(labels.loc[1, "edema"]) and pd.isna(labels.loc[1, "label_edema"])
