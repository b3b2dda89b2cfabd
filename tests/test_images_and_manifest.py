"""images + unified_manifest on tiny synthetic data: geometry, packed arrays, reuse, loader."""

from __future__ import annotations

import dagster as dg
import numpy as np
import pandas as pd
import pytest
from PIL import Image

from radharmony_pipeline.definitions import defs
from radharmony_pipeline.defs.assets.source_files import source_files
from radharmony_pipeline.defs.io_managers import ParquetIOManager
from radharmony_pipeline.defs.resources import DatasetsResource, OutputsResource
from radharmony_pipeline.loader import ManifestDataset
from radharmony_pipeline.processing.manifest import MANIFEST_COLUMNS
from radharmony_pipeline.sources import partition_keys

PARTITIONED = [d for d in [*defs.assets, *defs.asset_checks] if d is not source_files]


def resources(data_root, output) -> dict:
    return {
        "datasets": DatasetsResource(data_root=str(data_root)),
        "outputs": OutputsResource(output_root=str(output)),
        "io_manager": ParquetIOManager(outputs=OutputsResource(output_root=str(output))),
    }


@pytest.fixture(scope="module")
def corpus(tiny_root, tmp_path_factory):
    output = tmp_path_factory.mktemp("corpus")
    partition_job = dg.define_asset_job(
        "partitions",
        selection=dg.AssetSelection.all()
        - dg.AssetSelection.groups("manifest")
        - dg.AssetSelection.assets(source_files.key),
    )
    manifest_job = dg.define_asset_job("joined", selection=dg.AssetSelection.groups("manifest"))
    built = dg.Definitions(
        assets=[d for d in defs.assets if d is not source_files],
        asset_checks=list(defs.asset_checks),
        jobs=[partition_job, manifest_job],
        resources=resources(tiny_root, output),
    )
    instance = dg.DagsterInstance.ephemeral()
    first = {}
    for key in partition_keys():
        first[key] = built.resolve_job_def("partitions").execute_in_process(
            partition_key=key, instance=instance
        )
    manifest = built.resolve_job_def("joined").execute_in_process(instance=instance)
    return output, first, manifest, built, instance


def images_metadata(result) -> dict:
    event = next(
        e
        for e in result.get_asset_materialization_events()
        if e.materialization.asset_key == dg.AssetKey("images")
    )
    return {k: v.value for k, v in event.materialization.metadata.items()}


def test_every_image_is_packed_and_written_at_the_target_size(corpus):
    output, first, _, _, _ = corpus
    for key, result in first.items():
        table = pd.read_parquet(output / "tables" / "images" / f"{key}.parquet")
        assert (table["status"] == "ok").all(), table["error"].dropna().tolist()
        packed = np.load(output / "images" / f"{key}.npy", mmap_mode="r")
        assert packed.shape == (len(table), 224, 224) and packed.dtype == np.uint8
        for row in table.itertuples():
            with Image.open(output / row.image_path) as image:
                assert image.size == (224, 224)
                assert np.array_equal(np.asarray(image), packed[row.tensor_index])
        assert images_metadata(result)["decoded"] == len(table)
    assert not list(output.rglob(".partial-*"))


def test_second_run_of_an_unchanged_partition_decodes_at_most_5_percent(corpus):
    _output, first, _, built, instance = corpus
    again = built.resolve_job_def("partitions").execute_in_process(
        partition_key="chexlocalize.test", instance=instance
    )
    before = images_metadata(first["chexlocalize.test"])["decoded"]
    assert images_metadata(again)["decoded"] <= 0.05 * before
    assert images_metadata(again)["reused"] == before


def test_union_mask_follows_the_image_geometry(corpus):
    output, _, _, _, _ = corpus
    table = pd.read_parquet(output / "tables" / "images" / "chexlocalize.test.parquet")
    with_mask = table[table["mask_path"].notna()]
    assert len(with_mask) == len(table)
    row = with_mask.iloc[0]
    with Image.open(output / row["mask_path"]) as mask:
        values = np.asarray(mask)
    assert values.shape == (224, 224) and set(np.unique(values)) <= {0, 255}
    # Letterbox: padding bands stay empty in the mask and the image.
    if row["pad_left"] > 0:
        assert values[:, : row["pad_left"]].max() == 0


def test_manifest_has_the_contract_columns_and_every_usable_image(corpus):
    output, first, manifest_result, _, _ = corpus
    assert manifest_result.success
    for evaluation in manifest_result.get_asset_check_evaluations():
        if evaluation.severity == dg.AssetCheckSeverity.ERROR:
            assert evaluation.passed, (evaluation.check_name, evaluation.metadata)
    manifest = pd.read_parquet(output / "tables" / "unified_manifest.parquet")
    assert list(manifest.columns) == [*MANIFEST_COLUMNS, "duplicate_group"]
    images = sum(
        len(pd.read_parquet(output / "tables" / "raw_index" / f"{k}.parquet")) for k in first
    )
    assert len(manifest) == images and manifest["image_id"].is_unique
    assert manifest["report"].dropna().ne("None").all()
    ms_cxr = manifest[manifest["dataset"] == "ms_cxr"]
    assert ms_cxr["bboxes"].map(len).gt(0).all()
    assert (ms_cxr["bboxes"].map(len) == ms_cxr["bboxes_resized"].map(len)).all()


def test_resized_boxes_account_for_letterbox_padding(corpus):
    output, _, _, _, _ = corpus
    manifest = pd.read_parquet(output / "tables" / "unified_manifest.parquet")
    row = manifest[manifest["dataset"] == "ms_cxr"].iloc[0]
    height, width = row["orig_height"], row["orig_width"]
    scale = 224 / max(height, width)
    pad_top = (224 - round(height * scale)) // 2
    y_min = row["bboxes"][0][0]
    assert row["bboxes_resized"][0][0] == pytest.approx(
        (pad_top + y_min * round(height * scale)) / 224, abs=1 / 224
    )


def test_loader_reads_the_manifest(corpus):
    output, _, _, _, _ = corpus
    dataset = ManifestDataset(
        output / "tables" / "unified_manifest.parquet", datasets="chexlocalize", splits="test"
    )
    sample = dataset[0]
    img, mask, cls = (np.asarray(sample[k]) for k in ("img", "mask", "cls"))
    assert img.shape == (1, 224, 224) and img.min() >= -1 and img.max() <= 1
    assert set(np.unique(mask)) <= {0.0, 1.0}
    assert cls.shape == (21,) and np.isnan(cls).sum() == 7
    rex = ManifestDataset(output / "tables" / "unified_manifest.parquet", datasets="rexgradient")
    reports = [rex[i]["report"] for i in range(len(rex))]
    assert None in reports and "None" not in reports
