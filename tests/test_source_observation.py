"""`source_files` observations: per-partition metadata and what changed since the last one."""

from __future__ import annotations

import json
import os

import dagster as dg
import pytest

from radharmony_pipeline.definitions import build_definitions
from radharmony_pipeline.defs.jobs import OBSERVE_JOB
from radharmony_pipeline.processing.storage.output_layout import source_snapshot
from radharmony_pipeline.processing.storage.source_snapshot import compare, describe_changes
from radharmony_pipeline.sources import partition_keys


def observe(data_root, output, instance) -> dict[str, dg.AssetObservation]:
    job = build_definitions(data_root, output).resolve_job_def(OBSERVE_JOB)
    result = job.execute_in_process(instance=instance)
    assert result.success
    return {
        event.asset_observation_data.asset_observation.partition: (
            event.asset_observation_data.asset_observation
        )
        for event in result.all_events
        if event.event_type == dg.DagsterEventType.ASSET_OBSERVATION
    }


@pytest.mark.build
def test_each_partition_observation_lists_its_files_and_what_changed(tiny_copy, tmp_path):
    instance = dg.DagsterInstance.ephemeral()
    first = observe(tiny_copy, tmp_path / "out", instance)
    assert set(first) == set(partition_keys())
    det = first["chestx_det.train"]
    assert det.tags["dagster/data_version"]
    assert list(det.metadata["annotation_files"].value) == ["ChestX_Det_train.json"]
    assert det.metadata["images"].value == len(
        list((tiny_copy / "chestx-det" / "train").glob("*.png"))
    )
    assert "first observation" in det.metadata["changes"].value
    snapshots = {key: tmp_path / "out" / source_snapshot(key) for key in first}
    written = {key: path.stat().st_mtime_ns for key, path in snapshots.items()}

    # One annotation file edited, one image replaced, one added, one removed.
    annotation = tiny_copy / "chestx-det" / "ChestX_Det_train.json"
    annotation.write_text(json.dumps(json.loads(annotation.read_text()), indent=1))
    images = sorted((tiny_copy / "chestx-det" / "train").glob("*.png"))
    images[0].write_bytes(images[0].read_bytes() + b"\0")
    (images[1].parent / "added.png").write_bytes(images[1].read_bytes())
    images[2].unlink()
    second = observe(tiny_copy, tmp_path / "out", instance)

    changed = second["chestx_det.train"].metadata
    assert (
        second["chestx_det.train"].tags["dagster/data_version"] != det.tags["dagster/data_version"]
    )
    assert changed["annotation_files_changed"].value["modified"] == ["ChestX_Det_train.json"]
    assert changed["images_added_names"].value == ["added.png"]
    assert changed["images_removed_names"].value == [images[2].name]
    assert changed["images_modified_names"].value == [images[0].name]
    assert (changed["images_added"].value, changed["images_removed"].value) == (1, 1)
    assert "ChestX_Det_train.json" in changed["changes"].value
    # The other partitions are unchanged, with the same data version.
    untouched = second["chestx_det.test"]
    assert untouched.metadata["changes"].value == "unchanged since the previous observation"
    assert untouched.tags == first["chestx_det.test"].tags
    # Only the changed partition's snapshot is written again.
    rewritten = {key for key, path in snapshots.items() if path.stat().st_mtime_ns != written[key]}
    assert rewritten == {"chestx_det.train"}


@pytest.mark.build
def test_a_missing_annotation_file_is_reported_not_raised(tiny_copy, tmp_path):
    os.remove(tiny_copy / "chestx-det" / "ChestX_Det_test.json")
    observed = observe(tiny_copy, tmp_path / "out", dg.DagsterInstance.ephemeral())
    assert observed["chestx_det.test"].metadata["annotation_files_missing"].value == [
        "ChestX_Det_test.json"
    ]


def test_change_summary_names_a_few_images_and_counts_all():
    images = compare({f"{i}.png": (1, 1) for i in range(5)}, {f"{i}.png": (1, 2) for i in range(5)})
    assert images.modified == [f"{i}.png" for i in range(5)]
    text = describe_changes(compare({}, {}), images)
    assert text.startswith("5 image(s) modified (0.png, 1.png, 2.png, …)")
