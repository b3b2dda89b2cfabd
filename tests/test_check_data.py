"""`radharmony check-data`: a line per partition, a non-zero exit naming the fix for a broken
download, and the same findings on the `source_files` observations; a broken partition fails
its run."""

from __future__ import annotations

import shutil

import dagster as dg
import pytest

from radharmony_pipeline.cli import main
from radharmony_pipeline.definitions import build_definitions
from radharmony_pipeline.defs.jobs import ALL_STAGES_JOB, OBSERVE_JOB
from radharmony_pipeline.sources import partition_keys


@pytest.fixture
def clean_env(monkeypatch):
    """No RADHARMONY_* variable of the caller's shell leaks into a check."""
    import os

    for name in list(os.environ):
        if name.startswith("RADHARMONY_"):
            monkeypatch.delenv(name)
    return monkeypatch


def check_data(*argv: str) -> int:
    return main(["check-data", *argv])


def partition_lines(out: str) -> dict[str, str]:
    keys = set(partition_keys())
    return {
        line.split()[0]: line
        for line in out.splitlines()
        if line.split() and line.split()[0] in keys
    }


def test_tiny_data_is_usable_with_a_line_per_partition(tiny_root, clean_env, capsys):
    assert check_data("--data-root", str(tiny_root)) == 0
    out = capsys.readouterr().out
    lines = partition_lines(out)
    assert set(lines) == set(partition_keys())
    for line in lines.values():
        assert line.split()[1] == "ok", line
        present, named = line.split("images ")[1].split()[0].split("/")
        assert present == named and int(named) > 0
    assert "sample headers: " in out and "PNG L 8-bit" in out and "DICOM MONOCHROME" in out
    assert "counts found/documented: images " in out
    assert f"annotation {tiny_root / 'chestx-det' / 'ChestX_Det_train.json'} (" in out


def test_images_moved_away_is_unusable_and_names_where_they_are(tiny_copy, clean_env, capsys):
    det = tiny_copy / "chestx-det"
    (det / "train").rename(det / "pngs")
    (det / "train").mkdir()
    assert check_data("--data-root", str(tiny_copy), "--partition", "chestx_det.train") == 1
    out = capsys.readouterr().out
    line = partition_lines(out)["chestx_det.train"]
    assert "unusable" in line and "images 0/" in line
    assert f"the images are in {det / 'pngs'}" in out


def test_mimic_folder_without_the_images_names_the_variable(tiny_root, tmp_path, clean_env, capsys):
    (tmp_path / "files").mkdir()
    clean_env.setenv("RADHARMONY_MIMIC_FILES_DIR", str(tmp_path / "files"))
    assert check_data("--data-root", str(tiny_root), "--partition", "ms_cxr.val") == 1
    out = capsys.readouterr().out
    assert "unusable" in partition_lines(out)["ms_cxr.val"]
    assert "RADHARMONY_MIMIC_FILES_DIR" in out


def test_missing_annotation_file_names_the_variable(tiny_copy, clean_env, capsys):
    (
        tiny_copy / "rexgradient" / "download" / "metadata" / "test_metadata_view_position.json"
    ).unlink()
    assert check_data("--data-root", str(tiny_copy), "--partition", "rexgradient.test") == 1
    out = capsys.readouterr().out
    assert "(MISSING)" in out and "RADHARMONY_REXGRADIENT_ROOT" in out


def test_a_few_missing_images_are_a_warning_not_unusable(tiny_copy, clean_env, capsys):
    sorted((tiny_copy / "chestx-det" / "train").glob("*.png"))[0].unlink()
    assert check_data("--data-root", str(tiny_copy), "--partition", "chestx_det.train") == 0
    out = capsys.readouterr().out
    assert "warning: 1 of " in out and "re-download the missing files" in out


def test_datasets_nobody_configured_are_listed_not_errors(tiny_root, tmp_path, clean_env, capsys):
    shutil.copytree(tiny_root / "chestx-det", tmp_path / "chestx-det")
    assert check_data("--data-root", str(tmp_path)) == 0
    lines = partition_lines(capsys.readouterr().out)
    assert lines["chestx_det.test"].split()[1] == "ok"
    assert "not configured" in lines["rexgradient.train"]
    assert "RADHARMONY_REXGRADIENT_ROOT" in lines["rexgradient.train"]


