"""masks + bboxes materialized on tiny synthetic data: pixels, boxes, errors, skip-unchanged."""

from __future__ import annotations

import json

import dagster as dg
import numpy as np
import pandas as pd
import pytest
from corpus import check_evaluations, checks_of_a_success
from PIL import Image, ImageDraw
from pycocotools import mask as coco

from radharmony_pipeline.definitions import build_definitions
from radharmony_pipeline.processing.annotations.masks import read_mask_png
from radharmony_pipeline.processing.storage import output_layout as layout
from radharmony_pipeline.sources import partition_keys
from radharmony_pipeline.sources.ms_cxr import CSV_NAME

pytestmark = pytest.mark.build


def run(data_root, output, partition) -> dg.ExecuteInProcessResult:
    job = build_definitions(data_root, output).resolve_job_def("all_stages")
    return job.execute_in_process(partition_key=partition, raise_on_error=False)


@pytest.fixture(scope="module")
def built(tiny_corpus):
    """The session's tiny corpus: every partition's `all_stages` run, two workers."""
    output, results, _ = tiny_corpus
    return output, results


def pixel_edges(low: pd.Series, high: pd.Series, size) -> tuple[np.ndarray, np.ndarray]:
    """Normalized edges back to whole source pixels (the test's own inverse)."""
    size = np.asarray(size, dtype=float)
    return (
        np.floor(low.to_numpy(float) * size + 0.5).astype(int),
        np.floor(high.to_numpy(float) * size + 0.5).astype(int),
    )


def table(output, asset, partition) -> pd.DataFrame:
    return pd.read_parquet(layout.table_file(output, asset, partition))


@pytest.mark.parametrize("partition", partition_keys())
def test_every_partition_builds_with_blocking_checks_passing(built, partition):
    _, results = built
    evaluations = checks_of_a_success(results[partition])
    assert {
        "masks_match_documentation",
        "masks_suite",
        "bboxes_match_documentation",
        "bboxes_suite",
        "positives_without_masks",
    } <= set(evaluations)
    blocking = {
        name: evaluation
        for name, evaluation in evaluations.items()
        if evaluation.severity == dg.AssetCheckSeverity.ERROR
    }
    assert {"masks_match_documentation", "bboxes_match_documentation"} <= set(blocking)
    failed = {name: e.metadata for name, e in blocking.items() if not e.passed}
    assert failed == {}


def test_any_mask_is_the_union_of_the_rles_pixel_for_pixel(built, tiny_root):
    output, _ = built
    masks = table(output, "masks", "chexlocalize.test")
    index = table(output, "raw_index", "chexlocalize.test")
    entries = json.loads(
        (tiny_root / "chexlocalize" / "CheXlocalize" / "gt_segmentations_test.json").read_text()
    )
    union_rows = masks[masks["mask_class"] == "any"].set_index("image_id")
    # Only segmented images (frontals) have a union; laterals are not annotated.
    frontal = index.loc[index["image_path"].str.endswith("_frontal.jpg"), "image_id"]
    assert set(union_rows.index) == set(frontal) != set(index["image_id"])
    for image_id, row in union_rows.iterrows():
        entry = entries.get(image_id.removeprefix("chexlocalize/"))
        union = read_mask_png(output / row["mask_path"])
        if entry is None:
            assert union.max() == 0 and row["source"] == "empty"
            continue
        reference = np.zeros(union.shape, dtype=np.uint8)
        for rle in entry.values():
            reference |= coco.decode({"size": rle["size"], "counts": rle["counts"].encode()})
        assert np.array_equal(union, reference), image_id
        classes = masks[(masks["image_id"] == image_id) & (masks["mask_class"] != "any")]
        non_empty = {
            name
            for name, rle in entry.items()
            if coco.area({"size": rle["size"], "counts": rle["counts"].encode()}) > 0
        }
        assert len(classes) == len(non_empty)
        assert "lung_opacity" in set(classes["mask_class"]) or "Airspace Opacity" not in non_empty


