"""Every benchmark still runs: each `benchmarks/bench_*.py --smoke` on tiny input, in a fresh
process, in a temporary folder (TMPDIR too, so nothing is left elsewhere), writing the results
files it owns there, each with its table and positive figures; the sections a smoke run leaves
out because they start Dagster or the S3 server run in the slow tier; and the figures in
benchmarks/README.md are the ones benchmarks/tables.py generates from benchmarks/results/*.json.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parents[1]
BENCHMARKS = REPOSITORY / "benchmarks"
SCRIPTS = sorted(p.name for p in BENCHMARKS.glob("bench_*.py"))
# The results files (benchmarks/results/<name>.json) each script's smoke run writes.
WRITES = {
    "bench_checks.py": {"check_data", "verify"},
    "bench_cluster.py": {"cluster", "time_limit"},
    "bench_corpus.py": {"corpus", "corpus_cluster"},
    "bench_duplicates.py": {"duplicates", "hash_choice", "film_similarity", "parents"},
    "bench_exports.py": {"exports"},
    "bench_images.py": {"images_formats", "images_jpeg"},
    "bench_masks.py": {"masks"},
    "bench_report_labels.py": {"report_agreement", "report_labels", "report_table", "real_reports"},
    "bench_reruns.py": {"cold_metadata", "layout_migration"},
    "bench_store_retries.py": {"store_retries"},
}
# The sections a smoke run leaves out: each starts Dagster (its CLI, a `dg launch` or a run in
# process) or the S3 server, seconds before any work, so the slow tier runs them, tiny, with
# the file each writes.
SLOW_SECTIONS = [
    ("bench_checks.py", "--section", "cli", "checks"),
    ("bench_cluster.py", "--section", "loader", "cluster_loader"),
    ("bench_cluster.py", "--section", "put-floor", "cluster_put_floor"),
    ("bench_checks.py", "--section", "index", "index"),
    ("bench_images.py", "--sections", "step", "images_step"),
    ("bench_reruns.py", "--section", "launch", "reruns"),
]
RESULT_KEYS = {"benchmark", "title", "source", "measured", "command", "columns", "rows", "figures"}
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


def succeeded(completed: subprocess.CompletedProcess, what: str) -> None:
    assert completed.returncode == 0, (
        f"{what} exited {completed.returncode}\n"
        f"stdout:\n{completed.stdout[-3000:]}\nstderr:\n{completed.stderr[-3000:]}"
    )


def numbers(value: object) -> list[float]:
    """Every number in a JSON value (booleans are not figures)."""
    if isinstance(value, bool):
        return []
    if isinstance(value, int | float):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    return [n for item in value for n in numbers(item)] if isinstance(value, list) else []


def check_results(folder: Path, script: str, expected: set[str]) -> None:
    """`folder` holds exactly the expected results files, each a titled table as tables.py
    renders it, from this script's smoke run, with positive figures behind it."""
    written = {path.stem: json.loads(path.read_text()) for path in folder.glob("*.json")}
    assert set(written) == expected
    for name, result in written.items():
        assert set(result) >= RESULT_KEYS, f"{name}: {sorted(RESULT_KEYS - set(result))} missing"
        assert result["benchmark"].startswith(script)
        assert result["command"].startswith(f".venv/bin/python benchmarks/{script} --smoke")
        assert result["rows"], f"{name}: no rows"
        assert all(len(row) == len(result["columns"]) for row in result["rows"]), name
        assert any(n > 0 for n in numbers(result["figures"])), f"{name}: no positive figure"


def test_every_benchmark_is_smoked() -> None:
    assert set(SCRIPTS) == set(WRITES)
    assert len(SCRIPTS) <= 10


def test_every_benchmark_imports(tmp_path: Path) -> None:
    """Each shared module and section package imports (one interpreter for all); each script
    is imported by its smoke run, and a module only a slow-tier section uses is imported here."""
    names = sorted(p.stem for p in BENCHMARKS.glob("*.py") if not p.name.startswith("bench_"))
    names += sorted(
        f"{p.parent.name}.{p.stem}" for p in BENCHMARKS.glob("*/*.py") if p.stem != "__init__"
    )
    code = (
        f"import sys, importlib; sys.path.insert(0, {str(BENCHMARKS)!r}); "
        f"[importlib.import_module(name) for name in {names!r}]; print(len({names!r}))"
    )
    completed = run_script(["-c", code], tmp_path)
    succeeded(completed, "importing the benchmarks")
    assert completed.stdout.strip() == str(len(names))


@pytest.mark.parametrize("script", SCRIPTS)
def test_benchmark_smoke(script: str, tmp_path: Path) -> None:
    results = tmp_path / "results"
    arguments = [str(BENCHMARKS / script), "--smoke"]
    completed = run_script([*arguments, "--results", str(results)], tmp_path)
    succeeded(completed, f"{script} --smoke")
    check_results(results, script, WRITES[script])


