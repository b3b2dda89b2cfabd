"""Provenance to the parent datasets on tiny synthetic data with planted ground truth: ChestX-Det
found in a miniature NIH ChestX-ray14, MS-CXR against MIMIC-CXR's split file, the leak checks'
exact counts, "parent not configured" without the parents, and the loader's options."""

from __future__ import annotations

import gzip

import dagster as dg
import numpy as np
import pandas as pd
import pytest
from corpus import check_evaluations, materialize_stages_then_joins

from radharmony_pipeline.defs.checks.parents import _result
from radharmony_pipeline.defs.resources import DatasetsResource
from radharmony_pipeline.defs.run_settings import RunSettingsResource
from radharmony_pipeline.loader import ManifestDataset
from radharmony_pipeline.processing.corpus.parent_fingerprints import (
    fingerprint_parent_images,
    parent_image_jobs,
)
from radharmony_pipeline.processing.corpus.parents import (
    PARENT_MATCH_RADIUS,
    ParentLeaks,
    match_to_parents,
    patient_disjoint_by_parent,
)
from radharmony_pipeline.processing.imaging.perceptual_hash import hamming, hashes_to_words
from radharmony_pipeline.processing.storage import output_layout as layout
from radharmony_pipeline.processing.storage.source_store import tree_states
from radharmony_pipeline.sources import MetadataError, SourceLocation, open_source
from radharmony_pipeline.sources.errors import DatasetLayoutError
from radharmony_pipeline.sources.nih_chestxray14 import NihChestXray14
from radharmony_pipeline.synthetic import generate_datasets
from radharmony_pipeline.synthetic.duplicates import DEMO_DUPLICATES
from radharmony_pipeline.synthetic.encoding import png_bytes
from radharmony_pipeline.synthetic.parents import read_parents_truth
from radharmony_pipeline.synthetic.radiograph import render_radiograph, to_uint8

DATASETS = ("chestx_det", "ms_cxr")
PARTITIONS = ("chestx_det.train", "chestx_det.test", "ms_cxr.train", "ms_cxr.val", "ms_cxr.test")
# The demo's ChestX-Det plants: a byte copy inside train, a shifted copy across train/test and
# a re-encoded copy inside test (so matching must tell twins apart).
PLANTS = tuple(p for p in DEMO_DUPLICATES if p.source.startswith("chestx_det"))
CHECKS = {
    "eval_images_in_parent_train_split": "eval_images_in_parent_train",
    "eval_patients_in_parent_train_split": "eval_patients_in_parent_train",
    "train_images_in_parent_test_split": "train_images_in_parent_test",
    "chestx_det_patients_across_splits": "chestx_det_patients_across_splits",
}


def _built(tmp_path_factory, parents: bool):
    data = tmp_path_factory.mktemp("parents") / "data"
    generate_datasets(
        data, scale="tiny", seed=7, datasets=DATASETS, duplicates=PLANTS, parents=parents
    )
    output = tmp_path_factory.mktemp("parents_out")
    joined = materialize_stages_then_joins(data, output, PARTITIONS)
    checks = check_evaluations(joined)
    return data, output, joined, checks


@pytest.fixture(scope="module")
def parented(tmp_path_factory):
    """Tiny ChestX-Det and MS-CXR with the miniature NIH and MIMIC's split file, all built."""
    return _built(tmp_path_factory, parents=True)


@pytest.fixture(scope="module")
def unparented(tmp_path_factory):
    """The same datasets without any parent file."""
    return _built(tmp_path_factory, parents=False)


def _table(output, name):
    return pd.read_parquet(layout.table_file(output, name))


@pytest.mark.build
def test_every_planted_nih_link_recovered_none_invented(parented):
    data, output, joined, _ = parented
    assert joined.success
    truth = read_parents_truth(data)["nih"]
    links = _table(output, "nih_parent_links").set_index("image_id")
    assert set(links.index) == set(truth["links"])
    for image_id, expected in truth["links"].items():
        row = links.loc[image_id]
        if expected is None:
            assert row["match"] == "unmatched" and pd.isna(row["parent_image_id"]), image_id
        else:
            assert row["parent_image_id"] == expected, image_id
            assert row["match"] == truth["kinds"][image_id], image_id
    # Re-encoded ones are included: both kinds were planted and found.
    kinds = links["match"].value_counts().to_dict()
    assert kinds.get("near", 0) >= 1 and kinds.get("identical_pixels", 0) >= 1
    assert kinds.get("unmatched", 0) == sum(v is None for v in truth["links"].values())
    assert "ambiguous" not in kinds
    # The byte copy planted inside ChestX-Det train: two children, one NIH original, said so.
    shared = links[links["shared_parent"]]
    assert len(shared) == 2 and shared["parent_image_id"].nunique() == 1
    # NIH films of other patients or other films of ChestX-Det patients are never matched.
    assert not set(truth["distractors"]) & set(links["parent_image_id"].dropna())


