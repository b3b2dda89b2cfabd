"""images + unified_manifest on tiny synthetic data: geometry, packed arrays, reuse, loader."""

from __future__ import annotations

import dagster as dg
import numpy as np
import pandas as pd
import pytest
from PIL import Image

from radharmony_pipeline.definitions import build_definitions
from radharmony_pipeline.loader import ManifestDataset
from radharmony_pipeline.processing.corpus.parents import PARENT_IDENTITY
from radharmony_pipeline.processing.storage import output_layout as layout
from radharmony_pipeline.processing.tables import suite_validation
from radharmony_pipeline.processing.tables.manifest import PARTITION_MANIFEST_COLUMNS
from radharmony_pipeline.processing.tables.table_schemas import UNIFIED_MANIFEST
from radharmony_pipeline.sources import parse_partition_key

pytestmark = pytest.mark.build

S = 224


@pytest.fixture(scope="module")
def corpus(tiny_root, tiny_corpus):
    """The session's tiny corpus (every partition's `all_stages` run, then the manifest)."""
    output, first, manifest = tiny_corpus
    return output, first, manifest, build_definitions(tiny_root, output)


def letterbox_placement(height: int, width: int) -> tuple[int, int, int, int]:
    """(top, left, height, width) of the content in the S×S frame: the test's own arithmetic
    (long side to S, short side in proportion with halves rounded up, centred)."""
    scale = S / max(height, width)
    new_height, new_width = (max(1, int(np.floor(n * scale + 0.5))) for n in (height, width))
    return (S - new_height) // 2, (S - new_width) // 2, new_height, new_width


def images_metadata(result) -> dict:
    event = next(
        e
        for e in result.get_asset_materialization_events()
        if e.materialization.asset_key == dg.AssetKey("images")
    )
    return {k: v.value for k, v in event.materialization.metadata.items()}


def test_every_image_is_packed_and_written_at_the_target_size(corpus):
    output, first, _, _ = corpus
    for key, result in first.items():
        table = pd.read_parquet(layout.table_file(output, "images", key))
        assert (table["status"] == "ok").all(), table["error"].dropna().tolist()
        packed = np.load(output / layout.packed_images(key), mmap_mode="r")
        assert packed.shape == (len(table), 224, 224) and packed.dtype == np.uint8
        for row in table.itertuples():
            with Image.open(output / row.image_path) as image:
                assert image.size == (224, 224)
                assert np.array_equal(np.asarray(image), packed[row.tensor_index])
        assert images_metadata(result)["decoded"] == len(table)
    assert not list(output.rglob(".partial-*"))


def test_second_run_of_an_unchanged_partition_decodes_at_most_5_percent(
    corpus, tiny_root, tiny_corpus_copy, monkeypatch
):
    _output, first, _, _ = corpus
    validated = []
    monkeypatch.setattr(
        suite_validation, "validate_suite", lambda frame, suite, *_: validated.append(suite)
    )
    again = (
        build_definitions(tiny_root, tiny_corpus_copy)
        .resolve_job_def("all_stages")
        .execute_in_process(partition_key="chexlocalize.test")
    )
    before = images_metadata(first["chexlocalize.test"])["decoded"]
    assert images_metadata(again)["decoded"] <= 0.05 * before
    assert images_metadata(again)["reused"] == before
    # Every suite's table is the one validated before: its kept report, no validation.
    suites = {
        check.check_name
        for check in again.get_asset_check_evaluations()
        if "suite" in check.check_name
    }
    assert suites >= {"raw_index_suite", "labels_suite", "masks_suite", "bboxes_suite"}
    assert validated == []


def test_union_mask_follows_the_image_geometry(corpus):
    output, _, _, _ = corpus
    table = pd.read_parquet(layout.table_file(output, "images", "chexlocalize.test"))
    with_mask = table[table["mask_path"].notna()]
    # Frontals are segmented (a union mask, possibly empty); laterals are not annotated.
    frontal = table["image_id"].str.endswith("_frontal")
    assert with_mask["image_id"].tolist() == table.loc[frontal, "image_id"].tolist()
    row = with_mask.iloc[0]
    with Image.open(output / row["mask_path"]) as mask:
        values = np.asarray(mask)
    assert values.shape == (224, 224) and set(np.unique(values)) <= {0, 255}


def test_padding_bands_stay_empty_in_images_and_masks(corpus):
    output, first, _, _ = corpus
    padded = 0
    for key in first:
        table = pd.read_parquet(layout.table_file(output, "images", key))
        for row in table.itertuples():
            top, left, height, width = letterbox_placement(row.orig_height, row.orig_width)
            assert (row.pad_top, row.pad_left) == (top, left), row.image_id
            band = np.ones((S, S), dtype=bool)
            band[top : top + height, left : left + width] = False
            padded += int(band.any())
            files = [row.image_path] + ([row.mask_path] if isinstance(row.mask_path, str) else [])
            for path in files:
                with Image.open(output / path) as image:
                    assert np.asarray(image)[band].max(initial=0) == 0, path
    assert padded > 0, "the tiny datasets have non-square images, so some rows are padded"