def test_the_cluster_table_keeps_the_published_sizes_it_does_not_measure_again(
    tmp_path: Path,
) -> None:
    """bench_corpus's smoke measures sizes 0.5 and 1 and hands the report a published table
    of sizes 0.25 and 1 (ratio 1.5): 0.25's ratio is shown first, 1's is measured anew."""
    results = tmp_path / "results"
    arguments = [str(BENCHMARKS / "bench_corpus.py"), "--smoke", "--results", str(results)]
    succeeded(run_script(arguments, tmp_path), "bench_corpus.py --smoke")
    written = json.loads((results / "corpus_cluster.json").read_text())
    ratios = written["figures"]["cluster_over_local"]
    assert list(ratios) == ["0.25", "0.5", "1"]
    assert ratios["0.25"] == {"all_stages rexgradient.train": 1.5}
    assert ratios["1"]["all_stages rexgradient.train"] != 1.5
    [row] = written["rows"]
    assert row[written["columns"].index("cluster / local, each size")].startswith("1.50× → ")
    assert list(written["figures"]["totals"]) == ["0.25", "1"]
    assert written["note"].startswith("Size 0.25: published before. Size 1 (")


def test_a_cluster_pass_without_room_for_its_bucket_stops_before_it_starts(tmp_path: Path) -> None:
    """The kept local pass of the size added more than the disk holds: the cluster pass
    stops at once, saying what it needs, before any service starts or step runs."""
    work = tmp_path / "work"
    (work / "n1").mkdir(parents=True)
    (work / "n1" / "corpus_counts.json").write_text(json.dumps({"rexgradient": 10, "nih": 2}))
    huge = {"added_bytes": 10**16, "wall": 1.0}
    local = {"counts": {"rexgradient": 10}, "runs": {"manifest": [huge], "verify": [huge]}}
    (work / "steps_n1.json").write_text(json.dumps(local))
    arguments = [str(BENCHMARKS / "bench_corpus.py"), "--work", str(work), "--fractions", "1"]
    completed = run_script([*arguments, "--cluster"], tmp_path)
    assert completed.returncode != 0
    assert "the cluster pass at 1 needs about 20000000 GB free" in completed.stderr
    assert "the bucket 20000000 GB" in completed.stderr
    assert not (work / "cluster" / "n1" / "bucket").exists()
    assert not (work / "cluster" / "steps_n1.json").exists()  # no step ran


@pytest.mark.slow
@pytest.mark.parametrize(("script", "option", "section", "name"), SLOW_SECTIONS)
def test_slow_section_smoke(
    script: str, option: str, section: str, name: str, tmp_path: Path
) -> None:
    results = tmp_path / "results"
    arguments = [str(BENCHMARKS / script), "--smoke", option, section]
    completed = run_script([*arguments, "--results", str(results)], tmp_path)
    succeeded(completed, f"{script} --smoke {option} {section}")
    check_results(results, script, {name})


@pytest.mark.slow
def test_loader_section_reads_the_train_split_a_run_left(tmp_path: Path) -> None:
    """--training-root: ReXGradient's train rows of an output root's manifest, not a synthetic
    array; a validation row beside them is neither uploaded nor counted."""
    import pandas as pd

    root = tmp_path / "output"
    manifest = training_root_with_a_validation_row(root, tmp_path)
    results = tmp_path / "results"
    arguments = [str(BENCHMARKS / "bench_cluster.py"), "--smoke", "--section", "loader"]
    arguments += ["--training-root", str(root), "--results", str(results)]
    completed = run_script(arguments, tmp_path)
    succeeded(completed, "bench_cluster.py --smoke --section loader --training-root")
    written = json.loads((results / "cluster_loader.json").read_text())
    train = (pd.read_parquet(manifest, columns=["split"])["split"] == "train").sum()
    assert f"the {train:,} rows of a run's rexgradient.train" in written["note"]
    assert written["figures"]["images"] == train


def training_root_with_a_validation_row(root: Path, scratch: Path) -> Path:
    """The loader's synthetic train partition under `root`, its manifest's first row moved
    to the validation split; the manifest's path."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    completed = run_script(
        [
            "-c",
            "import sys; from pathlib import Path; sys.path.insert(0, sys.argv[1]); "
            "from cluster.loader import write_training_root; "
            "print(write_training_root(Path(sys.argv[2]), 48))",
            str(BENCHMARKS),
            str(root),
        ],
        scratch,
    )
    succeeded(completed, "write_training_root")
    manifest = Path(completed.stdout.strip().splitlines()[-1])
    table = pq.read_table(manifest)
    splits = ["val", *table["split"].to_pylist()[1:]]
    column = table.schema.get_field_index("split")
    pq.write_table(table.set_column(column, "split", pa.array(splits, pa.string())), manifest)
    return manifest


def test_readme_figures_are_generated_from_the_results() -> None:
    completed = run_script([str(BENCHMARKS / "tables.py"), "--check"], REPOSITORY)
    assert completed.returncode == 0, (
        "benchmarks/README.md's figures differ from benchmarks/results/*.json: run "
        f"`.venv/bin/python benchmarks/tables.py --write`\n{completed.stdout}{completed.stderr}"
    )
    assert len((BENCHMARKS / "README.md").read_bytes()) <= 20_000