@pytest.mark.build
def test_parent_columns_on_raw_index_and_manifest(parented):
    data, output, _, _ = parented
    truth = read_parents_truth(data)
    manifest = _table(output, "unified_manifest").set_index("image_id")
    det = manifest[manifest["dataset"] == "chestx_det"]
    assert (det["parent_dataset"] == "nih_chestxray14").all()
    for image_id, row in det.iterrows():
        expected = truth["nih"]["links"][image_id]
        if expected is None:
            assert pd.isna(row["parent_image_id"]) and pd.isna(row["parent_split"])
        else:
            image = truth["nih"]["images"][expected]
            assert row["parent_image_id"] == expected
            assert row["parent_patient_id"] == image["patient"]
            assert row["parent_split"] == image["split"]
    mimic = manifest[manifest["dataset"] == "ms_cxr"]
    assert (mimic["parent_dataset"] == "mimic_cxr").all()
    for image_id, row in mimic.iterrows():
        dicom = image_id.removeprefix("ms_cxr/")
        assert row["parent_image_id"] == dicom
        assert row["parent_patient_id"] == truth["mimic"]["subjects"][dicom]
        expected = truth["mimic"]["splits"].get(dicom)
        assert (pd.isna(row["parent_split"]) and expected is None) or row[
            "parent_split"
        ] == expected
    raw = pd.read_parquet(layout.table_file(output, "raw_index", "ms_cxr.test"))
    assert raw["parent_split"].notna().all() and (raw["parent_dataset"] == "mimic_cxr").all()
    raw_det = pd.read_parquet(layout.table_file(output, "raw_index", "chestx_det.test"))
    # The file names are opaque: the NIH image is only known from content, downstream.
    assert raw_det["parent_image_id"].isna().all()


@pytest.mark.build
def test_checks_find_planted_leaks_with_exact_counts(parented):
    data, _, _, checks = parented
    truth = read_parents_truth(data)
    expected = truth["expected"]
    for check_name, truth_key in CHECKS.items():
        evaluation = checks[check_name]
        wanted = expected[truth_key]
        assert wanted, truth_key  # every kind of leak was planted
        assert evaluation.metadata["images"].value == len(wanted), check_name
        assert not evaluation.passed
        assert evaluation.severity == dg.AssetCheckSeverity.WARN
        pairs = evaluation.metadata["per_split_pair"].value
        examples = " ".join(evaluation.metadata["examples"].value)
        if truth_key != "chestx_det_patients_across_splits":
            assert sum(pairs.values()) == len(wanted)
            assert all(image_id in examples for image_id in wanted)
        assert evaluation.metadata["hint"].value
        files = evaluation.metadata["parent_files"].value
        assert any(name.endswith("mimic-cxr-2.0.0-split.csv.gz") for name in files)
        assert any(name.endswith("Data_Entry_2017.csv") for name in files)
        assert all(version for version in files.values())
    eval_pairs = checks["eval_images_in_parent_train_split"].metadata["per_split_pair"].value
    nih_test = [i for i in expected["eval_images_in_parent_train"] if i.startswith("chestx_det")]
    assert eval_pairs.get("chestx_det.test ~ nih_chestxray14.train_val") == len(nih_test)
    shared = checks["chestx_det_patients_across_splits"].metadata["per_split_pair"].value
    assert shared == {"chestx_det.test ~ chestx_det.train": expected["chestx_det_shared_patients"]}
    found = checks["chestx_det_images_found_in_nih"]
    unmatched = sum(v is None for v in truth["nih"]["links"].values())
    assert found.metadata["unmatched"].value == unmatched
    assert found.metadata["matched"].value == len(truth["nih"]["links"]) - unmatched
    assert found.metadata["ambiguous"].value == 0


