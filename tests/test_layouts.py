"""The layouts real downloads unpack to give the same rows as the canonical layout; a wrong
path names what is there and the setting to change."""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pytest

from radharmony_pipeline.sources import DatasetLayoutError, open_source
from radharmony_pipeline.sources.ms_cxr import CSV_NAME


def rows(source, split: str) -> pd.DataFrame:
    """What a layout must not change: the rows, their paths and their status."""
    index = source.read_split(split).index
    return index[["image_id", "image_path", "status", "view_position"]].reset_index(drop=True)


def canonical(tiny_root: Path, dataset: str, split: str) -> pd.DataFrame:
    return rows(open_source(dataset, environ={"RADHARMONY_DATA_ROOT": str(tiny_root)}), split)


def assert_same_rows(source, tiny_root: Path, split: str) -> None:
    pd.testing.assert_frame_equal(rows(source, split), canonical(tiny_root, source.key, split))


def test_chestx_det_zips_unpacked_to_split_data_folders(tiny_root, tmp_path):
    root = tmp_path / "ChestX-Det"
    root.mkdir()
    for split in ("train", "test"):
        shutil.copy(tiny_root / "chestx-det" / f"ChestX_Det_{split}.json", root)
        shutil.copytree(tiny_root / "chestx-det" / split, root / f"{split}_data" / split)
    source = open_source("chestx_det", environ={"RADHARMONY_CHESTX_DET_ROOT": str(root)})
    for split in ("train", "test"):
        assert source.image_dir(split) == root / f"{split}_data" / split
        assert_same_rows(source, tiny_root, split)
    assert any("train_data" in note for note in source.layout_notes())


@pytest.mark.parametrize("given", ["parent", "files"])
def test_mimic_root_as_parent_of_files_or_files_itself(tiny_root, given):
    mimic = tiny_root / "mimic-cxr"
    folder = mimic if given == "parent" else mimic / "files"
    environ = {"RADHARMONY_DATA_ROOT": str(tiny_root), "RADHARMONY_MIMIC_FILES_DIR": str(folder)}
    source = open_source("ms_cxr", environ=environ)
    assert source.image_dir("train") == mimic / "files"
    assert_same_rows(source, tiny_root, "train")
    assert bool(source.layout_notes()) == (given == "parent")


def test_physionet_wget_trees_under_the_data_root(tiny_root, tmp_path):
    """`wget -r` of MIMIC-CXR-JPG and MS-CXR writes physionet.org/files/<project>/<version>/."""
    files = tmp_path / "physionet.org" / "files"
    shutil.copytree(tiny_root / "mimic-cxr", files / "mimic-cxr-jpg" / "2.1.0")
    (files / "mimic-cxr-jpg" / "2.0.0").mkdir()  # an older release beside it: the newest wins
    shutil.copytree(tiny_root / "ms-cxr", files / "ms-cxr" / "1.1.0")
    source = open_source("ms_cxr", environ={"RADHARMONY_DATA_ROOT": str(tmp_path)})
    assert source.image_dir("val") == files / "mimic-cxr-jpg" / "2.1.0" / "files"
    assert source.csv_path() == files / "ms-cxr" / "1.1.0" / CSV_NAME
    for split in ("train", "val", "test"):
        assert_same_rows(source, tiny_root, split)


def test_mimic_variable_naming_the_physionet_folder(tiny_root, tmp_path):
    release = tmp_path / "physionet.org" / "files" / "mimic-cxr-jpg" / "2.0.0"
    shutil.copytree(tiny_root / "mimic-cxr", release)
    environ = {
        "RADHARMONY_DATA_ROOT": str(tiny_root),
        "RADHARMONY_MIMIC_FILES_DIR": str(tmp_path / "physionet.org"),
    }
    source = open_source("ms_cxr", environ=environ)
    assert source.image_dir("test") == release / "files"
    assert_same_rows(source, tiny_root, "test")


@pytest.mark.parametrize("release", ["v1.1.0", "v1.0.0"])
def test_ms_cxr_csv_variable_naming_its_folder(tiny_root, tmp_path, release):
    folder = tmp_path / "ms-cxr-download"
    folder.mkdir()
    shutil.copy(tiny_root / "ms-cxr" / CSV_NAME, folder / f"MS_CXR_Local_Alignment_{release}.csv")
    environ = {"RADHARMONY_DATA_ROOT": str(tiny_root), "RADHARMONY_MS_CXR_CSV": str(folder)}
    source = open_source("ms_cxr", environ=environ)
    assert source.csv_path() == folder / f"MS_CXR_Local_Alignment_{release}.csv"
    assert_same_rows(source, tiny_root, "train")


