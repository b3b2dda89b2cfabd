"""Bad input fails with a message naming the file, the row or entry, and the fix."""

from __future__ import annotations

import json
import shutil

import pandas as pd
import pytest

from radharmony_pipeline.sources import DatasetLayoutError, MetadataError
from radharmony_pipeline.sources.ms_cxr import CSV_NAME

METADATA = ("rexgradient", "download", "metadata")


@pytest.mark.parametrize(
    ("dataset", "split", "env_var", "layout_hint"),
    [
        ("chexlocalize", "test", "RADHARMONY_CHEXLOCALIZE_ROOT", "gt_segmentations_test.json"),
        ("ms_cxr", "train", "RADHARMONY_MS_CXR_CSV", CSV_NAME),
        ("chestx_det", "train", "RADHARMONY_CHESTX_DET_ROOT", "ChestX_Det_train.json"),
        ("rexgradient", "val", "RADHARMONY_REXGRADIENT_ROOT", "valid_metadata_view_position.json"),
    ],
)
def test_missing_root_names_path_env_var_and_layout(
    open_tiny, tmp_path, dataset, split, env_var, layout_hint
):
    with pytest.raises(DatasetLayoutError) as caught:
        open_tiny(dataset, root=tmp_path / "nowhere").read_split(split)
    message = str(caught.value)
    assert str(tmp_path / "nowhere") in message
    assert env_var in message and "RADHARMONY_DATA_ROOT" in message
    assert layout_hint in message


def test_missing_required_file_names_it(tiny_copy, open_tiny):
    segmentation = tiny_copy / "chexlocalize" / "CheXlocalize" / "gt_segmentations_val.json"
    segmentation.unlink()
    with pytest.raises(DatasetLayoutError, match=r"gt_segmentations_val\.json"):
        open_tiny("chexlocalize", root=tiny_copy).read_split("val")


def test_mimic_folder_missing_names_its_env_var(tiny_copy, open_tiny):
    shutil.rmtree(tiny_copy / "mimic-cxr")
    with pytest.raises(DatasetLayoutError, match="RADHARMONY_MIMIC_FILES_DIR"):
        open_tiny("ms_cxr", root=tiny_copy).read_split("test")


def test_rexgradient_csv_instead_of_json_names_the_json(open_tiny, tiny_root):
    csv_path = tiny_root.joinpath(*METADATA, "train_metadata.csv")
    assert csv_path.exists()
    with pytest.raises(MetadataError) as caught:
        open_tiny("rexgradient", csv_path=csv_path).read_split("train")
    assert "train_metadata_view_position.json" in str(caught.value)
    assert str(csv_path) in str(caught.value)


def test_rexgradient_only_csv_downloaded_names_the_json(tiny_copy, open_tiny):
    tiny_copy.joinpath(*METADATA, "test_metadata_view_position.json").unlink()
    with pytest.raises(DatasetLayoutError) as caught:
        open_tiny("rexgradient", root=tiny_copy).read_split("test")
    assert "test_metadata_view_position.json" in str(caught.value)
    assert "test_metadata.csv" in str(caught.value)


def test_csv_missing_a_required_column_names_it(tiny_copy, open_tiny):
    path = tiny_copy / "ms-cxr" / CSV_NAME
    pd.read_csv(path).drop(columns=["image_height"]).to_csv(path, index=False)
    with pytest.raises(MetadataError) as caught:
        open_tiny("ms_cxr", root=tiny_copy).read_split("train")
    assert "image_height" in str(caught.value) and str(path) in str(caught.value)

    labels = tiny_copy / "chexlocalize" / "CheXpert" / "test_labels.csv"
    pd.read_csv(labels).drop(columns=["Edema"]).to_csv(labels, index=False)
    with pytest.raises(MetadataError, match="Edema"):
        open_tiny("chexlocalize", root=tiny_copy).read_split("test")


