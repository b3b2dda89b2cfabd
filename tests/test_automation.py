"""Incremental rebuilds: which partitions the automation requests after each kind of change."""

from __future__ import annotations

import importlib
import json
import os
import shutil

import dagster as dg
import pandas as pd
import pytest

from radharmony_pipeline.definitions import build_definitions
from radharmony_pipeline.defs.assets import report_labels as report_labels_asset
from radharmony_pipeline.processing.reports import labeler_version
from radharmony_pipeline.processing.tables.table_schemas import PARTITION_TABLES
from radharmony_pipeline.sources import partition_keys

pytestmark = pytest.mark.build

STAGES = PARTITION_TABLES
QUIET = {"loggers": {"console": {"config": {"log_level": "ERROR"}}}}


class Deployment:
    """The project's definitions on private data, an instance, and the automation cursor."""

    def __init__(self, data_root, output):
        self.roots = (data_root, output)
        self.defs = build_definitions(data_root, output)
        self.instance = dg.DagsterInstance.ephemeral()
        self.cursor = None

    def run(self, job: str | None, partition: str | None = None, assets: tuple[str, ...] = ()):
        """One run of `job` (None: every asset, for a selection across jobs)."""
        definition = (
            self.defs.resolve_job_def(job)
            if job
            else self.defs.resolve_implicit_global_asset_job_def()
        )
        result = definition.execute_in_process(
            partition_key=partition,
            instance=self.instance,
            run_config=QUIET,
            asset_selection=[dg.AssetKey(name) for name in assets] or None,
        )
        assert result.success

    def requested_after_observation(self) -> dict[str, set[str]]:
        self.run("observe_source_files")
        return self.evaluate()

    def evaluate(
        self, keys: tuple[str, ...] = (*STAGES, "unified_manifest")
    ) -> dict[str, set[str]]:
        """The partitions requested of each of `keys` (the stages and the manifest)."""
        result = dg.evaluate_automation_conditions(
            defs=self.defs, instance=self.instance, cursor=self.cursor
        )
        self.cursor = result.cursor
        requested = {}
        for key in keys:
            if result.get_num_requested(dg.AssetKey(key)):
                partitions = result.get_requested_partitions(dg.AssetKey(key))
                requested[key] = {p for p in partitions if p is not None}
        return requested

    def settle(self) -> None:
        """Rebuild whatever the last change made stale, so the next test starts up to date."""
        requested = self.requested_after_observation()
        stale = set().union(*(requested.get(stage, set()) for stage in STAGES))
        for partition in sorted(stale):
            self.run("all_stages", partition)
        if requested:
            self.run("manifest")
        assert self.evaluate() == {}


@pytest.fixture(scope="module")
def built(tiny_root, tiny_corpus, tmp_path_factory):
    """Every partition and the manifest built once for the module, on a private data copy.
    The outputs start as a copy of the session's tiny corpus, so these runs reuse its images
    and masks (the instance, which the automation reads, still records every run)."""
    folder = tmp_path_factory.mktemp("automation")
    data = folder / "data"
    shutil.copytree(tiny_root, data)
    shutil.copytree(tiny_corpus[0], folder / "out")
    deployment = Deployment(data, folder / "out")
    deployment.run("observe_source_files")
    for key in partition_keys():
        deployment.run("all_stages", key)
    deployment.run("manifest")
    assert deployment.evaluate() == {}
    return deployment, data


@pytest.fixture
def deployment(built):
    """The module's deployment, brought up to date after the previous test's change."""
    deployment, _ = built
    deployment.settle()
    return deployment


@pytest.fixture
def data(built):
    """The deployment's datasets; a test may change them (the next test rebuilds)."""
    return built[1]


def test_nothing_changed_requests_nothing(deployment):
    assert deployment.requested_after_observation() == {}