def test_a_data_root_that_does_not_exist_is_one_line(tmp_path, clean_env, capsys):
    assert check_data("--data-root", str(tmp_path / "typo")) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "does not exist" in err and "Traceback" not in err


@pytest.mark.build
def test_observation_carries_the_check(tiny_copy, tmp_path, clean_env):
    (tiny_copy / "chestx-det" / "test").rename(tiny_copy / "chestx-det" / "elsewhere")
    (tiny_copy / "chestx-det" / "test").mkdir()
    job = build_definitions(tiny_copy, tmp_path / "out").resolve_job_def(OBSERVE_JOB)
    result = job.execute_in_process(instance=dg.DagsterInstance.ephemeral())
    observations = {
        event.asset_observation_data.asset_observation.partition: (
            event.asset_observation_data.asset_observation.metadata
        )
        for event in result.all_events
        if event.event_type == dg.DagsterEventType.ASSET_OBSERVATION
    }
    assert observations["chestx_det.train"]["check_data"].value.startswith("ok")
    broken = observations["chestx_det.test"]
    assert broken["check_data"].value.startswith("unusable")
    assert "elsewhere" in broken["check_data"].value
    assert any("ERROR" in problem for problem in broken["check_data_problems"].value)


@pytest.mark.build
def test_a_partition_whose_images_are_missing_fails_its_run(tiny_root, tmp_path, clean_env):
    """The MIMIC-parent trap, one level off: a folder with no images must not be green."""
    empty = tmp_path / "mimic-cxr-jpg" / "2.0.0" / "files"
    empty.mkdir(parents=True)
    clean_env.setenv("RADHARMONY_MIMIC_FILES_DIR", str(empty))
    job = build_definitions(tiny_root, tmp_path / "out").resolve_job_def(ALL_STAGES_JOB)
    result = job.execute_in_process(
        partition_key="ms_cxr.train", instance=dg.DagsterInstance.ephemeral(), raise_on_error=False
    )
    assert not result.success
    failures = [event for event in result.all_events if event.is_step_failure]
    message = failures[0].step_failure_data.error.message
    assert "images the metadata names are not in" in message
    assert "RADHARMONY_MIMIC_FILES_DIR" in message
    # Failed before any image was decoded: no images materialization.
    assert not [
        event
        for event in result.get_asset_materialization_events()
        if event.materialization.asset_key == dg.AssetKey("images")
    ]


@pytest.mark.build
def test_images_failing_for_one_reason_fail_the_step(tiny_copy, tmp_path, clean_env):
    for png in (tiny_copy / "rexgradient" / "deid_png").rglob("*.png"):
        png.write_bytes(b"not a png")
    job = build_definitions(tiny_copy, tmp_path / "out").resolve_job_def(ALL_STAGES_JOB)
    result = job.execute_in_process(
        partition_key="rexgradient.val",
        instance=dg.DagsterInstance.ephemeral(),
        raise_on_error=False,
    )
    assert not result.success
    message = next(
        e for e in result.all_events if e.is_step_failure
    ).step_failure_data.error.message
    assert "images failed for one reason" in message and "check-data" in message


@pytest.mark.build
def test_the_limit_is_a_setting(tiny_copy, tmp_path, clean_env):
    for png in (tiny_copy / "rexgradient" / "deid_png").rglob("*.png"):
        png.write_bytes(b"not a png")
    clean_env.setenv("RADHARMONY_UNREADABLE_LIMIT", "1")
    job = build_definitions(tiny_copy, tmp_path / "out").resolve_job_def(ALL_STAGES_JOB)
    result = job.execute_in_process(
        partition_key="rexgradient.val",
        instance=dg.DagsterInstance.ephemeral(),
        raise_on_error=False,
    )
    # Tolerated: every image is an error row, the step succeeds.
    assert result.success
    clean_env.setenv("RADHARMONY_UNREADABLE_LIMIT", "2")
    assert main(["check-data", "--data-root", str(tiny_copy)]) == 2
