"""Fault injection: hostile inputs of every class become error rows naming file, entry and
field; everything else is built exactly as in a clean run; nothing hangs, nothing outside the
dataset roots is opened, nothing half-written is left, and strict mode fails fast instead.

Classes (issue 9): RLE text that would hang pycocotools; malformed entries; symlinks leaving
the image folder; coordinates that would wrap in an integer cast; DICOM memory bombs; bad
settings. Kill -9 and SIGTERM are in test_crash_recovery.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import dagster as dg
import numpy as np
import pandas as pd
import pydicom
import pytest
from fault_support import (
    BUILD_SECONDS,
    assert_error_row,
    assert_other_rows_identical,
    assert_outputs_load,
    build,
    error_rows,
    nothing_opened_under,
    packed_rows,
    tables,
)
from PIL import Image

from radharmony_pipeline.processing.annotations.rle_text import RleTextError, validate_rle
from radharmony_pipeline.processing.execution.parallel import map_with_time_limit
from radharmony_pipeline.processing.execution.supervised import TimeLimit
from radharmony_pipeline.processing.imaging.decode import DecodeError, decode_grayscale
from radharmony_pipeline.processing.storage import output_layout as layout
from radharmony_pipeline.settings import ConfigurationError, validate_settings
from radharmony_pipeline.sources import MetadataError, SourceLocation, open_source

PARTITIONS = ("chexlocalize.test", "chestx_det.train", "rexgradient.val", "ms_cxr.train")
REX_METADATA = ("rexgradient", "download", "metadata")
# A hang fails the test instead of stalling the suite: one build's bound (fault_support), the
# shared fixtures' setup excluded; tests that build twice carry twice the bound.
pytestmark = pytest.mark.timeout(BUILD_SECONDS, func_only=True)
TWO_BUILDS = pytest.mark.timeout(2 * BUILD_SECONDS, func_only=True)


@pytest.fixture(scope="module")
def clean(tiny_corpus):
    """Every partition the suite sabotages, as built from the untouched data (the session's
    tiny corpus)."""
    output, results, _ = tiny_corpus
    built = {}
    for partition in PARTITIONS:
        assert results[partition].success
        built[partition] = tables(output, partition)
        built[partition]["packed"] = packed_rows(output, partition, built[partition]["images"])
    return built


@pytest.fixture
def outside(tmp_path) -> Path:
    """A folder outside every dataset root holding valid images a symlink may point at."""
    folder = tmp_path / "outside"
    folder.mkdir()
    pixels = (np.arange(64 * 64).reshape(64, 64) % 251).astype(np.uint8)
    Image.fromarray(pixels).save(folder / "secret.png")
    Image.fromarray(pixels).save(folder / "secret.jpg")
    (folder / "patient99999" / "study1").mkdir(parents=True)
    Image.fromarray(pixels).save(folder / "patient99999" / "study1" / "view1_frontal.jpg")
    return folder


def check_contained(clean_tables, data_root, output, partition, affected, forbidden):
    """Build the sabotaged partition; return its tables after the shared assertions."""
    with nothing_opened_under(forbidden):
        result = build(data_root, output, partition)
    assert result.success
    built = tables(output, partition)
    # Entries without a usable id get one of their own (`entry-3`, `<study>-image0`): always
    # as error rows.
    new = set(built["raw_index"]["image_id"]) - set(clean_tables["raw_index"]["image_id"])
    index = built["raw_index"].set_index("image_id")
    assert (index.loc[sorted(new), "status"] == "error").all()
    affected = set(affected) | new
    assert_other_rows_identical(clean_tables, built, affected)
    packed = packed_rows(output, partition, built["images"])
    for image_id, pixels in clean_tables["packed"].items():
        if image_id not in affected:
            assert packed[image_id] == pixels
    assert_outputs_load(output)
    return built


def chexlocalize_segmentations(root: Path) -> tuple[Path, dict]:
    path = root / "chexlocalize" / "CheXlocalize" / "gt_segmentations_test.json"
    return path, json.loads(path.read_text())


# --- 1. RLE text that makes pycocotools spin ---------------------------------------------------

# Each of these made `pycocotools.mask.merge` loop forever or misread the mask.
HOSTILE_COUNTS = {
    "negative run": "4@",
    "character outside the alphabet": "0{}~",
    "ends inside a run": "3`",
    "runs do not cover the image": "5",
}


@pytest.mark.parametrize("counts", list(HOSTILE_COUNTS.values()), ids=list(HOSTILE_COUNTS))
def test_rle_text_is_validated_before_pycocotools(counts):
    with pytest.raises(RleTextError) as caught:
        validate_rle({"size": [4, 4], "counts": counts})
    assert caught.value.field == "counts"


@pytest.mark.build
def test_hostile_rle_text_becomes_mask_error_rows_without_hanging(
    clean, tiny_copy, tmp_path, outside
):
    path, segmentations = chexlocalize_segmentations(tiny_copy)
    victims = {}
    for (cxr_id, entry), counts in zip(
        segmentations.items(), HOSTILE_COUNTS.values(), strict=False
    ):
        pathology = next(iter(entry))
        entry[pathology]["counts"] = counts
        victims[f"chexlocalize/{cxr_id}"] = (cxr_id, pathology)
    path.write_text(json.dumps(segmentations))
    built = check_contained(
        clean["chexlocalize.test"],
        tiny_copy,
        tmp_path / "out",
        "chexlocalize.test",
        set(victims),
        outside,
    )
    for image_id, (cxr_id, pathology) in victims.items():
        assert_error_row(built["masks"], image_id, path, f"entry {cxr_id!r}", f"{pathology}.counts")
    # Only the masks are affected: the images themselves are fine.
    assert set(error_rows(built["images"])["image_id"]) == set()


def hang(item: int) -> int:
    if item == 2:
        time.sleep(3600)
    if item == 4:
        os._exit(9)  # a worker dying inside C code looks like this
    return item * 10


@pytest.mark.slow
@pytest.mark.timeout(30)
def test_one_stuck_or_dead_item_is_stopped_and_the_pool_continues():
    limit = TimeLimit(1.0, lambda item, reason: f"error {item}: {reason}")
    results = map_with_time_limit(hang, list(range(7)), workers=2, time_limit=limit)
    assert results[:2] == [0, 10] and results[3] == 30 and results[5:] == [50, 60]
    assert results[2].startswith("error 2: took longer than 1 s")
    assert results[4].startswith("error 4: worker process died (exit code 9)")


# --- 2. malformed entries: one bad entry never sinks a partition ----------------------------


@pytest.mark.build
def test_malformed_chestx_det_entries_are_error_rows(clean, tiny_copy, tmp_path, outside):
    path = tiny_copy / "chestx-det" / "ChestX_Det_train.json"
    entries = json.loads(path.read_text())
    with_findings = [i for i, e in enumerate(entries) if len(e["syms"]) >= 2]
    two_points, three_numbers, unknown = with_findings[:3]
    no_name = next(i for i, e in enumerate(entries) if i not in with_findings)
    ids = {
        i: "chestx_det/" + entries[i]["file_name"].removesuffix(".png") for i in range(len(entries))
    }
    entries[two_points]["polygons"][1] = [[10, 10], [20, 20]]
    entries[three_numbers]["boxes"][0] = [1, 2, 3]
    entries[unknown]["syms"][0] = "Dragon"
    del entries[no_name]["file_name"]
    path.write_text(json.dumps(entries))
    affected = {ids[two_points], ids[three_numbers], ids[unknown], ids[no_name]}
    built = check_contained(
        clean["chestx_det.train"],
        tiny_copy,
        tmp_path / "out",
        "chestx_det.train",
        affected,
        outside,
    )
    assert_error_row(
        built["masks"], ids[two_points], path, f"entry {two_points}", "polygons[1]", "2 points"
    )
    box = assert_error_row(
        built["bboxes"], ids[three_numbers], path, f"entry {three_numbers}", "boxes[0]"
    )
    assert "[1, 2, 3]" in box
    assert_error_row(
        built["raw_index"], ids[unknown], path, f"entry {unknown}", "syms[0]", "Dragon"
    )
    assert_error_row(built["labels"], ids[unknown], "Dragon")
    assert_error_row(
        built["raw_index"], f"chestx_det/entry-{no_name}", path, f"entry {no_name}", "file_name"
    )
    # An index error is carried to images (and masks), never read.
    assert_error_row(built["images"], ids[unknown], "raw_index:", "syms[0]")
    assert_error_row(built["masks"], ids[unknown], "raw_index:", "syms[0]")
    # Labels of an entry whose findings are unknown are null, never 0.
    labels = built["labels"].set_index("image_id")
    assert labels.loc[ids[unknown], "label_cardiomegaly"] is pd.NA


@pytest.mark.build
def test_malformed_rexgradient_studies_are_error_rows(clean, tiny_copy, tmp_path, outside):
    path = tiny_copy.joinpath(*REX_METADATA, "valid_metadata_view_position.json")
    studies = json.loads(path.read_text())
    keys = list(studies)
    clean_index = clean["rexgradient.val"]["raw_index"]

    def ids_of(key):
        return set(
            clean_index.loc[clean_index["study_id"] == studies[key]["StudyInstanceUid"], "image_id"]
        )

    infinite, null_paths, escaping = keys[:3]
    affected = ids_of(infinite) | ids_of(null_paths) | ids_of(escaping)
    studies[infinite]["StudyDate"] = float("inf")  # json.dumps writes a bare Infinity
    studies[null_paths]["ImagePath"] = None
    nul_path = studies[escaping]["ImagePath"][0]
    studies[escaping]["ImagePath"][0] = "../deid_png/../../outside/secret.png"
    if len(studies[escaping]["ImagePath"]) > 1:
        studies[escaping]["ImagePath"][1] = nul_path.replace(".png", "\0.png")
    text = json.dumps(studies)
    assert "Infinity" in text
    path.write_text(text)
    built = check_contained(
        clean["rexgradient.val"], tiny_copy, tmp_path / "out", "rexgradient.val", affected, outside
    )
    index = built["raw_index"]
    for image_id in ids_of(infinite):
        assert_error_row(index, image_id, path, f"entry {infinite!r}", "StudyDate", "inf")
    assert_error_row(
        index, f"rexgradient/{null_paths}-image0", path, f"entry {null_paths!r}", "ImagePath"
    )
    assert_error_row(
        index,
        "rexgradient/secret",
        path,
        f"entry {escaping!r}",
        "ImagePath",
        "outside the image folder",
    )
    messages = error_rows(index)["error"].tolist()
    if len(studies[escaping]["ImagePath"]) > 1:
        assert any("NUL byte" in m and f"entry {escaping!r}" in m for m in messages)
    assert len(error_rows(built["images"])) == len(error_rows(index))


@pytest.mark.build
def test_malformed_chexlocalize_rows_and_entries_are_error_rows(
    clean, tiny_copy, tmp_path, outside
):
    csv = tiny_copy / "chexlocalize" / "CheXpert" / "test_labels.csv"
    table = pd.read_csv(csv)
    table["Edema"] = table["Edema"].astype(object)
    table.loc[1, "Edema"] = "maybe"
    table.loc[2, "Path"] = "test/patient1/study1/view1\0_frontal.jpg"
    table.loc[3, "Path"] = "/etc/passwd"
    table.to_csv(csv, index=False)
    seg_path, segmentations = chexlocalize_segmentations(tiny_copy)
    listed = next(iter(segmentations))
    pathology = next(iter(segmentations[listed]))
    segmentations[listed][pathology]["counts"] = [3, 4, 9]
    seg_path.write_text(json.dumps(segmentations))
    clean_ids = clean["chexlocalize.test"]["raw_index"]["image_id"].tolist()
    affected = {clean_ids[1], clean_ids[2], clean_ids[3], f"chexlocalize/{listed}"}
    built = check_contained(
        clean["chexlocalize.test"],
        tiny_copy,
        tmp_path / "out",
        "chexlocalize.test",
        affected,
        outside,
    )
    index = built["raw_index"]
    assert_error_row(index, clean_ids[1], csv, "row 3", "'Edema'", "'maybe'")
    assert index["status"].tolist().count("error") == 3
    messages = error_rows(index)["error"].tolist()
    assert any("row 4" in m and "NUL byte" in m for m in messages)
    assert any("row 5" in m and "'/etc/passwd'" in m for m in messages)
    assert_error_row(
        built["masks"],
        f"chexlocalize/{listed}",
        seg_path,
        f"entry {listed!r}",
        f"{pathology}.counts",
        "list",
    )


def test_deeply_nested_json_names_the_file(tiny_copy, open_tiny):
    path = tiny_copy / "chestx-det" / "ChestX_Det_test.json"
    path.write_text("[" * 200_000 + "]" * 200_000)
    with pytest.raises(MetadataError) as caught:
        open_tiny("chestx_det", root=tiny_copy).read_split("test")
    assert str(path) in str(caught.value) and "nested too deeply" in str(caught.value)


# --- 3. symlinks leaving the image folder -----------------------------------------------------


def replace_with_link(path: Path, target: Path) -> None:
    path.unlink()
    path.symlink_to(target)


@TWO_BUILDS
@pytest.mark.build
def test_symlinks_leaving_the_image_folder_are_error_rows_never_opened(
    clean, tiny_copy, tmp_path, outside
):
    # CheXlocalize: a linked JPEG and a linked patient folder.
    index = clean["chexlocalize.test"]["raw_index"]
    base = tiny_copy / "chexlocalize" / "CheXpert" / "test"
    frontal = index[index["image_path"].str.endswith("_frontal.jpg")]
    linked_file = frontal.iloc[0]
    replace_with_link(base / linked_file["image_path"], outside / "secret.jpg")
    linked_patient = frontal[frontal["patient_id"] != linked_file["patient_id"]].iloc[0]
    patient_dir = base / linked_patient["patient_id"]
    shutil.rmtree(patient_dir)
    patient_dir.symlink_to(outside / "patient99999")
    affected = {linked_file["image_id"]} | set(
        index.loc[index["patient_id"] == linked_patient["patient_id"], "image_id"]
    )
    built = check_contained(
        clean["chexlocalize.test"],
        tiny_copy,
        tmp_path / "out",
        "chexlocalize.test",
        affected,
        outside,
    )
    for image_id in affected:
        assert_error_row(built["images"], image_id, "outside the image folder", "not read")
    assert_error_row(built["masks"], linked_file["image_id"], "outside the image folder")

    # ChestX-Det (PNG read by masks and images) and ReXGradient (PNG read by images).
    for partition, folder in (
        ("chestx_det.train", tiny_copy / "chestx-det" / "train"),
        ("rexgradient.val", tiny_copy / "rexgradient" / "deid_png"),
    ):
        row = clean[partition]["raw_index"].iloc[1]
        replace_with_link(folder / row["image_path"], outside / "secret.png")
        built = check_contained(
            clean[partition],
            tiny_copy,
            tmp_path / f"out-{partition}",
            partition,
            {row["image_id"]},
            outside,
        )
        assert_error_row(
            built["images"],
            row["image_id"],
            str(folder / row["image_path"]),
            "outside the image folder",
        )


# --- 4. silent wrong answers --------------------------------------------------------------------


@pytest.mark.build
def test_coordinates_that_would_wrap_are_rejected_in_float_space(
    clean, tiny_copy, tmp_path, outside
):
    path = tiny_copy / "chestx-det" / "ChestX_Det_train.json"
    entries = json.loads(path.read_text())
    victims = [i for i, e in enumerate(entries) if e["syms"]][:3]
    for position, value in zip(victims, (1e12, 2**31 + 5, -(2**33)), strict=True):
        entries[position]["polygons"][0][1] = [value, 100]
    path.write_text(json.dumps(entries))
    ids = ["chestx_det/" + entries[i]["file_name"].removesuffix(".png") for i in victims]
    built = check_contained(
        clean["chestx_det.train"],
        tiny_copy,
        tmp_path / "out",
        "chestx_det.train",
        set(ids),
        outside,
    )
    for image_id, position in zip(ids, victims, strict=True):
        assert_error_row(
            built["masks"], image_id, path, f"entry {position}", "polygons[0]", "far outside"
        )
        # No mask of a wrapped polygon is published as ok.
        rows = built["masks"][built["masks"]["image_id"] == image_id]
        assert (rows["status"] == "error").all()


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("RADHARMONY_IMAGE_SIZE", "0"),
        ("RADHARMONY_IMAGE_SIZE", "-3"),
        ("RADHARMONY_IMAGE_SIZE", "big"),
        ("RADHARMONY_IMAGE_SIZE", "100000"),
        ("RADHARMONY_WORKERS", "0"),
        ("RADHARMONY_WORKERS", "two"),
        ("RADHARMONY_JOB_TIMEOUT", "0"),
        ("RADHARMONY_JOB_TIMEOUT", "inf"),
        ("RADHARMONY_STRICT", "maybe"),
    ],
)
def test_bad_settings_are_refused_up_front_naming_the_variable(variable, value):
    with pytest.raises(ConfigurationError, match=variable):
        validate_settings({variable: value})


@pytest.mark.slow
def test_the_cli_refuses_a_bad_setting_before_any_work(tmp_path):
    environ = {**os.environ, "RADHARMONY_IMAGE_SIZE": "0", "DAGSTER_HOME": str(tmp_path)}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "radharmony_pipeline.cli",
            "demo",
            "--data-root",
            str(tmp_path / "none"),
        ],
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert "RADHARMONY_IMAGE_SIZE" in done.stderr and "'0'" in done.stderr
    assert not (tmp_path / "none").exists()


# --- 5. DICOM memory bombs ------------------------------------------------------------------


def dicom_bomb(
    source: Path, target: Path, rows: int, columns: int, frames: int = 1, bits: int = 16
) -> None:
    ds = pydicom.dcmread(source)
    ds.Rows, ds.Columns, ds.BitsAllocated = rows, columns, bits
    if frames > 1:
        ds.NumberOfFrames = frames
    ds.save_as(target)


@pytest.mark.parametrize(
    ("rows", "columns", "frames", "bits"),
    [(30000, 30000, 1, 16), (65535, 65535, 1, 8), (8000, 8000, 40, 16)],
)
def test_dicom_declaring_huge_pixel_data_is_refused_before_decoding(
    tiny_root, tmp_path, rows, columns, frames, bits
):
    source = next((tiny_root / "mimic-cxr" / "files").rglob("*.dcm"))
    bomb = tmp_path / "bomb.dcm"
    dicom_bomb(source, bomb, rows, columns, frames, bits)
    assert bomb.stat().st_size < 10 * 2**20
    tracemalloc.start()
    try:
        with pytest.raises(DecodeError, match=f"{rows}x{columns}"):
            decode_grayscale(bomb, target_size=64)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 * 2**20


@pytest.mark.build
def test_dicom_bombs_in_a_partition_are_error_rows(clean, tiny_copy, tmp_path, outside):
    index = clean["ms_cxr.train"]["raw_index"]
    dicoms = index[index["image_format"] == "dcm"].head(2)
    assert len(dicoms) >= 1
    base = tiny_copy / "mimic-cxr" / "files"
    for relative in dicoms["image_path"]:
        dicom_bomb(base / relative, base / relative, 30000, 30000)
    built = check_contained(
        clean["ms_cxr.train"],
        tiny_copy,
        tmp_path / "out",
        "ms_cxr.train",
        set(dicoms["image_id"]),
        outside,
    )
    for image_id in dicoms["image_id"]:
        assert_error_row(built["images"], image_id, "30000x30000", "refused before decoding")


# --- strict mode and checks -------------------------------------------------------------------


@pytest.mark.build
@TWO_BUILDS
def test_strict_mode_fails_on_the_first_bad_row_with_the_same_message(tiny_copy, tmp_path):
    path = tiny_copy / "chestx-det" / "ChestX_Det_train.json"
    entries = json.loads(path.read_text())
    victim = next(i for i, e in enumerate(entries) if e["syms"])
    entries[victim]["polygons"][0] = [[1, 1]]
    path.write_text(json.dumps(entries))
    lenient = build(tiny_copy, tmp_path / "lenient", "chestx_det.train")
    assert lenient.success
    message = error_rows(tables(tmp_path / "lenient", "chestx_det.train")["masks"])["error"].iloc[0]
    strict = build(tiny_copy, tmp_path / "strict", "chestx_det.train", strict=True)
    assert not strict.success
    failures = [e for e in strict.all_events if e.is_step_failure]
    assert [f.step_key for f in failures] == ["masks"]
    assert failures[0].step_failure_data.user_failure_data.description == message
    assert not (layout.tables_folder(tmp_path / "strict") / "images").exists()


def test_strict_mode_reads_the_environment(monkeypatch):
    from radharmony_pipeline.defs.run_settings import RunSettingsResource

    monkeypatch.setenv("RADHARMONY_STRICT", "1")
    assert RunSettingsResource().strict is True
    monkeypatch.setenv("RADHARMONY_STRICT", "0")
    assert RunSettingsResource().strict is False


@pytest.mark.build
@TWO_BUILDS
def test_error_rows_warn_and_good_images_still_flow(tiny_copy, tmp_path):
    path, segmentations = chexlocalize_segmentations(tiny_copy)
    cxr_id = next(iter(segmentations))
    next(iter(segmentations[cxr_id].values()))["counts"] = "4@"
    path.write_text(json.dumps(segmentations))
    result = build(tiny_copy, tmp_path / "out", "chexlocalize.test", checks=True)
    checks = {e.check_name: e for e in result.get_asset_check_evaluations()}
    assert not checks["masks_error_rows"].passed
    assert checks["masks_error_rows"].severity == dg.AssetCheckSeverity.WARN
    # The documented count is short by the image whose mask failed: explained, not blocking.
    counts = checks["masks_match_documentation"]
    assert not counts.passed and counts.severity == dg.AssetCheckSeverity.WARN
    assert "error row" in counts.description
    images = tables(tmp_path / "out", "chexlocalize.test")["images"]
    assert (images["status"] == "ok").all() and len(images) == 8

    # In strict mode the same count blocks, and nothing downstream is built.
    strict = build(tiny_copy, tmp_path / "strict", "chexlocalize.test", strict=True, checks=True)
    assert not strict.success
    assert not (layout.tables_folder(tmp_path / "strict") / "images").exists()


def test_a_reader_needs_no_dagster(tiny_root):
    # The source layer alone keeps error rows too (used by notebooks and benchmarks).
    tables_ = open_source(
        "chestx_det", SourceLocation(), {"RADHARMONY_DATA_ROOT": str(tiny_root)}
    ).read_split("test")
    assert list(tables_.index.columns[-2:]) == ["status", "error"]
    assert (tables_.index["status"] == "ok").all()
