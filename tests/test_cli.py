"""The `radharmony` command: synth writes the datasets; demo materializes and summarizes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from commands import run_ok

from radharmony_pipeline.cli import build_parser, main
from radharmony_pipeline.defs.jobs import CARD_JOB, EXPORTS_JOB, MANIFEST_JOB
from radharmony_pipeline.processing.corpus.card import CARD_NAME, CROISSANT_NAME
from radharmony_pipeline.processing.corpus.exports import (
    WEBDATASET_INDEX_NAME,
    huggingface_index_name,
)
from radharmony_pipeline.processing.storage import output_layout as layout
from radharmony_pipeline.sources import partition_keys


@pytest.mark.build
def test_synth_writes_the_chosen_datasets(tmp_path, capsys):
    assert (
        main(
            [
                "synth",
                "--out",
                str(tmp_path),
                "--dataset",
                "chestx_det",
                "--dataset",
                "ms_cxr",
                "--mimic-format",
                "dcm",
            ]
        )
        == 0
    )
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".")) == [
        "chestx-det",
        "mimic-cxr",
        "ms-cxr",
    ]
    assert list((tmp_path / "mimic-cxr").rglob("*.dcm"))
    assert not list((tmp_path / "mimic-cxr").rglob("*.jpg"))
    assert "chestx_det" in capsys.readouterr().out


def test_metadata_only_needs_full_scale(tmp_path, capsys):
    assert main(["synth", "--out", str(tmp_path), "--rexgradient-metadata-only"]) == 2
    assert "--full-scale" in capsys.readouterr().err


def test_unknown_scale_is_refused(tmp_path):
    with pytest.raises(SystemExit):
        main(["synth", "--out", str(tmp_path), "--scale", "huge"])


@pytest.mark.build
def test_demo_materializes_every_partition_and_prints_the_summary(tiny_demo):
    completed = tiny_demo.completed
    summary = completed.stdout.split("partition ", 1)[1]
    for partition in ("chexlocalize.val", "ms_cxr.test", "chestx_det.train", "rexgradient.val"):
        line = next(row for row in summary.splitlines() if row.startswith(partition))
        assert " ok " in line and "FAILED" not in line
        passed, total = line.split()[3].split("/")
        assert passed == total and int(total) >= 3
    assert "make ui" in completed.stdout
    # The runs are in the instance the UI reads: an observation, a run per partition, the
    # manifest, each partition's exports, the card.
    runs = tiny_demo.runs
    assert len(runs) == 23 and all(run.is_success for run in runs)
    # Recorded as runs of the project's jobs in its code location, as the UI launches them.
    jobs = sorted(run.job_name for run in runs)
    assert jobs.count("all_stages") == 10 and jobs.count(EXPORTS_JOB) == 10
    assert jobs.count(CARD_JOB) == 1 and jobs.count(MANIFEST_JOB) == 1
    assert {
        run.remote_job_origin.repository_origin.code_location_origin.location_name for run in runs
    } == {"radharmony_pipeline"}


@pytest.mark.build
def test_demo_builds_the_exports_and_the_card_and_says_where_each_is(tiny_demo):
    output = Path(tiny_demo.environment["RADHARMONY_OUTPUT_ROOT"])
    stdout = tiny_demo.completed.stdout
    for partition in partition_keys():
        dataset, split = partition.split(".")
        assert (output / layout.WEBDATASET_EXPORT / partition / WEBDATASET_INDEX_NAME).is_file()
        index = huggingface_index_name(split)
        assert (output / layout.HUGGINGFACE_EXPORT / dataset / index).is_file(), partition
    assert "# " in (output / CARD_NAME).read_text()
    assert json.loads((output / CROISSANT_NAME).read_text())["name"]
    for product in (
        layout.MANIFEST,
        layout.HUGGINGFACE_EXPORT,
        layout.WEBDATASET_EXPORT,
        CARD_NAME,
        CROISSANT_NAME,
    ):
        assert f"{output}/{product}" in stdout, product


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize(
    ("argv", "names"),
    [
        (["synth", "--out", "x", "--dataset", "chexpert"], ["radharmony synth", "chestx_det"]),
        (["demo", "--partitions", "x"], ["radharmony demo:", "--partitions", "demo --help"]),
        (["demo", "--partition", "chexpert.val"], ["radharmony demo", "chexpert.val"]),
        (["check-data", "--partition", "x.y"], ["radharmony check-data", "x.y"]),
        (["synth"], ["radharmony synth", "--out"]),
        (["nonsense"], ["radharmony:", "check-data"]),
    ],
)
def test_user_errors_are_one_line_with_exit_2(argv, names, capsys, monkeypatch):
    monkeypatch.delenv("RADHARMONY_DATA_ROOT", raising=False)
    try:
        code = main(argv)
    except SystemExit as exit_:
        code = exit_.code
    assert code == 2
    err = one_line_error(capsys)
    for name in names:
        assert name in err


def test_a_mistyped_demo_root_is_refused_and_nothing_is_written(tmp_path, capsys):
    typo = tmp_path / "typo-cxr"
    assert main(["demo", "--data-root", str(typo)]) == 2
    err = one_line_error(capsys)
    assert "does not exist" in err and "radharmony synth" in err
    assert not typo.exists()


def test_the_demo_root_variable_is_checked_too(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("RADHARMONY_DATA_ROOT", "~/typo-cxr")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert main(["demo"]) == 2
    assert f"{tmp_path}/typo-cxr does not exist" in one_line_error(capsys)
    assert not (tmp_path / "typo-cxr").exists()


def test_version_and_help_for_every_option(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.startswith("radharmony 0.")
    _, subcommands = build_parser()
    assert {"check-data", "synth", "demo", "free-slots"} <= set(subcommands)
    for name, parser in subcommands.items():
        for action in parser._actions:
            assert action.help, f"radharmony {name} {action.option_strings} has no help"


def test_real_and_demo_outputs_have_different_default_roots(tmp_path):
    from radharmony_pipeline.defs.resources import (
        DEMO_OUTPUT_ROOT,
        REAL_OUTPUT_ROOT,
        default_output_root,
    )

    assert default_output_root({}) == DEMO_OUTPUT_ROOT
    assert default_output_root({"RADHARMONY_DATA_ROOT": str(tmp_path)}) == REAL_OUTPUT_ROOT
    assert default_output_root({"RADHARMONY_CHESTX_DET_ROOT": str(tmp_path)}) == REAL_OUTPUT_ROOT
    assert DEMO_OUTPUT_ROOT != REAL_OUTPUT_ROOT
    assert default_output_root({"RADHARMONY_OUTPUT_ROOT": "~/out", "HOME": "/h"}) == "/h/out"


@pytest.mark.slow
@pytest.mark.build
def test_a_partial_demo_claims_no_manifest(tiny_root, tmp_path):
    """Only the partitions asked for are run: no manifest is joined, none is announced."""
    from e2e_support import write_instance

    environment = {
        k: v for k, v in os.environ.items() if not k.startswith(("RADHARMONY_", "DAGSTER_"))
    }
    environment.update(
        DAGSTER_HOME=str(write_instance(tmp_path / "dagster_home")),
        RADHARMONY_OUTPUT_ROOT=str(tmp_path / "output"),
        RADHARMONY_WORKERS="1",
    )
    demo = [sys.executable, "-m", "radharmony_pipeline.cli", "demo", "--data-root", str(tiny_root)]
    completed = run_ok([*demo, "--partition", "chestx_det.test"], env=environment, timeout=900)
    assert "Manifest:" not in completed.stdout
    assert "No manifest was joined" in completed.stdout
    assert not list((tmp_path / "output").rglob("unified_manifest*"))
    assert layout.table_file(tmp_path / "output", "raw_index", "chestx_det.test").exists()


def test_make_ui_honours_host_port_and_dagster_home(tmp_path):
    repository = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    environment = {**os.environ, "DAGSTER_HOME": str(tmp_path)}

    def make_plan(*arguments: str) -> str:
        """What `make -n` would run (with -p, also the variables it would run with)."""
        return subprocess.run(
            ["make", "-n", *arguments],
            cwd=repository,
            env=environment,
            capture_output=True,
            text=True,
            check=True,
        ).stdout

    assert "dg dev --host 127.0.0.1 --port 3917" in make_plan("ui", "PORT=3917")
    planned = make_plan("-p", "ui", "HOST=0.0.0.0")
    assert "dg dev --host 0.0.0.0 --port 3000" in planned
    assert f"DAGSTER_HOME = {tmp_path}" in planned or f"DAGSTER_HOME := {tmp_path}" in planned