def test_masks_are_0_255_pngs_at_native_resolution(built):
    output, _ = built
    masks = table(output, "masks", "chestx_det.train")
    first = masks[masks["mask_class"] != "any"].iloc[0]
    with Image.open(output / first["mask_path"]) as image:
        assert image.mode == "L" and image.size == (1024, 1024)
        assert set(np.unique(np.asarray(image))) <= {0, 255}
    assert (masks.loc[masks["mask_class"] != "any", "area_fraction"] > 0).all()


def test_chestx_det_class_masks_match_a_reference_and_keep_overlaps(built, tiny_root):
    output, _ = built
    masks = table(output, "masks", "chestx_det.train")
    entries = json.loads((tiny_root / "chestx-det" / "ChestX_Det_train.json").read_text())
    overlaps = 0
    assert any(not entry["syms"] for entry in entries), "the generator writes negatives"
    for entry in entries:
        image_id = "chestx_det/" + entry["file_name"][:-4]
        mine = masks[masks["image_id"] == image_id].set_index("mask_class")
        by_class: dict[str, list] = {}
        for sym, polygon in zip(entry["syms"], entry["polygons"], strict=True):
            name = {"Effusion": "pleural_effusion"}.get(sym, sym.lower().replace(" ", "_"))
            by_class.setdefault(name, []).append(polygon)
        assert set(mine.index) - {"any"} == set(by_class)
        decoded = {}
        for name, polygons in by_class.items():
            reference = Image.new("L", (1024, 1024), 0)
            for polygon in polygons:
                ImageDraw.Draw(reference).polygon([tuple(p) for p in polygon], fill=1, outline=1)
            expected = np.asarray(reference)
            got = read_mask_png(output / mine.loc[name, "mask_path"])
            # PIL and OpenCV may disagree on single boundary pixels of slanted edges.
            assert np.abs(got.astype(int) - expected).sum() <= 0.02 * expected.sum() + 50, name
            decoded[name] = got
        names = sorted(decoded)
        for i, a in enumerate(names):
            for b in names[i + 1 :]:
                overlaps += int((decoded[a] & decoded[b]).any())
        union = np.zeros((1024, 1024), dtype=np.uint8)
        for got in decoded.values():
            union |= got
        assert np.array_equal(read_mask_png(output / mine.loc["any", "mask_path"]), union)
    assert overlaps >= 1, "the generator draws overlapping classes; both masks must keep them"


def test_ms_cxr_boxes_round_trip_to_csv_pixels(built, tiny_root):
    output, _ = built
    csv = pd.read_csv(tiny_root / "ms-cxr" / CSV_NAME)
    for split in ("train", "val", "test"):
        boxes = table(output, "bboxes", f"ms_cxr.{split}")
        rows = csv[csv["split"] == split].reset_index(drop=True)
        assert len(boxes) == len(rows)
        assert list(boxes["image_id"]) == list("ms_cxr/" + rows["dicom_id"])
        assert list(boxes["label_text"]) == list(rows["label_text"])
        left, right = pixel_edges(boxes["x_min"], boxes["x_max"], rows["image_width"])
        top, bottom = pixel_edges(boxes["y_min"], boxes["y_max"], rows["image_height"])
        assert list(left) == list(rows["x"]) and list(top) == list(rows["y"])
        assert list(right - left) == list(rows["w"]) and list(bottom - top) == list(rows["h"])
        # A phrase with several boxes keeps one row per box.
        phrase_sizes = rows.groupby(["dicom_id", "label_text"]).size()
        multi = boxes.groupby(["image_id", "label_text"]).size()
        assert sorted(multi) == sorted(phrase_sizes)
    train = csv[csv["split"] == "train"]
    assert (train.groupby(["dicom_id", "label_text"]).size() > 1).any(), (
        "the generator must write a phrase with several boxes"
    )


