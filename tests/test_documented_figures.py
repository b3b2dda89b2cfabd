"""A documented count is a check that fails, with expected vs found and a hint, on a
deliberately altered copy of the tiny data (the dataset figures: tests/test_dataset_figures.py);
MS-CXR view positions and phrase lists."""

from __future__ import annotations

import csv
import dataclasses
import gzip
import io
import json

import dagster as dg
import numpy as np
import pandas as pd
import pydicom
import pytest
from corpus import check_evaluations, materialize_corpus

from radharmony_pipeline.defs.assets.index_and_labels import raw_index_and_labels
from radharmony_pipeline.defs.checks.dataset_figures import (
    card_figures,
    dataset_figures_match_documentation,
)
from radharmony_pipeline.defs.resources import pipeline_resources
from radharmony_pipeline.sources.chestx_det import ChestXDetSource
from radharmony_pipeline.sources.ms_cxr import CSV_NAME

METADATA_CSV = "mimic-cxr-2.0.0-metadata.csv.gz"


def labels_check(data_root, output, partition: str):
    result = dg.materialize(
        [raw_index_and_labels],
        partition_key=partition,
        resources=pipeline_resources(data_root, output),
        raise_on_error=False,
    )
    return check_evaluations(result)["counts_match_documentation"]


def _metadata_text(evaluation, key: str) -> str:
    return str(evaluation.metadata[key].value)


# --- CheXlocalize ---------------------------------------------------------------------------


def test_an_uncertain_label_in_the_chexlocalize_test_csv_fails_with_a_hint(tiny_copy, tmp_path):
    path = tiny_copy / "chexlocalize" / "CheXpert" / "test_labels.csv"
    frame = pd.read_csv(path, dtype=str)
    frame.loc[0, "Edema"] = "-1.0"
    frame.to_csv(path, index=False)
    evaluation = labels_check(tiny_copy, tmp_path / "out", "chexlocalize.test")
    assert not evaluation.passed
    assert "uncertain_labels: expected 0, found 1" in evaluation.description
    assert "consensus" in _metadata_text(evaluation, "probably_missing")


def test_a_missing_or_renamed_pathology_key_fails_naming_the_json(tiny_copy, tmp_path):
    path = tiny_copy / "chexlocalize" / "CheXlocalize" / "gt_segmentations_test.json"
    entries = json.loads(path.read_text())
    first, second = list(entries)[:2]
    del entries[first]["Edema"]
    entries[second]["Lung Opacity"] = entries[second].pop("Airspace Opacity")
    path.write_text(json.dumps(entries))
    evaluation = labels_check(tiny_copy, tmp_path / "out", "chexlocalize.test")
    assert not evaluation.passed
    assert "entries_without_the_10_pathologies: expected 0, found 2" in evaluation.description
    hint = _metadata_text(evaluation, "probably_missing")
    assert "gt_segmentations_test.json" in hint and "renamed" in hint


# --- MS-CXR view positions --------------------------------------------------------------------


def _views(open_tiny, root) -> pd.DataFrame:
    source = open_tiny("ms_cxr", root=root)
    return pd.concat(source.read_split(s).index for s in source.splits)


def _header_view(path) -> str:
    return str(pydicom.dcmread(path, stop_before_pixels=True).ViewPosition)


def test_view_positions_come_from_the_metadata_csv(tiny_copy, open_tiny):
    path = tiny_copy / "mimic-cxr" / METADATA_CSV
    rows = list(csv.reader(io.StringIO(gzip.decompress(path.read_bytes()).decode())))
    header, first = rows[0], rows[1]
    first[header.index("ViewPosition")] = "LL"
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerows(rows)
    path.write_bytes(gzip.compress(buffer.getvalue().encode()))
    index = _views(open_tiny, tiny_copy).set_index("image_id")
    row = index.loc[f"ms_cxr/{first[0]}"]
    assert row["view_position"] == "LL" and row["view_position_raw"] == "LL"
    listed = {f"ms_cxr/{r[0]}" for r in rows[1:]}
    assert index.loc[sorted(listed), "view_position"].isin(["PA", "AP", "LL"]).all()