def test_a_new_labeler_version_relabels_every_report_and_redoes_nothing_else(
    deployment, monkeypatch
):
    """The labeler's version is its asset's code version: a changed phrase list makes every
    partition's report labels stale with what reads them (its exports and profile, then the
    manifest, the corpus profile and the card), and no other stage."""
    monkeypatch.setattr(labeler_version, "LABELER_VERSION", "report-rules-edited")
    try:
        importlib.reload(report_labels_asset)
        deployment.defs = build_definitions(*deployment.roots)
        every = tuple(
            key.to_user_string()
            for key in deployment.defs.resolve_asset_graph().get_all_asset_keys()
        )
        # The sensor's next tick after the new code is loaded.
        deployment.run("observe_source_files")
        requested = deployment.evaluate(every)
        partitions = set(partition_keys())
        readers = {"report_labels", "partition_profile", "huggingface_export", "webdataset_export"}
        assert requested == dict.fromkeys(readers, partitions)
        for partition in sorted(partitions):
            deployment.run(None, partition, assets=tuple(sorted(readers)))
        assert deployment.evaluate(every) == {
            "unified_manifest": set(),
            "corpus_profile": set(),
            "corpus_card": set(),
        }
        deployment.run("manifest")
        deployment.run("dataset_card")
        assert deployment.evaluate(every) == {}
        tables = deployment.roots[1] / "tables" / "report_labels"
        versions = {
            version
            for path in tables.glob("*.parquet")
            for version in pd.read_parquet(path, columns=["report_labeler_version"]).iloc[:, 0]
        }
        assert "report-rules-edited" in versions
        manifest = pd.read_parquet(deployment.roots[1] / "tables" / "unified_manifest.parquet")
        assert manifest.filter(like="report_label_").notna().any().any()
    finally:
        monkeypatch.undo()
        importlib.reload(report_labels_asset)
        deployment.defs = build_definitions(*deployment.roots)


def test_changed_annotation_file_rebuilds_its_partition_then_the_manifest(deployment, data):
    path = data / "chestx-det" / "ChestX_Det_train.json"
    path.write_text(json.dumps(json.loads(path.read_text()), indent=1))
    assert deployment.requested_after_observation() == {
        stage: {"chestx_det.train"} for stage in STAGES
    }
    deployment.run("all_stages", "chestx_det.train")
    assert deployment.evaluate() == {"unified_manifest": set()}


def test_one_changed_partition_yields_one_manifest_after_its_stages(deployment, data):
    """However the stages land (here one level per run, as a backfill launches them), the
    manifest is requested once, after the last of them, and never alongside them."""
    path = data / "chestx-det" / "ChestX_Det_train.json"
    path.write_text(json.dumps(json.loads(path.read_text()), indent=2))
    assert deployment.requested_after_observation() == {
        stage: {"chestx_det.train"} for stage in STAGES
    }
    manifest_requests = 0
    for level in (("raw_index", "labels"), ("masks", "bboxes", "report_labels"), ("images",)):
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


def test_shared_annotation_file_rebuilds_every_split_it_describes(deployment, data):
    path = data / "ms-cxr" / "MS_CXR_Local_Alignment_v1.1.0.csv"
    path.write_text(path.read_text() + "\n")
    assert deployment.requested_after_observation() == {
        stage: {"ms_cxr.train", "ms_cxr.val", "ms_cxr.test"} for stage in STAGES
    }


def test_replaced_image_rebuilds_only_its_partition(deployment, data):
    image = sorted((data / "chexlocalize" / "CheXpert" / "val").rglob("*.jpg"))[0]
    before = image.stat()
    image.write_bytes(image.read_bytes())
    # Replaced with the same bytes: only its modification time tells, set a second later than
    # it was rather than waiting for the clock to move.
    os.utime(image, ns=(before.st_atime_ns, before.st_mtime_ns + 1_000_000_000))
    assert deployment.requested_after_observation() == {
        stage: {"chexlocalize.val"} for stage in STAGES
    }