def test_chestx_det_boxes_round_trip_to_json_corners(built, tiny_root):
    output, _ = built
    boxes = table(output, "bboxes", "chestx_det.test")
    entries = json.loads((tiny_root / "chestx-det" / "ChestX_Det_test.json").read_text())
    corners = [box for entry in entries for box in entry["boxes"]]
    assert len(boxes) == len(corners)
    left, right = pixel_edges(boxes["x_min"], boxes["x_max"], 1024)
    top, bottom = pixel_edges(boxes["y_min"], boxes["y_max"], 1024)
    assert list(zip(left, top, right, bottom, strict=True)) == [tuple(c) for c in corners]


def test_rexgradient_has_empty_typed_mask_and_box_tables(built):
    output, _ = built
    masks = table(output, "masks", "rexgradient.val")
    boxes = table(output, "bboxes", "rexgradient.val")
    assert masks.empty and {"image_id", "mask_class", "mask_path", "area_fraction"} <= set(masks)
    assert boxes.empty and {"y_min", "y_max", "x_min", "x_max"} <= set(boxes)


def test_contact_sheets_are_written_and_linked(built):
    _output, results = built
    for partition, asset in (
        ("chexlocalize.test", "masks"),
        ("chestx_det.train", "masks"),
        ("ms_cxr.train", "bboxes"),
        ("chestx_det.train", "bboxes"),
    ):
        event = next(
            e
            for e in results[partition].get_asset_materialization_events()
            if e.materialization.asset_key == dg.AssetKey(asset)
        )
        path = event.materialization.metadata["preview"].value
        with Image.open(path) as sheet:
            assert sheet.width >= 1000
        assert "data:image/jpeg;base64" in event.materialization.metadata["preview_inline"].value


def test_second_run_rewrites_no_mask_png(tiny_corpus_copy, tiny_root):
    output = tiny_corpus_copy
    pngs = sorted((output / layout.mask_folder("chestx_det.test")).rglob("*.png"))
    before = {p: p.stat().st_mtime_ns for p in pngs}
    assert run(tiny_root, output, "chestx_det.test").success
    assert {p: p.stat().st_mtime_ns for p in pngs} == before
    assert not list(output.rglob(".partial-*"))


def test_clipped_and_degenerate_boxes_are_counted_not_dropped(tiny_copy, tmp_path):
    path = tiny_copy / "ms-cxr" / CSV_NAME
    csv = pd.read_csv(path)
    train = csv.index[csv["split"] == "train"]
    csv.loc[train[0], "x"] = csv.loc[train[0], "image_width"] - 5  # runs off the right edge
    csv.loc[train[1], "w"] = 0  # no area
    csv.to_csv(path, index=False)
    result = run(tiny_copy, tmp_path / "out", "ms_cxr.train")
    boxes = table(tmp_path / "out", "bboxes", "ms_cxr.train")
    assert len(boxes) == (csv["split"] == "train").sum()
    event = next(
        e
        for e in result.get_asset_materialization_events()
        if e.materialization.asset_key == dg.AssetKey("bboxes")
    )
    assert event.materialization.metadata["clipped"].value == 1
    assert event.materialization.metadata["degenerate"].value == 1
    assert boxes["x_max"].max() <= 1
    bad = boxes[boxes["status"] == "error"]
    assert len(bad) == 1 and "no area" in bad["error"].iloc[0]
    # Error rows are a warning (the good boxes flow on), not a failed count.
    check = next(
        e for e in result.get_asset_check_evaluations() if e.check_name == "bboxes_error_rows"
    )
    assert not check.passed and check.severity == dg.AssetCheckSeverity.WARN
    assert "no area" in check.description


