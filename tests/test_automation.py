"""Incremental rebuilds: which partitions the automation requests after each kind of change."""

from __future__ import annotations

import json
import os
import time

import dagster as dg
import pytest

from radharmony_pipeline.definitions import defs
from radharmony_pipeline.defs.io_managers import ParquetIOManager
from radharmony_pipeline.defs.jobs import all_stages_job, manifest_job, observe_source_files_job
from radharmony_pipeline.defs.resources import DatasetsResource, OutputsResource
from radharmony_pipeline.sources import partition_keys

STAGES = ("raw_index", "labels", "masks", "bboxes", "images")
QUIET = {"loggers": {"console": {"config": {"log_level": "ERROR"}}}}


class Deployment:
    """The project's definitions on private data, an instance, and the automation cursor."""

    def __init__(self, data_root, output):
        outputs = OutputsResource(output_root=str(output))
        self.defs = dg.Definitions(
            assets=list(defs.assets),
            asset_checks=list(defs.asset_checks),
            jobs=[observe_source_files_job, all_stages_job, manifest_job],
            resources={
                "datasets": DatasetsResource(data_root=str(data_root)),
                "outputs": outputs,
                "io_manager": ParquetIOManager(outputs=outputs),
            },
        )
        self.instance = dg.DagsterInstance.ephemeral()
        self.cursor = None

    def run(self, job: str, partition: str | None = None, assets: tuple[str, ...] = ()) -> None:
        result = self.defs.resolve_job_def(job).execute_in_process(
            partition_key=partition,
            instance=self.instance,
            run_config=QUIET,
            asset_selection=[dg.AssetKey(name) for name in assets] or None,
        )
        assert result.success

    def requested_after_observation(self) -> dict[str, set[str]]:
        self.run("observe_source_files")
        return self.evaluate()

    def evaluate(self) -> dict[str, set[str]]:
        result = dg.evaluate_automation_conditions(
            defs=self.defs, instance=self.instance, cursor=self.cursor
        )
        self.cursor = result.cursor
        requested = {}
        for key in (*STAGES, "unified_manifest"):
            if result.get_num_requested(dg.AssetKey(key)):
                partitions = result.get_requested_partitions(dg.AssetKey(key))
                requested[key] = {p for p in partitions if p is not None}
        return requested


@pytest.fixture
def deployment(tiny_copy, tmp_path):
    deployment = Deployment(tiny_copy, tmp_path / "out")
    deployment.run("observe_source_files")
    for key in partition_keys():
        deployment.run("all_stages", key)
    deployment.run("manifest")
    assert deployment.evaluate() == {}
    return deployment


def test_nothing_changed_requests_nothing(deployment):
    assert deployment.requested_after_observation() == {}


def test_changed_annotation_file_rebuilds_its_partition_then_the_manifest(deployment, tiny_copy):
    path = tiny_copy / "chestx-det" / "ChestX_Det_train.json"
    path.write_text(json.dumps(json.loads(path.read_text()), indent=1))
    assert deployment.requested_after_observation() == {
        stage: {"chestx_det.train"} for stage in STAGES
    }
    deployment.run("all_stages", "chestx_det.train")
    assert deployment.evaluate() == {"unified_manifest": set()}


def test_one_changed_partition_yields_one_manifest_after_its_stages(deployment, tiny_copy):
    """However the stages land (here one level per run, as a backfill launches them), the
    manifest is requested once, after the last of them, and never alongside them."""
    path = tiny_copy / "chestx-det" / "ChestX_Det_train.json"
    path.write_text(json.dumps(json.loads(path.read_text()), indent=1))
    assert deployment.requested_after_observation() == {
        stage: {"chestx_det.train"} for stage in STAGES
    }
    manifest_requests = 0
    for level in (("raw_index", "labels"), ("masks", "bboxes"), ("images",)):
        deployment.run("all_stages", "chestx_det.train", assets=level)
        requested = deployment.evaluate()
        # Only that partition's stages may be asked for while it is being rebuilt.
        assert set(requested) - {"unified_manifest"} <= set(STAGES)
        assert all(p == {"chestx_det.train"} for k, p in requested.items() if k in STAGES)
        if "unified_manifest" in requested:
            manifest_requests += 1
            assert level == ("images",), f"manifest requested before the stages finished: {level}"
    assert manifest_requests == 1
    deployment.run("manifest")
    assert deployment.evaluate() == {}


def test_shared_annotation_file_rebuilds_every_split_it_describes(deployment, tiny_copy):
    path = tiny_copy / "ms-cxr" / "MS_CXR_Local_Alignment_v1.1.0.csv"
    path.write_text(path.read_text() + "\n")
    assert deployment.requested_after_observation() == {
        stage: {"ms_cxr.train", "ms_cxr.val", "ms_cxr.test"} for stage in STAGES
    }


def test_replaced_image_rebuilds_only_its_partition(deployment, tiny_copy):
    image = sorted((tiny_copy / "chexlocalize" / "CheXpert" / "val").rglob("*.jpg"))[0]
    time.sleep(0.01)
    image.write_bytes(image.read_bytes())
    os.utime(image, None)
    assert deployment.requested_after_observation() == {
        stage: {"chexlocalize.val"} for stage in STAGES
    }
