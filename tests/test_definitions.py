"""The project loads as Dagster would load it, and the layers stay apart."""

from __future__ import annotations

import ast
import importlib
import os
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest
from commands import run_ok

from radharmony_pipeline.definitions import defs
from radharmony_pipeline.sources import SOURCE_TYPES, partition_keys

PACKAGE = Path(__file__).resolve().parents[1] / "radharmony_pipeline"
ASSET_JOB = type(dg.define_asset_job("probe"))  # what define_asset_job returns


def test_definitions_load_with_every_asset_check_and_job():
    dg.Definitions.validate_loadable(defs)
    keys = {key.to_user_string() for key in defs.resolve_all_asset_keys()}
    assert {"source_files", "raw_index", "labels"} <= keys
    check_names = {key.name for key in defs.resolve_asset_graph().asset_check_keys}
    assert {"counts_match_documentation", "raw_index_suite", "labels_suite"} <= check_names
    assert defs.resolve_job_def("observe_source_files") is not None


def test_partitions_are_the_registered_dataset_splits():
    # The four documented datasets give these ten; a registered fifth adds its own.
    documented = {"chexlocalize", "ms_cxr", "chestx_det", "rexgradient"}
    assert [key for key in partition_keys() if key.split(".")[0] in documented] == [
        "chexlocalize.val",
        "chexlocalize.test",
        "ms_cxr.train",
        "ms_cxr.val",
        "ms_cxr.test",
        "chestx_det.train",
        "chestx_det.test",
        "rexgradient.train",
        "rexgradient.val",
        "rexgradient.test",
    ]
    assert partition_keys() == [
        f"{dataset}.{split}" for dataset, source in SOURCE_TYPES.items() for split in source.splits
    ]
    graph = defs.resolve_asset_graph()
    for key in ("raw_index", "labels"):
        partitions = graph.get(dg.AssetKey(key)).partitions_def
        assert partitions.get_partition_keys() == partition_keys()


def test_every_asset_has_a_description_and_a_stage_group():
    graph = defs.resolve_asset_graph()
    for key in graph.get_all_asset_keys():
        node = graph.get(key)
        assert node.description, key
        assert node.group_name != "default", key
        assert node.kinds, key
        if node.is_materializable:
            assert node.owners == ["team:radharmony"], key


def test_every_definition_under_defs_is_loaded_without_listing_it():
    """A module added under defs/ needs no edit elsewhere: everything found there is loaded."""
    found = {"assets": set(), "checks": set(), "jobs": set()}
    for path in sorted((PACKAGE / "defs").rglob("*.py")):
        module = importlib.import_module(
            ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        )
        for value in vars(module).values():
            if isinstance(value, dg.AssetChecksDefinition):
                found["checks"].update(key.name for key in value.check_keys)
            elif isinstance(value, dg.AssetsDefinition):
                found["assets"].update(key.to_user_string() for key in value.keys)
                found["checks"].update(key.name for key in value.check_keys)
            elif isinstance(value, dg.SourceAsset):
                found["assets"].add(value.key.to_user_string())
            elif isinstance(value, ASSET_JOB):
                found["jobs"].add(value.name)
    graph = defs.resolve_asset_graph()
    assert found["assets"] == {key.to_user_string() for key in graph.get_all_asset_keys()}
    assert found["checks"] == {key.name for key in graph.asset_check_keys}
    assert found["jobs"] == {job.name for job in defs.jobs}


@pytest.mark.slow
def test_defs_modules_make_no_deprecated_call_at_import():
    """dg.load_from_defs_folder silences Dagster's warnings while it imports defs/, so the
    modules are imported here directly, in a fresh process, with deprecations as errors."""
    modules = [
        ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        for path in sorted((PACKAGE / "defs").rglob("*.py"))
    ]
    code = (
        "import importlib, sys, warnings\n"
        "for category in (DeprecationWarning, FutureWarning):\n"
        "    warnings.filterwarnings('error', category=category, module='radharmony_pipeline')\n"
        "for name in sys.argv[1:]:\n"
        "    importlib.import_module(name)\n"
    )
    run_ok([sys.executable, "-c", code, *modules], timeout=300)


@pytest.mark.slow
def test_dg_cli_loads_the_project(tmp_path):
    environ = {**os.environ, "DAGSTER_HOME": str(tmp_path)}
    dg_cli = Path(sys.executable).with_name("dg")
    completed = run_ok([str(dg_cli), "check", "defs"], cwd=PACKAGE.parent, env=environ, timeout=300)
    assert "All definitions loaded successfully" in completed.stdout + completed.stderr


def _imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_sources_and_processing_never_import_dagster():
    for layer in ("sources", "processing", "synthetic"):
        for path in (PACKAGE / layer).rglob("*.py"):
            assert "dagster" not in _imported_modules(path), path


@pytest.mark.slow
def test_importing_the_readers_does_not_load_dagster():
    code = (
        "import sys, radharmony_pipeline.sources, radharmony_pipeline.vocabulary;"
        "print('dagster' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_nightly_observation_and_rebuild_sensor_run_by_default():
    schedule = defs.resolve_schedule_def("observe_source_files_nightly")
    assert schedule.default_status == dg.DefaultScheduleStatus.RUNNING
    assert schedule.cron_schedule == "0 2 * * *"
    sensor = defs.resolve_sensor_def("rebuild_changed_partitions")
    assert sensor.default_status == dg.DefaultSensorStatus.RUNNING
    graph = defs.resolve_asset_graph()
    for key in ("raw_index", "labels", "masks", "bboxes", "images", "unified_manifest"):
        node = graph.get(dg.AssetKey(key))
        assert node.automation_condition is not None and node.code_version, key
    assert graph.get(dg.AssetKey("images")).pools == {"heavy_image_work"}


# Every per-partition check, with whether it blocks downstream stages.
PARTITION_CHECKS = {
    "counts_match_documentation": True,
    "raw_index_suite": True,
    "labels_suite": True,
    "raw_index_error_rows": True,
    "bboxes_match_documentation": True,
    "bboxes_suite": True,
    "bboxes_error_rows": True,
    "masks_match_documentation": True,
    "positives_without_masks": False,
    "masks_suite": True,
    "masks_error_rows": True,
    "images_error_rows": True,
    "report_labels_cover_reports": True,
    "unmentioned_reports_within_limit": False,
}


def test_every_partition_check_runs_in_the_step_of_its_stage():
    in_step = {
        spec.name: (spec.blocking, spec.partitions_def)
        for assets in defs.assets
        if isinstance(assets, dg.AssetsDefinition)
        for spec in assets.check_specs
    }
    assert {name: blocking for name, (blocking, _) in in_step.items()} == PARTITION_CHECKS
    assert all(partitions is not None for _, partitions in in_step.values())
    standalone = {key.name for checks in defs.asset_checks or () for key in checks.check_keys}
    assert not standalone & set(PARTITION_CHECKS)


@pytest.mark.slow
def test_loading_the_definitions_does_not_import_great_expectations():
    code = "import sys, radharmony_pipeline.definitions; print('great_expectations' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_runs_execute_their_steps_in_process_unless_their_config_asks_otherwise():
    executor = defs.resolve_job_def("all_stages").executor_def
    assert executor.config_schema.as_field().default_value == {"in_process": {}}
    for choice in ({"in_process": {}}, {"multiprocess": {}}):
        assert executor.config_schema.config_type.fields.keys() >= choice.keys()
