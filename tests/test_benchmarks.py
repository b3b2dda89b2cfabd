"""Every benchmark still runs: each `benchmarks/bench_*.py --smoke` on tiny input, in a fresh
process, in a temporary folder (TMPDIR too, so nothing is left elsewhere); bench_real_reports.py
on a small CSV written here; and the figures in benchmarks/README.md are the ones
benchmarks/tables.py generates from benchmarks/results/*.json."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parents[1]
BENCHMARKS = REPOSITORY / "benchmarks"
# bench_real_reports.py needs a data file rather than synthetic input: run on the CSV below
# instead. bench_formats.py is the old command of `bench_images.py --sections formats`, whose
# smoke bench_images.py's covers: checked to hand over its arguments.
NOT_SMOKED = {"bench_real_reports.py", "bench_formats.py"}
SMOKED = sorted(p.name for p in BENCHMARKS.glob("bench_*.py") if p.name not in NOT_SMOKED)
# Smokes that launch runs, pools or the CLI, or build a labeler, take 2-30 s each: the `slow`
# tier runs them, so that `make test-fast` stays within a minute; the fast tier imports every
# script and runs the smokes that take about a second.
SLOW_SMOKES = {
    "bench_checks.py",
    "bench_cluster.py",
    "bench_duplicates.py",
    "bench_exports.py",
    "bench_image_step.py",
    "bench_images.py",
    "bench_masks.py",
    "bench_parents.py",
    "bench_report_labels.py",
    "bench_reruns.py",
    "bench_verify.py",
}
SMOKE_TIMEOUT = 240  # seconds: far above a smoke run's few, for a loaded machine


def run_script(arguments: list[str], folder: Path) -> subprocess.CompletedProcess:
    environment = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("RADHARMONY_", "DAGSTER_"))},
        "TMPDIR": str(folder),
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    return subprocess.run(
        [sys.executable, *arguments],
        cwd=folder,
        env=environment,
        capture_output=True,
        text=True,
        timeout=SMOKE_TIMEOUT,
    )


def test_every_benchmark_is_smoked() -> None:
    assert len(SMOKED) >= 5
    assert "bench_images.py" in SMOKED


def test_every_benchmark_imports(tmp_path: Path) -> None:
    """Each script and helper module imports (one interpreter for them all)."""
    names = sorted(p.stem for p in BENCHMARKS.glob("*.py"))
    code = (
        f"import sys, importlib; sys.path.insert(0, {str(BENCHMARKS)!r}); "
        f"[importlib.import_module(name) for name in {names!r}]; print(len({names!r}))"
    )
    completed = run_script(["-c", code], tmp_path)
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert completed.stdout.strip() == str(len(names))


@pytest.mark.parametrize(
    "script",
    [pytest.param(s, marks=pytest.mark.slow) if s in SLOW_SMOKES else s for s in SMOKED],
)
def test_benchmark_smoke(script: str, tmp_path: Path) -> None:
    completed = run_script([str(BENCHMARKS / script), "--smoke"], tmp_path)
    assert completed.returncode == 0, (
        f"{script} --smoke exited {completed.returncode}\n"
        f"stdout:\n{completed.stdout[-3000:]}\nstderr:\n{completed.stderr[-3000:]}"
    )
    assert completed.stdout.strip(), f"{script} --smoke printed nothing"


def test_old_formats_command_runs_the_images_section(tmp_path: Path) -> None:
    completed = run_script([str(BENCHMARKS / "bench_formats.py"), "--help"], tmp_path)
    assert completed.returncode == 0, completed.stderr
    assert "bench_images.py" in completed.stdout and "--sections" in completed.stdout


# Three made-up reports, coded by hand: one with effusion and atelectasis, one with a
# nodule, one normal study.
REPORTS_CSV = """\
uid,findings,impression,mesh,gold_Atelectasis,gold_Cardiomegaly,gold_Effusion,gold_Mass,\
gold_Nodule,gold_Pneumonia,gold_Pneumothorax
1,"Small left pleural effusion. Patchy opacity at the left base, likely atelectasis.",\
"Left effusion with basilar atelectasis.",Pleural Effusion/left,1,0,1,0,0,0,0
2,"A 7 mm nodule projects over the right upper lobe. The heart is normal in size.",\
"Right upper lobe nodule.",Nodule/right/upper lobe,0,0,0,0,1,0,0
3,"The lungs are clear. No pneumothorax or pleural effusion. Heart size is normal.",\
"No acute cardiopulmonary disease.",normal,0,0,0,0,0,0,0
"""


def test_real_reports_on_a_small_csv(tmp_path: Path) -> None:
    reports = tmp_path / "reports.csv"
    reports.write_text(REPORTS_CSV)
    figures = tmp_path / "figures.json"
    script = str(BENCHMARKS / "bench_real_reports.py")
    completed = run_script([script, str(reports), "--json", str(figures)], tmp_path)
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert "3 reports from reports.csv" in completed.stdout
    micro = [line for line in completed.stdout.splitlines() if line.startswith("micro")]
    assert len(micro) == 1, completed.stdout
    assert figures.is_file()


def test_readme_figures_are_generated_from_the_results() -> None:
    completed = run_script([str(BENCHMARKS / "tables.py"), "--check"], REPOSITORY)
    assert completed.returncode == 0, (
        "benchmarks/README.md's figures differ from benchmarks/results/*.json: run "
        f"`.venv/bin/python benchmarks/tables.py --write`\n{completed.stdout}{completed.stderr}"
    )
