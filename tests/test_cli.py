"""The `radharmony` command: synth writes the datasets; demo materializes and summarizes."""

from __future__ import annotations

import pytest

from radharmony_pipeline.cli import main


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


def test_demo_materializes_every_partition_and_prints_the_summary(tiny_demo):
    completed = tiny_demo.completed
    summary = completed.stdout.split("partition ", 1)[1]
    for partition in ("chexlocalize.val", "ms_cxr.test", "chestx_det.train", "rexgradient.val"):
        line = next(row for row in summary.splitlines() if row.startswith(partition))
        assert " ok " in line and "FAILED" not in line
        passed, total = line.split()[3].split("/")
        assert passed == total and int(total) >= 3
    assert "make ui" in completed.stdout
    # The runs are in the instance the UI reads: an observation, a run per partition, the manifest.
    runs = tiny_demo.runs
    assert len(runs) == 12 and all(run.is_success for run in runs)
    # Recorded as runs of the project's jobs in its code location, as the UI launches them.
    assert sorted(run.job_name for run in runs).count("all_stages") == 10
    assert {
        run.remote_job_origin.repository_origin.code_location_origin.location_name for run in runs
    } == {"radharmony_pipeline"}