def test_malformed_json_names_file_line_and_column(tiny_copy, open_tiny):
    path = tiny_copy / "chestx-det" / "ChestX_Det_test.json"
    text = path.read_text()
    path.write_text(text[: len(text) // 2])
    with pytest.raises(MetadataError) as caught:
        open_tiny("chestx_det", root=tiny_copy).read_split("test")
    assert str(path) in str(caught.value) and "line 1 column" in str(caught.value)


def error_of(tables, image_id_part: str) -> str:
    """The error of the one error row, after checking both tables agree on it."""
    assert list(tables.index.columns[-2:]) == ["status", "error"]
    assert {"status", "error"} <= set(tables.labels.columns)
    bad = tables.index[tables.index["status"] == "error"]
    assert len(bad) == 1 and image_id_part in bad["image_id"].iloc[0]
    assert tables.labels.loc[bad.index, "error"].tolist() == bad["error"].tolist()
    return bad["error"].iloc[0]


def test_malformed_entries_become_error_rows_naming_file_entry_and_field(tiny_copy, open_tiny):
    path = tiny_copy / "chestx-det" / "ChestX_Det_train.json"
    entries = json.loads(path.read_text())
    victim = next(i for i, e in enumerate(entries) if e["syms"])
    entries[victim]["boxes"] = entries[victim]["boxes"][:-1]
    path.write_text(json.dumps(entries))
    tables = open_tiny("chestx_det", root=tiny_copy).read_split("train")
    message = error_of(tables, entries[victim]["file_name"].removesuffix(".png"))
    assert message.startswith(f"{path}: entry {victim} ({entries[victim]['file_name']})")
    assert "'syms/boxes/polygons'" in message
    assert len(tables.index) == len(entries)

    rex = tiny_copy.joinpath(*METADATA, "valid_metadata_view_position.json")
    studies = json.loads(rex.read_text())
    key = next(iter(studies))
    del studies[key]["ImagePath"]
    rex.write_text(json.dumps(studies))
    tables = open_tiny("rexgradient", root=tiny_copy).read_split("val")
    assert error_of(tables, key).startswith(f"{rex}: entry '{key}': field 'ImagePath'")


def test_chestx_det10_json_is_recognized(tiny_copy, open_tiny):
    path = tiny_copy / "chestx-det" / "ChestX_Det_test.json"
    entries = json.loads(path.read_text())
    for entry in entries:
        del entry["polygons"]
    path.write_text(json.dumps(entries))
    with pytest.raises(MetadataError, match="ChestX-Det10"):
        open_tiny("chestx_det", root=tiny_copy).read_split("test")


def test_paths_escaping_the_image_folder_are_error_rows(tiny_copy, open_tiny):
    path = tiny_copy / "chexlocalize" / "CheXpert" / "test_labels.csv"
    table = pd.read_csv(path)
    table.loc[2, "Path"] = "test/../../secrets/patient1/study1/view1_frontal.jpg"
    table.to_csv(path, index=False)
    tables = open_tiny("chexlocalize", root=tiny_copy).read_split("test")
    bad = tables.index[tables.index["status"] == "error"]
    assert bad.index.tolist() == [2] and bad["image_path"].isna().all()
    assert bad["error"].iloc[0].startswith(f"{path}: row 4: field 'Path'")
    assert "outside the image folder" in bad["error"].iloc[0]

    rex = tiny_copy.joinpath(*METADATA, "train_metadata_view_position.json")
    studies = json.loads(rex.read_text())
    key = next(iter(studies))
    studies[key]["ImagePath"][0] = "../deid_png/../../etc/passwd.png"
    rex.write_text(json.dumps(studies))
    tables = open_tiny("rexgradient", root=tiny_copy).read_split("train")
    message = error_of(tables, "passwd")
    assert f"entry '{key}': field 'ImagePath'" in message and "outside the image folder" in message


def test_bad_label_value_is_an_error_row_naming_row_and_column(tiny_copy, open_tiny):
    path = tiny_copy / "chexlocalize" / "CheXpert" / "test_labels.csv"
    table = pd.read_csv(path)
    table["Cardiomegaly"] = table["Cardiomegaly"].astype(object)
    table.loc[0, "Cardiomegaly"] = "yes"
    table.to_csv(path, index=False)
    tables = open_tiny("chexlocalize", root=tiny_copy).read_split("test")
    assert tables.index["status"].tolist()[:2] == ["error", "ok"]
    assert tables.index["error"].iloc[0] == (
        f"{path}: row 2: field 'Cardiomegaly': label value 'yes' is not 0, 1, -1 or blank"
    )
    assert tables.labels["cardiomegaly"].isna().iloc[0]


def test_unknown_ms_cxr_category_names_the_row(tiny_copy, open_tiny):
    path = tiny_copy / "ms-cxr" / CSV_NAME
    table = pd.read_csv(path)
    table.loc[3, "category_name"] = "Hernia"
    table.to_csv(path, index=False)
    with pytest.raises(MetadataError, match=r"row 5.*Hernia"):
        open_tiny("ms_cxr", root=tiny_copy).read_split("train")