def test_rgba_chestx_det_png_accepted_only_when_gray(tiny_copy, tmp_path):
    entries = json.loads((tiny_copy / "chestx-det" / "ChestX_Det_test.json").read_text())
    first, second = (tiny_copy / "chestx-det" / "test" / e["file_name"] for e in entries[:2])
    for path, alpha in ((first, 255), (second, 254)):
        with Image.open(path) as image:
            gray = np.asarray(image.convert("L"))
        rgba = np.dstack([gray, gray, gray, np.full_like(gray, 255)])
        rgba[0, 0, 3] = alpha
        Image.fromarray(rgba, "RGBA").save(path)
    result = run(tiny_copy, tmp_path / "out", "chestx_det.test")
    masks = table(tmp_path / "out", "masks", "chestx_det.test")
    errors = masks[masks["status"] == "error"]
    assert list(errors["image_id"]) == ["chestx_det/" + entries[1]["file_name"][:-4]]
    assert "alpha" in errors["error"].iloc[0]
    accepted = masks[masks["image_id"] == "chestx_det/" + entries[0]["file_name"][:-4]]
    assert (accepted["status"] == "ok").all()
    check = next(
        e for e in result.get_asset_check_evaluations() if e.check_name == "masks_error_rows"
    )
    assert not check.passed and check.severity == dg.AssetCheckSeverity.WARN
    assert check.metadata["error_rows"].value == 1


def test_rle_size_mismatch_is_a_per_image_error_with_both_sizes(tiny_copy, tmp_path):
    path = tiny_copy / "chexlocalize" / "CheXlocalize" / "gt_segmentations_val.json"
    entries = json.loads(path.read_text())
    cxr_id = next(iter(entries))
    for name, rle in entries[cxr_id].items():
        mask = np.zeros((rle["size"][0] + 7, rle["size"][1]), dtype=np.uint8, order="F")
        encoded = coco.encode(mask)
        entries[cxr_id][name] = {
            "size": list(encoded["size"]),
            "counts": encoded["counts"].decode(),
        }
    path.write_text(json.dumps(entries))
    run(tiny_copy, tmp_path / "out", "chexlocalize.val")
    masks = table(tmp_path / "out", "masks", "chexlocalize.val")
    error = masks.loc[masks["image_id"] == f"chexlocalize/{cxr_id}", "error"].iloc[0]
    height, _width = entries[cxr_id][name]["size"]
    assert str(height) in error and str(height - 7) in error


def test_the_documented_unsegmented_positive_passes_and_is_listed(built):
    _, results = built
    evaluation = check_evaluations(results["chexlocalize.test"])["positives_without_masks"]
    assert evaluation.passed
    documented = "chexlocalize/patient65086_study1_view1_frontal"
    assert evaluation.metadata["documented_exceptions"].value == [documented]
    assert evaluation.metadata["unexpected"].value == 0
    assert documented in evaluation.description


def test_an_undocumented_unsegmented_positive_warns_with_its_id(tiny_copy, tmp_path):
    # A frontal image without a segmentation entry turns positive for a localizable class.
    base = tiny_copy / "chexlocalize"
    entries = json.loads((base / "CheXlocalize" / "gt_segmentations_test.json").read_text())
    csv = base / "CheXpert" / "test_labels.csv"
    rows = pd.read_csv(csv)
    native = rows["Path"].str.removeprefix("test/").str.removesuffix(".jpg").str.replace("/", "_")
    candidates = rows.index[
        rows["Path"].str.endswith("_frontal.jpg")
        & ~native.isin(entries)
        & ~native.str.startswith("patient65086")
    ]
    chosen = candidates[0]
    rows.loc[chosen, "Cardiomegaly"] = 1.0
    rows.to_csv(csv, index=False)
    result = run(tiny_copy, tmp_path / "out", "chexlocalize.test")
    evaluation = check_evaluations(result)["positives_without_masks"]
    image_id = f"chexlocalize/{native[chosen]}"
    assert not evaluation.passed
    assert evaluation.severity == dg.AssetCheckSeverity.WARN
    assert image_id in evaluation.description
    assert "patient65086" not in evaluation.description
    assert evaluation.metadata["unexpected_image_ids"].value == [image_id]
    assert evaluation.metadata["documented_exceptions"].value == [
        "chexlocalize/patient65086_study1_view1_frontal"
    ]