@pytest.mark.build
def test_loader_drops_exactly_the_planted_leaks(parented):
    data, output, _, _ = parented
    expected = read_parents_truth(data)["expected"]
    path = output / layout.MANIFEST
    everything = set(ManifestDataset(path).table["image_id"])

    def dropped(**option):
        return everything - set(ManifestDataset(path, **option).table["image_id"])

    assert dropped(drop_parent_train_leaks=True) == set(expected["eval_images_in_parent_train"])
    assert dropped(drop_parent_patient_leaks=True) == set(expected["eval_patients_in_parent_train"])
    manifest = _table(output, "unified_manifest")
    shared = set(expected["chestx_det_patients_across_splits"])
    test_side = set(
        manifest.loc[manifest["image_id"].isin(shared) & (manifest["split"] == "test"), "image_id"]
    )
    assert test_side and dropped(patient_disjoint_parents=True) == test_side
    kept = ManifestDataset(path, splits="test", patient_disjoint_parents=True)
    assert len(kept) and kept[0]["img"].shape[-1] == 224


@pytest.mark.build
def test_without_parents_columns_are_null_and_checks_say_not_configured(unparented):
    _, output, joined, checks = unparented
    assert joined.success
    manifest = _table(output, "unified_manifest")
    assert manifest["parent_split"].isna().all()
    det = manifest[manifest["dataset"] == "chestx_det"]
    assert det[["parent_image_id", "parent_patient_id"]].isna().all().all()
    assert (manifest.loc[manifest["dataset"] == "ms_cxr", "parent_image_id"].notna()).all()
    for name in (*CHECKS, "chestx_det_images_found_in_nih"):
        evaluation = checks[name]
        assert not evaluation.passed, name  # never a silent pass
        assert "parent not configured" in evaluation.description, name
        assert evaluation.severity == dg.AssetCheckSeverity.WARN
    coverage = checks["eval_images_in_parent_train_split"].metadata["coverage"].value
    assert coverage["ms_cxr"].startswith("parent not configured")
    assert "mimic-cxr-2.0.0-split.csv.gz" in coverage["ms_cxr"]
    assert coverage["chestx_det"].startswith("parent not configured")
    assert "RADHARMONY_NIH_ROOT" in coverage["chestx_det"]


def test_blocking_when_the_setting_asks(monkeypatch, tmp_path):
    leaks = ParentLeaks(["ms_cxr/a"], {"ms_cxr.test ~ mimic_cxr.train": 1}, {"ms_cxr": "checked"})
    resource = DatasetsResource(data_root=str(tmp_path))

    def severity() -> dg.AssetCheckSeverity:
        block = RunSettingsResource().parent_leaks_block()
        return _result(leaks, "hint", resource, block, "x").severity

    monkeypatch.delenv("RADHARMONY_PARENT_LEAKS", raising=False)
    assert severity() == dg.AssetCheckSeverity.WARN
    monkeypatch.setenv("RADHARMONY_PARENT_LEAKS", "block")
    assert severity() == dg.AssetCheckSeverity.ERROR
    monkeypatch.setenv("RADHARMONY_PARENT_LEAKS", "sometimes")
    with pytest.raises(ValueError, match="RADHARMONY_PARENT_LEAKS"):
        severity()


def _radiographs(folder, count, seed):
    for number in range(count):
        pixels = to_uint8(render_radiograph(np.random.default_rng([seed, number]), 384, 384).pixels)
        path = folder / "images" / f"{number:08d}_000.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(png_bytes(pixels))


def test_distinct_radiographs_never_matched(tmp_path):
    _radiographs(tmp_path / "a", 12, seed=1)
    _radiographs(tmp_path / "b", 12, seed=2)
    tables = []
    for name in ("a", "b"):
        root = tmp_path / name
        jobs = parent_image_jobs(root, tree_states(root, (".png",)), 224, "letterbox")
        table, decoded = fingerprint_parent_images(jobs, None, workers=1)
        assert decoded == 12 and (table["status"] == "ok").all()
        tables.append(table)
    children = tables[0].rename(columns={"parent_image_id": "image_id"})
    children["image_id"] = "child/" + children["image_id"]
    links = match_to_parents(children, tables[1])
    assert (links["match"] == "unmatched").all()
    assert links["parent_image_id"].isna().all()
    # The same films match themselves exactly.
    assert (match_to_parents(children, tables[0])["match"] == "identical_file").all()


