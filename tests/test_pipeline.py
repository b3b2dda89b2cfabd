"""raw_index + labels + checks materialized for every partition in an ephemeral instance."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import dagster as dg
import pandas as pd
import pytest
from commands import run_ok
from corpus import checks_of_a_success

from radharmony_pipeline.definitions import build_definitions
from radharmony_pipeline.processing.storage import output_layout as layout
from radharmony_pipeline.processing.tables import suite_validation
from radharmony_pipeline.sources import partition_keys
from radharmony_pipeline.vocabulary import LABEL_COLUMNS

pytestmark = pytest.mark.build

REPO = Path(__file__).resolve().parents[1]


def materialize(
    data_root: Path, output: Path, partition: str, job: str = "index_and_labels"
) -> dg.ExecuteInProcessResult:
    """A job's assets and their checks (raw_index + labels by default), as the UI runs them."""
    job = build_definitions(data_root, output).resolve_job_def(job)
    return job.execute_in_process(partition_key=partition, raise_on_error=False)


@pytest.fixture(scope="module")
def materialized(tiny_root, tmp_path_factory):
    output = tmp_path_factory.mktemp("output")
    return output, {key: materialize(tiny_root, output, key) for key in partition_keys()}


@pytest.mark.parametrize("partition", partition_keys())
def test_every_partition_materializes_with_every_check_passing(materialized, partition):
    output, results = materialized
    evaluations = checks_of_a_success(results[partition])
    assert set(evaluations) == {
        "counts_match_documentation",
        "raw_index_suite",
        "labels_suite",
        "raw_index_error_rows",
    }
    for name, evaluation in evaluations.items():
        assert evaluation.passed, (name, evaluation.metadata)
    for asset in ("raw_index", "labels"):
        path = layout.table_file(output, asset, partition)
        table = pd.read_parquet(path)
        assert len(table) > 0
    assert not list(layout.tables_folder(output).rglob(".partial-*"))


def recorded_helpers(monkeypatch) -> list:
    """Every helper the next runs start, each with the suites sent to it (`.suites`); every
    source large enough for one."""
    monkeypatch.setattr(suite_validation, "HELPER_SOURCE_BYTES", 0)
    started = []

    class RecordedValidationProcess(suite_validation.ValidationProcess):
        def __init__(self) -> None:
            super().__init__()
            self.suites = []
            started.append(self)

        def submit(self, frame, suite, *arguments):
            self.suites.append(suite)
            return super().submit(frame, suite, *arguments)

    monkeypatch.setattr(suite_validation, "ValidationProcess", RecordedValidationProcess)
    return started


def test_suites_validated_in_a_helper_process_give_the_same_results(
    materialized, tiny_root, tmp_path, monkeypatch
):
    """As for ReXGradient train at full scale: GX in a helper started before the read."""
    _, results = materialized
    partition = "rexgradient.val"
    started = recorded_helpers(monkeypatch)
    helped = materialize(tiny_root, tmp_path, partition)
    assert len(started) == 1, "the step did not validate in a helper"
    assert started[0].exit_code is not None, "the helper outlived its run"

    def evaluations(result):
        return {e.check_name: (e.passed, e.metadata) for e in result.get_asset_check_evaluations()}

    assert evaluations(helped) == evaluations(results[partition])
    assert all(passed for passed, _ in evaluations(helped).values())


def test_the_later_steps_of_a_run_validate_in_the_helper_its_read_started(
    tiny_root, tmp_path, monkeypatch
):
    """GX is imported once per run: the boxes' and masks' suites of the run whose metadata
    started a helper go to that helper, which ends with the run."""
    started = recorded_helpers(monkeypatch)
    result = materialize(tiny_root, tmp_path, "rexgradient.val", job="all_stages")
    assert result.success
    assert len(started) == 1, "a run started more than one helper"
    assert {"raw_index", "labels", "bboxes", "masks"} <= set(started[0].suites)
    assert started[0].exit_code is not None, "the helper outlived its run"
    evaluations = {e.check_name: e.passed for e in result.get_asset_check_evaluations()}
    assert evaluations["bboxes_suite"] and evaluations["masks_suite"], evaluations