def test_rexgradient_root_given_as_deid_png(tiny_root):
    environ = {"RADHARMONY_REXGRADIENT_ROOT": str(tiny_root / "rexgradient" / "deid_png")}
    source = open_source("rexgradient", environ=environ)
    assert source.root == tiny_root / "rexgradient"
    for split in ("train", "val", "test"):
        assert_same_rows(source, tiny_root, split)
    assert source.layout_notes()


def test_rexgradient_hf_download_folder_with_deid_png_beside_it(tiny_root, tmp_path):
    """`hf download --local-dir X/download` puts metadata/ in download/; the PNGs beside it."""
    shutil.copytree(tiny_root / "rexgradient" / "deid_png", tmp_path / "deid_png")
    shutil.copytree(
        tiny_root / "rexgradient" / "download" / "metadata", tmp_path / "download" / "metadata"
    )
    (tmp_path / "download" / ".cache" / "huggingface").mkdir(parents=True)
    environ = {"RADHARMONY_REXGRADIENT_ROOT": str(tmp_path / "download")}
    source = open_source("rexgradient", environ=environ)
    assert source.image_dir("val") == tmp_path / "deid_png"
    assert_same_rows(source, tiny_root, "val")


def test_rexgradient_metadata_beside_deid_png_with_the_root_given(tiny_root, tmp_path):
    root = tmp_path / "ReXGradient-160K"
    shutil.copytree(tiny_root / "rexgradient" / "deid_png", root / "deid_png")
    shutil.copytree(tiny_root / "rexgradient" / "download" / "metadata", root / "metadata")
    source = open_source("rexgradient", environ={"RADHARMONY_REXGRADIENT_ROOT": str(root)})
    assert_same_rows(source, tiny_root, "test")


def test_chexlocalize_root_given_as_its_chexpert_folder(tiny_root):
    chexpert = tiny_root / "chexlocalize" / "CheXpert"
    source = open_source("chexlocalize", environ={"RADHARMONY_CHEXLOCALIZE_ROOT": str(chexpert)})
    assert source.root == tiny_root / "chexlocalize"
    for split in ("val", "test"):
        assert_same_rows(source, tiny_root, split)


def test_chexpert_v1_prefixes_and_valid_folder(tiny_root, tmp_path):
    """CheXpert's own names: `CheXpert-v1.0/valid/...` in Path, images in `valid/`."""
    root = tmp_path / "chexlocalize"
    shutil.copytree(tiny_root / "chexlocalize", root)
    chexpert = root / "CheXpert"
    (chexpert / "val").rename(chexpert / "valid")
    labels = pd.read_csv(chexpert / "val_labels.csv")
    labels["Path"] = "CheXpert-v1.0/valid/" + labels["Path"].str.split("/", n=1).str[1]
    labels.to_csv(chexpert / "val_labels.csv", index=False)
    source = open_source("chexlocalize", environ={"RADHARMONY_CHEXLOCALIZE_ROOT": str(root)})
    assert source.image_dir("val") == chexpert / "valid"
    assert_same_rows(source, tiny_root, "val")


def test_home_and_variables_are_expanded(tiny_root, tmp_path):
    home = tmp_path / "home"
    shutil.copytree(tiny_root / "chestx-det", home / "data" / "chestx-det")
    environ = {"HOME": str(home), "RADHARMONY_CHESTX_DET_ROOT": "~/data/chestx-det"}
    assert_same_rows(open_source("chestx_det", environ=environ), tiny_root, "test")
    environ = {"CXR": str(home / "data"), "RADHARMONY_DATA_ROOT": "${CXR}"}
    assert open_source("chestx_det", environ=environ).root == home / "data" / "chestx-det"
    environ = {"CXR": str(home / "data"), "RADHARMONY_CHESTX_DET_ROOT": "$CXR/chestx-det"}
    assert_same_rows(open_source("chestx_det", environ=environ), tiny_root, "train")


def test_a_root_one_level_too_high_names_what_is_there_and_the_setting(tiny_root):
    source = open_source("chestx_det", environ={"RADHARMONY_CHESTX_DET_ROOT": str(tiny_root)})
    with pytest.raises(DatasetLayoutError) as raised:
        source.read_split("train")
    message = str(raised.value)
    assert f"{tiny_root} holds:" in message and "chestx-det/" in message
    assert "RADHARMONY_CHESTX_DET_ROOT" in message


def test_a_missing_mimic_folder_names_the_folders_nearby(tiny_root, tmp_path):
    environ = {
        "RADHARMONY_DATA_ROOT": str(tiny_root),
        "RADHARMONY_MIMIC_FILES_DIR": str(tiny_root / "mimic-cxr" / "file"),
    }
    with pytest.raises(DatasetLayoutError) as raised:
        open_source("ms_cxr", environ=environ).read_split("val")
    message = str(raised.value)
    assert "files/" in message and "RADHARMONY_MIMIC_FILES_DIR" in message
