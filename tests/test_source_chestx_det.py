"""ChestX-Det reader: one row per JSON entry, 13 classes as true 0/1, negatives, class counts."""

from __future__ import annotations

import json

import pytest

from radharmony_pipeline.sources.counts import MASK_METRICS, is_dataset_metric
from radharmony_pipeline.vocabulary import LABEL_COLUMNS


@pytest.mark.parametrize("split", ["train", "test"])
def test_rows_ids_paths_and_counts(open_tiny, tiny_root, split):
    source = open_tiny("chestx_det")
    tables = source.read_split(split)
    entries = json.loads((tiny_root / "chestx-det" / f"ChestX_Det_{split}.json").read_text())
    index, labels = tables.index, tables.labels
    assert list(index["image_path"]) == [e["file_name"] for e in entries]
    assert list(index["image_id"]) == [f"chestx_det/{e['file_name'][:-4]}" for e in entries]
    assert index["patient_id"].isna().all() and (index["source_height"] == 1024).all()
    for relative in index["image_path"]:
        assert (source.image_dir(split) / relative).is_file()
    expected = json.loads((tiny_root / "chestx-det" / "expected_counts.json").read_text())
    metrics = source.count_metrics(tables)
    for metric, value in expected["splits"][split].items():
        if metric not in MASK_METRICS and not is_dataset_metric(metric):
            assert metrics[metric] == value, metric
    assert labels["num_instances"].tolist() == [len(e["syms"]) for e in entries]


def test_thirteen_classes_are_zero_or_one_and_the_rest_null(open_tiny, tiny_root):
    labels = open_tiny("chestx_det").read_split("train").labels
    entries = json.loads((tiny_root / "chestx-det" / "ChestX_Det_train.json").read_text())
    annotated = [c for c in LABEL_COLUMNS if labels[c].notna().any()]
    assert len(annotated) == 13
    assert labels[annotated].notna().all().all() and labels[annotated].isin([0, 1]).all().all()
    assert set(LABEL_COLUMNS) - set(annotated) == {
        "label_edema",
        "label_enlarged_cardiomediastinum",
        "label_lung_lesion",
        "label_lung_opacity",
        "label_no_finding",
        "label_pleural_other",
        "label_pneumonia",
        "label_support_devices",
    }
    for (_, row), entry in zip(labels.iterrows(), entries, strict=True):
        assert row["label_pleural_effusion"] == int("Effusion" in entry["syms"])
        assert row["label_diffuse_nodule"] == int("Diffuse Nodule" in entry["syms"])
        assert row["is_negative"] == (not entry["syms"])
    assert labels["is_negative"].any()


def test_class_totals_match_expected_counts(open_tiny, tiny_root):
    source = open_tiny("chestx_det")
    totals: dict[str, int] = {}
    for split in source.splits:
        for metric, value in source.count_metrics(source.read_split(split)).items():
            totals[metric] = totals.get(metric, 0) + value
    expected = json.loads((tiny_root / "chestx-det" / "expected_counts.json").read_text())
    for metric, value in expected["total"].items():
        if metric not in MASK_METRICS and not is_dataset_metric(metric):
            assert totals.get(metric) == value, metric
