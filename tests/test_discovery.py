"""Where datasets are found: resource config (seed-page arguments), env overrides, data root."""

from __future__ import annotations

import shutil

from radharmony_pipeline.defs.resources import DatasetsResource, SourceLocationConfig
from radharmony_pipeline.sources import SourceLocation, open_source
from radharmony_pipeline.sources.ms_cxr import CSV_NAME


def test_data_root_default_layout(tiny_root):
    source = open_source("chestx_det", environ={"RADHARMONY_DATA_ROOT": str(tiny_root)})
    assert source.image_dir("train") == tiny_root / "chestx-det" / "train"


def test_per_dataset_env_vars_override_the_data_root(tiny_root, tmp_path):
    moved = tmp_path / "elsewhere" / "ChestX-Det"
    shutil.copytree(tiny_root / "chestx-det", moved)
    environ = {
        "RADHARMONY_DATA_ROOT": str(tmp_path / "empty"),
        "RADHARMONY_CHESTX_DET_ROOT": str(moved),
    }
    assert len(open_source("chestx_det", environ=environ).read_split("test").index) > 0

    mimic = tmp_path / "MIMIC-CXR-JPG" / "files"
    shutil.copytree(tiny_root / "mimic-cxr" / "files", mimic)
    csv = tmp_path / "downloads" / "ms_cxr.csv"
    csv.parent.mkdir()
    shutil.copy(tiny_root / "ms-cxr" / CSV_NAME, csv)
    environ = {"RADHARMONY_MS_CXR_CSV": str(csv), "RADHARMONY_MIMIC_FILES_DIR": str(mimic)}
    source = open_source("ms_cxr", environ=environ)
    assert source.image_dir("val") == mimic
    assert len(source.read_split("val").index) > 0


def test_explicit_location_beats_env_vars(tiny_root, tmp_path):
    environ = {"RADHARMONY_CHESTX_DET_ROOT": str(tmp_path / "wrong")}
    location = SourceLocation(root=tiny_root / "chestx-det")
    source = open_source("chestx_det", location, environ)
    assert source.root == tiny_root / "chestx-det"


def test_chexlocalize_base_image_dir_discovers_csv_and_segmentations(tiny_root):
    base = tiny_root / "chexlocalize" / "CheXpert" / "test"
    source = open_source("chexlocalize", SourceLocation(base_image_dir=base), {})
    assert source.labels_csv("test") == base.parent / "test_labels.csv"
    assert source.segmentation_json("test") == (
        tiny_root / "chexlocalize" / "CheXlocalize" / "gt_segmentations_test.json"
    )
    assert source.root == tiny_root / "chexlocalize"
    assert len(source.read_split("test").index) > 0


def test_chexlocalize_explicit_files_apply_to_the_split_they_name(tiny_root, tmp_path):
    csv = tmp_path / "test_labels.csv"
    shutil.copy(tiny_root / "chexlocalize" / "CheXpert" / "test_labels.csv", csv)
    location = SourceLocation(root=tiny_root / "chexlocalize", csv_path=csv)
    source = open_source("chexlocalize", location, {})
    assert source.labels_csv("test") == csv
    assert source.labels_csv("val") == tiny_root / "chexlocalize" / "CheXpert" / "val_labels.csv"


def test_rexgradient_base_image_dir_discovers_metadata(tiny_root):
    base = tiny_root / "rexgradient" / "deid_png"
    source = open_source("rexgradient", SourceLocation(base_image_dir=base), {})
    assert source.metadata_json("val") == (
        tiny_root / "rexgradient" / "download" / "metadata" / "valid_metadata_view_position.json"
    )
    assert len(source.read_split("val").index) > 0


def test_rexgradient_metadata_folder_beside_the_images(tiny_root, tmp_path):
    root = tmp_path / "ReXGradient-160K"
    shutil.copytree(tiny_root / "rexgradient" / "deid_png", root / "deid_png")
    shutil.copytree(tiny_root / "rexgradient" / "download" / "metadata", root / "metadata")
    source = open_source("rexgradient", SourceLocation(base_image_dir=root / "deid_png"), {})
    assert source.metadata_json("test") == root / "metadata" / "test_metadata_view_position.json"


def test_resource_config_uses_seed_page_argument_names(tiny_root):
    resource = DatasetsResource(
        data_root="/nonexistent",
        chexlocalize=SourceLocationConfig(
            base_image_dir=str(tiny_root / "chexlocalize" / "CheXpert" / "val")
        ),
    )
    source = resource.source("chexlocalize")
    assert source.image_dir("val") == tiny_root / "chexlocalize" / "CheXpert" / "val"
    assert resource.source("chestx_det").root.as_posix() == "/nonexistent/chestx-det"