def test_fingerprints_are_reused_per_image(tmp_path):
    _radiographs(tmp_path, 4, seed=3)
    jobs = parent_image_jobs(tmp_path, tree_states(tmp_path, (".png",)), 64, "letterbox")
    first, decoded = fingerprint_parent_images(jobs, None, workers=1)
    assert decoded == 4
    again, decoded = fingerprint_parent_images(jobs, first, workers=1)
    assert decoded == 0 and again.equals(first)
    changed = tmp_path / "images" / "00000002_000.png"
    changed.write_bytes(png_bytes(np.zeros((64, 64), np.uint8)))
    jobs = parent_image_jobs(tmp_path, tree_states(tmp_path, (".png",)), 64, "letterbox")
    third, decoded = fingerprint_parent_images(jobs, first, workers=1)
    assert decoded == 1
    row = third.set_index("parent_image_id").loc["00000002_000.png"]
    assert (
        row["pixels_sha256"]
        != first.set_index("parent_image_id").loc["00000002_000.png", "pixels_sha256"]
    )


def test_parent_images_are_read_only_inside_the_parent_root(tmp_path):
    root, elsewhere = tmp_path / "nih", tmp_path / "elsewhere"
    _radiographs(root, 2, seed=4)
    _radiographs(elsewhere, 1, seed=5)
    images = root / "images"
    (images / "00000007_000.png").symlink_to(elsewhere / "images" / "00000000_000.png")
    (images / "00000008_000.png").symlink_to("00000001_000.png")  # stays inside: read
    jobs = parent_image_jobs(root, tree_states(root, (".png",)), 64, "letterbox")
    table, decoded = fingerprint_parent_images(jobs, None, workers=1)
    rows = table.set_index("parent_image_id")
    assert decoded == 4
    assert rows.loc["00000007_000.png", "status"] == "error"
    assert "outside the image folder" in rows.loc["00000007_000.png", "error"]
    assert pd.isna(rows.loc["00000007_000.png", "pixels_sha256"])
    assert (rows.drop(index="00000007_000.png")["status"] == "ok").all()
    assert (
        rows.loc["00000008_000.png", "pixels_sha256"]
        == rows.loc["00000001_000.png", "pixels_sha256"]
    )


def test_ambiguous_when_two_parents_hold_the_same_pixels():
    children = pd.DataFrame(
        {
            "image_id": ["c/1"],
            "source_sha256": ["s"],
            "pixels_sha256": ["p"],
            "perceptual_hash": ["0" * 64],
        }
    )
    parents = pd.DataFrame(
        {
            "parent_image_id": ["n1", "n2", "n3"],
            "source_sha256": ["x", "y", "z"],
            "pixels_sha256": ["p", "p", "q"],
            "perceptual_hash": ["0" * 64, "0" * 64, "f" * 64],
        }
    )
    links = match_to_parents(children, parents)
    assert links.loc[0, "match"] == "ambiguous"
    assert pd.isna(links.loc[0, "parent_image_id"])
    assert list(links.loc[0, "candidates"]) == ["n1", "n2"]


def test_near_links_are_every_parent_within_the_radius():
    # Random hashes and copies 0 to 15 bits away, children against parents: each child's
    # link is what comparing it with every parent finds (the search is exact).
    rng = np.random.default_rng(5)
    words = rng.integers(0, 2**64, size=(300, 4), dtype=np.uint64)
    flips = np.zeros((500, 256), dtype=bool)
    for row in range(500):
        flips[row, rng.choice(256, rng.integers(0, 16), replace=False)] = True
    copies = words[rng.integers(0, 300, 500)] ^ np.packbits(flips, axis=1).view(">u8")
    hexes = [row.astype(">u8").tobytes().hex() for row in np.concatenate([words, copies])]
    order = rng.permutation(len(hexes))
    parent_rows, child_rows = order[:500], order[500:]
    parents = pd.DataFrame(
        {
            "parent_image_id": [f"n{i}" for i in parent_rows],
            "source_sha256": [f"s{i}" for i in parent_rows],
            "pixels_sha256": [f"p{i}" for i in parent_rows],
            "perceptual_hash": [hexes[i] for i in parent_rows],
        }
    )
    children = pd.DataFrame(
        {
            "image_id": [f"c{i}" for i in child_rows],
            "source_sha256": [f"cs{i}" for i in child_rows],
            "pixels_sha256": [f"cp{i}" for i in child_rows],
            "perceptual_hash": [hexes[i] for i in child_rows],
        }
    )
    parent_words = hashes_to_words(parents["perceptual_hash"])
    child_words = hashes_to_words(children["perceptual_hash"])
    for radius in (0, 7, PARENT_MATCH_RADIUS, 15):
        links = match_to_parents(children, parents, radius)
        for child, row in zip(child_words, links.itertuples(), strict=True):
            distance = hamming(parent_words, child[None, :])
            close = np.flatnonzero(distance <= radius)
            assert list(row.candidates) == sorted(parents["parent_image_id"].iloc[close])
            if len(close):
                assert row.distance == distance[close].min()
                assert row.match == ("near" if len(close) == 1 else "ambiguous")
            else:
                assert row.match == "unmatched" and pd.isna(row.distance)
        assert (links["match"] == "near").sum() > 10  # the test can fail


