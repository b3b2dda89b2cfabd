"""Each documented dataset figure (overlaps, RGBA images, instance counts, patients kept apart
by split) is a check that fails, with expected vs found and a hint, on a copy of the tiny data
altered once for the module and built."""

from __future__ import annotations

import json
import shutil

import dagster as dg
import numpy as np
import pandas as pd
import pytest
from corpus import check_evaluations, materialize_corpus
from PIL import Image

from radharmony_pipeline.processing.annotations.masks import rasterize_polygons

pytestmark = pytest.mark.build


def _metadata_text(evaluation, key: str) -> str:
    return str(evaluation.metadata[key].value)


def _mirror_consolidation_of_an_overlap(root) -> None:
    """Move one image's consolidation to the other lung, away from its effusion."""
    path = root / "chestx-det" / "ChestX_Det_train.json"
    entries = json.loads(path.read_text())
    entry = next(e for e in entries if _overlap(e, "Consolidation", "Effusion"))
    for position, sym in enumerate(entry["syms"]):
        if sym == "Consolidation":
            entry["polygons"][position] = [[1023 - x, y] for x, y in entry["polygons"][position]]
    assert not _overlap(entry, "Consolidation", "Effusion")
    path.write_text(json.dumps(entries))


def _overlap(entry: dict, first: str, second: str) -> bool:
    def mask(name: str) -> np.ndarray | None:
        polygons = [p for s, p in zip(entry["syms"], entry["polygons"], strict=True) if s == name]
        return rasterize_polygons(polygons, 1024, 1024) if polygons else None

    a, b = mask(first), mask(second)
    return a is not None and b is not None and bool((a & b).any())


def _make_one_rgba_png_grayscale(root) -> None:
    for png in sorted((root / "chestx-det" / "train").glob("*.png")):
        with Image.open(png) as image:
            if image.mode == "RGBA":
                image.convert("L").save(png)
                return
    raise AssertionError("the tiny data has no RGBA train image")


def _move_a_val_patient_into_train(root) -> str:
    folder = root / "rexgradient" / "download" / "metadata"
    train = json.loads((folder / "train_metadata_view_position.json").read_text())
    val_path = folder / "valid_metadata_view_position.json"
    val = json.loads(val_path.read_text())
    per_patient = pd.Series([s["PatientID"] for s in val.values()]).value_counts()
    study = next(s for s in val.values() if per_patient[s["PatientID"]] == 1)
    study["PatientID"] = next(iter(train.values()))["PatientID"]
    val_path.write_text(json.dumps(val))
    return study["PatientID"]


def _raise_a_documented_instance_count(root) -> None:
    path = root / "chestx-det" / "expected_counts.json"
    counts = json.loads(path.read_text())
    counts["total"]["class_annotations.nodule"] += 1
    path.write_text(json.dumps(counts))


@pytest.fixture(scope="module")
def altered(tiny_root, tmp_path_factory):
    data = tmp_path_factory.mktemp("altered") / "data"
    shutil.copytree(tiny_root, data)
    _mirror_consolidation_of_an_overlap(data)
    _make_one_rgba_png_grayscale(data)
    _raise_a_documented_instance_count(data)
    shared = _move_a_val_patient_into_train(data)
    partitions = [f"chestx_det.{s}" for s in ("train", "test")]
    partitions += [f"rexgradient.{s}" for s in ("train", "val", "test")]
    results, manifest = materialize_corpus(data, data.parent / "out", partitions)
    return results, check_evaluations(manifest), shared


def test_the_overlap_table_is_measured_on_the_masks(altered):
    results, evaluations, _ = altered
    assert all(result.success for result in results.values())
    figures = evaluations["dataset_figures_match_documentation"]
    assert not figures.passed
    pair = "chestx_det: overlap.pair_overlap_images.consolidation+pleural_effusion"
    assert pair in figures.description
    assert "chestx_det: overlap.pixel_overlap_images" in figures.description
    assert "polygons" in _metadata_text(figures, "probably_wrong")


def test_rgba_images_are_counted_per_split_and_in_total(altered):
    _, evaluations, _ = altered
    figures = evaluations["dataset_figures_match_documentation"]
    assert "chestx_det: train.rgba_images" in figures.description
    assert "chestx_det: rgba_images" in figures.description
    assert "PNG modes" in _metadata_text(figures, "probably_wrong")


def test_documented_instance_counts_are_checked_on_the_manifest(altered):
    _, evaluations, _ = altered
    totals = evaluations["manifest_totals_match_documentation"]
    assert not totals.passed
    assert "chestx_det: class_annotations.nodule" in totals.description
    assert "ChestX_Det_<split>.json" in _metadata_text(totals, "probably_wrong")


def test_a_patient_in_two_rexgradient_splits_blocks(altered):
    _, evaluations, shared = altered
    disjoint = evaluations["patients_disjoint_across_splits"]
    assert not disjoint.passed and disjoint.severity == dg.AssetCheckSeverity.ERROR
    assert "rexgradient: 1 patient(s) in both train/val (documented disjoint)" in (
        disjoint.description
    )
    assert disjoint.metadata["examples"].value["rexgradient"]["train/val"] == [shared]
    totals = evaluations["manifest_totals_match_documentation"]
    assert "rexgradient: patients" in totals.description
