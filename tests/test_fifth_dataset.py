"""A fifth dataset is one module plus one registry line: the toy dataset of toy_dataset.py,
registered in a fresh process, goes through every stage and the manifest."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from commands import run_ok
from PIL import Image, ImageDraw
from toy_dataset import CSV_NAME, FOLDER, IMAGES, NATIVE_COLUMN, nodule_size, write_toy_dataset

from radharmony_pipeline.processing.storage import output_layout as layout
from radharmony_pipeline.sources import partition_keys
from radharmony_pipeline.synthetic import generated_datasets

pytestmark = pytest.mark.build  # every test reads the toy dataset's build

SCRIPT = Path(__file__).with_name("toy_dataset.py")


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    folder = tmp_path_factory.mktemp("toy")
    write_toy_dataset(folder / "data")
    environ = {k: v for k, v in os.environ.items() if not k.startswith("RADHARMONY_")}
    environ["RADHARMONY_WORKERS"] = "2"
    command = [sys.executable, str(SCRIPT), str(folder / "data"), str(folder / "out")]
    completed = run_ok(command, env=environ, cwd=folder, timeout=300)
    return folder, json.loads(completed.stdout.strip().splitlines()[-1])


def test_a_dataset_without_a_generator_leaves_the_synthetic_data_to_the_others(toy):
    """The toy names no synthetic generator: `generate_datasets()` (the demo's and the
    fixtures' call) writes the other datasets, and the demo builds their partitions only."""
    _, summary = toy
    assert list(summary["synthetic"]) == list(generated_datasets())
    assert "toy_cxr" not in summary["synthetic"]
    assert all(Path(root).is_dir() for root in summary["synthetic"].values())
    assert summary["demo_partitions"] == partition_keys()
    assert "no synthetic generator for 'toy_cxr'" in summary["toy_generation_refused"]


def test_registering_the_dataset_adds_its_partitions_and_config(toy):
    _, summary = toy
    assert summary["partitions"] == [*partition_keys(), "toy_cxr.train", "toy_cxr.test"]
    assert "toy_cxr" in summary["datasets_config"]
    assert "toy_cxr.train" not in partition_keys(), "this process's registry is untouched"


@pytest.mark.parametrize("partition", ["toy_cxr.train", "toy_cxr.test"])
def test_every_stage_materializes_with_every_check_passing(toy, partition):
    _, summary = toy
    outcome = summary[partition]
    assert outcome["success"]
    assert outcome["materialized"] == [
        "bboxes",
        "images",
        "labels",
        "masks",
        "partition_profile",
        "raw_index",
        "report_labels",
    ]
    assert {
        "counts_match_documentation",
        "raw_index_suite",
        "labels_suite",
        "masks_match_documentation",
        "bboxes_match_documentation",
    } <= set(outcome["checks"])
    assert [name for name, passed in outcome["checks"].items() if not passed] == []


def test_the_manifest_holds_every_toy_image_with_its_box_and_mask(toy):
    folder, summary = toy
    outcome = summary["unified_manifest"]
    assert outcome["success"]
    unconfigured = set(outcome["parent_not_configured"])
    assert "chestx_det_images_found_in_nih" in unconfigured
    assert [n for n, ok in outcome["checks"].items() if not ok and n not in unconfigured] == []
    output = folder / "out"
    manifest = pd.read_parquet(output / layout.MANIFEST)
    csv = pd.read_csv(folder / "data" / FOLDER / CSV_NAME)
    assert sorted(manifest["image_id"]) == sorted("toy_cxr/" + csv["image"].str[:-4])
    for name, split, height, width, x, y, w, h in IMAGES:
        row = manifest.set_index("image_id").loc[f"toy_cxr/{name}"]
        assert row["split"] == split and (row["orig_height"], row["orig_width"]) == (height, width)
        assert row["label_nodule"] == int(w > 0)
        if w == 0:
            # Segmented but without a finding: annotated as empty, not "not annotated".
            assert len(row["bboxes"]) == 0 and row["has_mask"] and len(row["mask_classes"]) == 0
            continue
        assert np.allclose(
            row["bboxes"][0], [y / height, (y + h) / height, x / width, (x + w) / width]
        )
        masks = pd.read_parquet(layout.table_file(output, "masks", f"toy_cxr.{split}"))
        path = masks.set_index(["image_id", "mask_class"]).loc[(f"toy_cxr/{name}", "nodule")]
        with Image.open(output / path["mask_path"]) as image:
            got = np.asarray(image) > 0
        reference = Image.new("1", (width, height), 0)
        ImageDraw.Draw(reference).rectangle([x, y, x + w - 1, y + h - 1], fill=1)
        # Polygon edges on the box boundary may rasterize one pixel either way.
        assert np.abs(got.astype(int) - np.asarray(reference)).sum() <= 2 * (w + h) + 4
        with Image.open(output / row["image_path"]) as image:
            assert image.size == (224, 224)


@pytest.mark.parametrize("split", ["train", "test"])
def test_the_datasets_own_label_column_reaches_its_labels_table(toy, split):
    """Declared only in the toy's module, the native column is written with its values, as
    a nullable column of the one `labels` table (whose other partitions are null there)."""
    folder, _ = toy
    path = layout.table_file(folder / "out", "labels", f"toy_cxr.{split}")
    labels = pd.read_parquet(path).set_index("image_id")
    assert pq.read_schema(path).field(NATIVE_COLUMN).type == pa.string()
    columns = list(labels.columns)
    assert columns.index(NATIVE_COLUMN) < columns.index("status")
    expected = {f"toy_cxr/{name}": nodule_size(w, h) for name, s, *_, w, h in IMAGES if s == split}
    got = {image_id: (None if pd.isna(v) else v) for image_id, v in labels[NATIVE_COLUMN].items()}
    assert got == expected
    assert {"large", "small"} & set(got.values()), "the toy data grades at least one nodule"