def test_patient_disjoint_keeps_train_and_unknown_patients():
    manifest = pd.DataFrame(
        {
            "image_id": ["a", "b", "c", "d", "e"],
            "dataset": ["chestx_det"] * 4 + ["ms_cxr"],
            "split": ["train", "test", "test", "test", "test"],
            "parent_patient_id": pd.array(["1", "1", "2", None, "1"], dtype="string"),
        }
    )
    assert list(patient_disjoint_by_parent(manifest)["image_id"]) == ["a", "c", "d", "e"]


def test_mimic_split_file_errors_name_the_row(tiny_copy):
    mimic = tiny_copy / "mimic-cxr"
    (mimic / "mimic-cxr-2.0.0-split.csv.gz").write_bytes(
        gzip.compress(b"dicom_id,study_id,subject_id,split\nabc,1,2,training\n")
    )
    source = open_source("ms_cxr", SourceLocation(), {"RADHARMONY_DATA_ROOT": str(tiny_copy)})
    index = source.read_split("test").index
    with pytest.raises(MetadataError, match=r"row 2.*'training'"):
        source.parent_identity("test", index)


def test_chexpert_and_rexgradient_identity_from_their_own_ids(tiny_root):
    environ = {"RADHARMONY_DATA_ROOT": str(tiny_root)}
    source = open_source("chexlocalize", SourceLocation(), environ)
    index = source.read_split("val").index
    identity = source.parent_identity("val", index)
    assert (identity["parent_dataset"] == "chexpert").all()
    assert (identity["parent_split"] == "valid").all()
    assert identity["parent_image_id"].str.startswith("valid/patient").all()
    assert list(identity["parent_patient_id"]) == list(index["patient_id"])
    rex = open_source("rexgradient", SourceLocation(), environ)
    index = rex.read_split("test").index
    identity = rex.parent_identity("test", index)
    assert (identity["parent_split"] == "test").all()
    assert list(identity["parent_study_id"]) == list(index["study_id"])
    assert identity["parent_patient_splits"].isna().all()


def test_nih_layout_errors(tmp_path):
    assert NihChestXray14.located(None, tmp_path) is None
    with pytest.raises(DatasetLayoutError, match="RADHARMONY_NIH_ROOT"):
        NihChestXray14.located(tmp_path / "elsewhere", tmp_path)
    root = tmp_path / "nih-chestxray14"
    root.mkdir()
    (root / "Data_Entry_2017.csv").write_text(
        "Image Index,Finding Labels,Follow-up #,Patient ID\n00000001_000.png,No Finding,0,1\n"
    )
    nih = NihChestXray14.located(None, tmp_path)
    with pytest.raises(DatasetLayoutError, match=r"train_val_list\.txt"):
        nih.read_entries()
    (root / "train_val_list.txt").write_text("00000001_000.png\n")
    (root / "test_list.txt").write_text("00000001_000.png\n")
    with pytest.raises(MetadataError, match="both"):
        nih.read_entries()
    (root / "test_list.txt").write_text("")
    entries = nih.read_entries()
    assert entries.loc[0, "split"] == "train_val" and entries.loc[0, "patient_id"] == "1"


def test_nih_root_setting_and_data_root_default(tmp_path, monkeypatch):
    monkeypatch.delenv("RADHARMONY_NIH_ROOT", raising=False)
    assert DatasetsResource(data_root=str(tmp_path)).nih() is None
    elsewhere = tmp_path / "downloads" / "nih"
    elsewhere.mkdir(parents=True)
    (elsewhere / "Data_Entry_2017.csv").write_text("Image Index\n")
    monkeypatch.setenv("RADHARMONY_NIH_ROOT", str(elsewhere))
    assert DatasetsResource(data_root=str(tmp_path)).nih().root == elsewhere