def test_view_positions_of_dicoms_come_from_their_headers_without_pixels(
    tiny_copy, open_tiny, monkeypatch
):
    (tiny_copy / "mimic-cxr" / METADATA_CSV).unlink()
    calls = []
    read = pydicom.dcmread

    def recording(*args, **kwargs):
        calls.append(kwargs)
        return read(*args, **kwargs)

    # mimic_views imports pydicom on first use, and reads dcmread from the module then.
    monkeypatch.setattr(pydicom, "dcmread", recording)
    index = _views(open_tiny, tiny_copy)
    files = tiny_copy / "mimic-cxr" / "files"
    dicoms = index[index["image_format"] == "dcm"]
    assert len(dicoms) and len(calls) == len(dicoms)
    assert all(c["stop_before_pixels"] and c["specific_tags"] for c in calls)
    for row in dicoms.itertuples():
        assert row.view_position_raw == _header_view(files / row.image_path)
        assert row.view_position in ("PA", "AP")
    jpgs = index[index["image_format"] == "jpg"]
    assert len(jpgs) and (jpgs["view_position"] == "UNKNOWN").all()
    assert jpgs["view_position_raw"].isna().all()


def test_with_the_csv_present_unlisted_dicoms_still_read_their_header(tiny_root, open_tiny):
    index = _views(open_tiny, tiny_root)
    dicoms = index[index["image_format"] == "dcm"]
    files = tiny_root / "mimic-cxr" / "files"
    assert len(dicoms)
    for row in dicoms.itertuples():
        assert row.view_position_raw == _header_view(files / row.image_path)
    assert (index["view_position"] != "UNKNOWN").all()


# --- MS-CXR parallel lists ----------------------------------------------------------------------


def test_two_boxes_of_one_category_keep_two_phrases_in_box_order(tiny_copy, open_tiny):
    path = tiny_copy / "ms-cxr" / CSV_NAME
    frame = pd.read_csv(path, dtype=str)
    single = frame.groupby("dicom_id").filter(lambda g: len(g) == 1)
    row = single[single["split"] == "train"].iloc[0]
    second = row.copy()
    second["label_text"] = "A second finding of the same category"
    second["x"] = str(int(row["x"]) + 1)
    duplicate = row.copy()  # the same phrase again, for a third box
    duplicate["y"] = str(int(row["y"]) + 1)
    frame = pd.concat([frame, pd.DataFrame([second, duplicate])], ignore_index=True)
    frame.to_csv(path, index=False)
    source = open_tiny("ms_cxr", root=tiny_copy)
    image_id = f"ms_cxr/{row['dicom_id']}"
    labels = source.read_split("train").labels.set_index("image_id").loc[image_id]
    expected = [row["label_text"], second["label_text"], row["label_text"]]
    assert list(labels["label_text"]) == expected and labels["num_boxes"] == 3
    boxes = source.read_boxes("train")
    mine = boxes[boxes["image_id"] == image_id].sort_values("box_index")
    assert mine["label_text"].tolist() == expected
    assert mine["label"].nunique() == 1 and np.array_equal(mine["box_index"], [0, 1, 2])


@pytest.mark.build
def test_a_failed_count_check_in_the_step_blocks_downstream_stages(tiny_copy, tmp_path):
    """The check runs inside raw_index/labels' step, yet still gates masks, bboxes and images
    as a blocking ERROR, and shows as its own evaluation next to the other in-step checks."""
    path = tiny_copy / "chexlocalize" / "CheXpert" / "test_labels.csv"
    frame = pd.read_csv(path, dtype=str)
    frame.loc[0, "Edema"] = "-1.0"
    frame.to_csv(path, index=False)
    result, _ = materialize_corpus(tiny_copy, tmp_path / "out", ["chexlocalize.test"])
    run = result["chexlocalize.test"]
    assert not run.success
    evaluations = check_evaluations(run)
    counts = evaluations["counts_match_documentation"]
    assert not counts.passed and counts.severity == dg.AssetCheckSeverity.ERROR
    assert evaluations["raw_index_suite"].passed and evaluations["labels_suite"].passed
    materialized = {
        e.materialization.asset_key.to_user_string() for e in run.get_asset_materialization_events()
    }
    assert materialized == {"raw_index", "labels"}
    assert not (tmp_path / "out" / "tables" / "masks" / "chexlocalize.test.parquet").exists()


def test_the_card_figures_in_the_check_description_come_from_the_documented_counts():
    documented = ChestXDetSource.documented_counts
    text = card_figures(documented)
    for figure in ("2,006 multi-class", "1,357 with pixel overlap", "IoU 0.272", "22.1 %"):
        assert figure in text
    assert "consolidation+pleural_effusion 770 of 1,028" in text
    assert "42 RGBA source PNGs (37 train / 5 test)" in text
    (spec,) = dataset_figures_match_documentation.check_specs
    assert text in spec.description
    # A figure changed where it is declared changes what the description says.
    changed = dataclasses.replace(
        documented, total={**documented.total, "overlap.multi_class_images": 2007}
    )
    assert "2,007 multi-class" in card_figures(changed)