def reference_letterbox(path) -> np.ndarray:
    """The test's own decode + letterbox: Pillow decode, Pillow box-filter resize (area
    average, as for a shrink), centred in black."""
    with Image.open(path) as image:
        gray = image.convert("L")
    top, left, height, width = letterbox_placement(gray.height, gray.width)
    frame = Image.new("L", (S, S), 0)
    frame.paste(gray.resize((width, height), Image.Resampling.BOX), (left, top))
    return np.asarray(frame).astype(int)


@pytest.mark.parametrize("partition", ["rexgradient.val", "chexlocalize.test", "chestx_det.test"])
def test_images_stage_pixels_match_an_independent_decode_and_letterbox(
    corpus, tiny_root, partition
):
    output, _, _, built = corpus
    dataset, split = parse_partition_key(partition)
    source_dir = built.resources["datasets"].source(dataset).image_dir(split)
    index = pd.read_parquet(layout.table_file(output, "raw_index", partition))
    images = pd.read_parquet(layout.table_file(output, "images", partition))
    rows = index.merge(images, on="image_id", suffixes=("", "_out"))
    compared = 0
    for row in rows.itertuples():
        with Image.open(source_dir / row.image_path) as image:
            if image.mode != "L":
                continue  # 16-bit and RGBA PNGs follow their own decode rules (test_decode.py)
        expected = reference_letterbox(source_dir / row.image_path)
        with Image.open(output / row.image_path_out) as image:
            got = np.asarray(image).astype(int)
        # OpenCV's area resize and Pillow's box filter round differently, and JPEGs much
        # larger than S decode at reduced DCT scale: small per-pixel differences only.
        difference = np.abs(got - expected)
        assert difference.mean() < 2.0, (row.image_id, difference.mean())
        assert np.percentile(difference, 99) <= 16, row.image_id
        compared += 1
    assert compared > 0, "the partition has 8-bit images to compare"


def test_manifest_has_the_contract_columns_and_every_usable_image(corpus):
    output, first, manifest_result, _ = corpus
    assert manifest_result.success
    evaluations = manifest_result.get_asset_check_evaluations()
    blocking = [e for e in evaluations if e.severity == dg.AssetCheckSeverity.ERROR]
    assert "manifest_totals_match_documentation" in {e.check_name for e in blocking}
    assert [(e.check_name, e.metadata) for e in blocking if not e.passed] == []
    manifest = pd.read_parquet(output / layout.MANIFEST)
    assert list(manifest.columns) == [
        *PARTITION_MANIFEST_COLUMNS,
        "duplicate_group",
        *PARENT_IDENTITY,
    ]
    images = sum(len(pd.read_parquet(layout.table_file(output, "raw_index", k))) for k in first)
    assert len(manifest) == images and manifest["image_id"].is_unique
    assert manifest["report"].dropna().ne("None").all()
    ms_cxr = manifest[manifest["dataset"] == "ms_cxr"]
    assert ms_cxr["bboxes"].map(len).gt(0).all()
    assert (ms_cxr["bboxes"].map(len) == ms_cxr["bboxes_resized"].map(len)).all()


def test_resized_boxes_account_for_letterbox_padding(corpus):
    output, _, _, _ = corpus
    manifest = pd.read_parquet(output / layout.MANIFEST)
    row = manifest[manifest["dataset"] == "ms_cxr"].iloc[0]
    height, width = row["orig_height"], row["orig_width"]
    scale = 224 / max(height, width)
    pad_top = (224 - round(height * scale)) // 2
    y_min = row["bboxes"][0][0]
    assert row["bboxes_resized"][0][0] == pytest.approx(
        (pad_top + y_min * round(height * scale)) / 224, abs=1 / 224
    )


def test_loader_reads_the_manifest(corpus):
    output, _, _, _ = corpus
    dataset = ManifestDataset(output / layout.MANIFEST, datasets="chexlocalize", splits="test")
    sample = dataset[0]
    img, mask, cls = (np.asarray(sample[k]) for k in ("img", "mask", "cls"))
    assert img.shape == (1, 224, 224) and img.min() >= -1 and img.max() <= 1
    assert set(np.unique(mask)) <= {0.0, 1.0}
    assert cls.shape == (21,) and np.isnan(cls).sum() == 7
    rex = ManifestDataset(output / layout.MANIFEST, datasets="rexgradient")
    reports = [rex[i]["report"] for i in range(len(rex))]
    assert None in reports and "None" not in reports


def test_manifest_column_lineage_names_real_upstream_columns(corpus):
    output, _, manifest, _ = corpus
    (event,) = [
        e
        for e in manifest.get_asset_materialization_events()
        if e.asset_key == dg.AssetKey("unified_manifest")
    ]
    metadata = event.materialization.metadata
    lineage = metadata["dagster/column_lineage"].value.deps_by_column
    assert set(lineage) == set(UNIFIED_MANIFEST.names)
    readable = metadata["column_lineage"].value
    for column, deps in lineage.items():
        assert deps, column
        for dep in deps:
            asset = dep.asset_key.to_user_string()
            upstream = set()
            tables = layout.tables_folder(output)
            for table in [*(tables / asset).glob("*.parquet"), *tables.glob(f"{asset}.parquet")]:
                upstream |= set(pd.read_parquet(table).columns)
            assert dep.column_name in upstream, (column, asset, dep.column_name)
            assert f"`{dep.column_name}`" in readable
        assert f"| `{column}` | [" in readable, column