def test_tables_round_trip_with_contract_types(materialized):
    output, _ = materialized
    labels = pd.read_parquet(layout.table_file(output, "labels", "chestx_det.train"))
    assert list(labels.columns[-21:]) == list(LABEL_COLUMNS)
    assert all(str(labels[c].dtype) == "Int8" for c in LABEL_COLUMNS)
    index = pd.read_parquet(layout.table_file(output, "raw_index", "rexgradient.val"))
    assert list(index.columns[:12]) == [
        "image_id",
        "image_key",
        "dataset",
        "split",
        "patient_id",
        "study_id",
        "image_path",
        "image_format",
        "view_position",
        "view_position_raw",
        "source_height",
        "source_width",
    ]
    assert {"accession_number", "patient_sex", "patient_age", "study_date"} <= set(index.columns)


def test_materializations_publish_schema_and_row_count(materialized):
    _, results = materialized
    for event in results["ms_cxr.test"].get_asset_materialization_events():
        metadata = event.materialization.metadata
        schema = metadata["dagster/column_schema"].value
        assert "image_id" in [column.name for column in schema.columns]
        assert metadata["dagster/row_count"].value > 0
    labels_event = next(
        e
        for e in results["chestx_det.test"].get_asset_materialization_events()
        if e.materialization.asset_key == dg.AssetKey("labels")
    )
    assert labels_event.materialization.metadata["counts"].value["images"] > 0


def test_incomplete_download_fails_the_count_check_with_a_helpful_message(tiny_copy, tmp_path):
    path = tiny_copy / "chestx-det" / "ChestX_Det_train.json"
    entries = json.loads(path.read_text())
    path.write_text(json.dumps(entries[:-2]))
    result = materialize(tiny_copy, tmp_path / "out", "chestx_det.train")
    assert not result.success
    counts = next(
        e
        for e in result.get_asset_check_evaluations()
        if e.check_name == "counts_match_documentation"
    )
    assert not counts.passed
    mismatches = counts.metadata["mismatches"].value
    assert mismatches["images"] == {"expected": len(entries), "found": len(entries) - 2}
    hint = counts.metadata["probably_missing"].value
    assert "fewer than documented" in hint and "ChestX_Det_train.json" in hint


def test_missing_root_fails_only_that_partition_and_writes_nothing(tiny_copy, tmp_path):
    import shutil

    shutil.rmtree(tiny_copy / "rexgradient")
    output = tmp_path / "out"
    failed = materialize(tiny_copy, output, "rexgradient.test")
    assert not failed.success
    failure = next(e for e in failed.all_events if e.is_step_failure)
    message = failure.step_failure_data.user_failure_data.description
    assert "RADHARMONY_REXGRADIENT_ROOT" in message and "deid_png" in message
    assert not (layout.tables_folder(output) / "raw_index").exists()
    assert materialize(tiny_copy, output, "chestx_det.test").success


def test_documented_counts_apply_without_expected_counts_file(tiny_copy, tmp_path):
    (tiny_copy / "chestx-det" / "expected_counts.json").unlink()
    result = materialize(tiny_copy, tmp_path / "out", "chestx_det.test")
    counts = next(
        e
        for e in result.get_asset_check_evaluations()
        if e.check_name == "counts_match_documentation"
    )
    assert not counts.passed
    assert counts.metadata["mismatches"].value["images"]["expected"] == 553


@pytest.mark.slow
def test_cli_materializes_with_only_the_chestx_det_root_set(tiny_root, tmp_path):
    environ = {k: v for k, v in os.environ.items() if not k.startswith("RADHARMONY_")}
    environ.update(
        RADHARMONY_CHESTX_DET_ROOT=str(tiny_root / "chestx-det"),
        RADHARMONY_OUTPUT_ROOT=str(tmp_path / "out"),
        DAGSTER_HOME=str(tmp_path / "home"),
    )
    (tmp_path / "home").mkdir()
    dagster = Path(sys.executable).with_name("dagster")
    module = "radharmony_pipeline.definitions"
    selected = ["--select", "raw_index", "--partition", "chestx_det.train"]
    run_ok(
        [str(dagster), "asset", "materialize", "-m", module, *selected],
        cwd=tmp_path,
        env=environ,
        timeout=300,
    )
    table = pd.read_parquet(layout.table_file(tmp_path / "out", "raw_index", "chestx_det.train"))
    expected = json.loads((tiny_root / "chestx-det" / "expected_counts.json").read_text())
    assert len(table) == expected["splits"]["train"]["images"]
