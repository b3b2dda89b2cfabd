"""Benchmark: the whole CLI materialization of raw_index + labels, checks included, vs json.load.

Times, in one run, on full-scale synthetic ReXGradient metadata (`radharmony synth
--rexgradient-metadata-only --full-scale`):

* the wall time of the whole command, start-up included, with a fresh DAGSTER_HOME:
  `dagster asset materialize -m radharmony_pipeline.definitions --select raw_index,labels
  --partition rexgradient.train` (the step runs the partition's four checks too);
* a bare `json.load` of the same train JSON, in a fresh process (the load alone is timed);

and prints their ratio (issue 12 target: <= 5x) in wall time and in CPU time (user + system of
the whole process tree), with the machine's load average: a loaded machine slows the CLI's
many imports and processes more than one json.load, and CPU time is less sensitive to that.

    .venv/bin/python benchmarks/bench_checks.py [--root DATA_ROOT]
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BIN = Path(sys.executable).parent
PARTITION = "rexgradient.train"
TRAIN_JSON = Path("rexgradient/download/metadata/train_metadata_view_position.json")
BARE_LOAD = (
    "import json, sys, time\n"
    "start, cpu = time.perf_counter(), time.process_time()\n"
    "with open(sys.argv[1], 'rb') as handle:\n"
    "    json.load(handle)\n"
    "print(time.perf_counter() - start, time.process_time() - cpu)\n"
)


def bare_json_load(path: Path) -> tuple[float, float]:
    """Wall and CPU seconds of the load alone."""
    completed = subprocess.run(
        [sys.executable, "-c", BARE_LOAD, str(path)], capture_output=True, text=True, check=True
    )
    wall, cpu = completed.stdout.split()
    return float(wall), float(cpu)


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def cli_materialize(
    data_root: Path, scratch: Path
) -> tuple[float, float, subprocess.CompletedProcess]:
    """Wall and CPU seconds of the whole command (every process it starts), and its output."""
    home = scratch / "dagster_home"
    home.mkdir()
    environ = {k: v for k, v in os.environ.items() if not k.startswith("RADHARMONY_")}
    environ.update(
        DAGSTER_HOME=str(home),
        RADHARMONY_DATA_ROOT=str(data_root),
        RADHARMONY_OUTPUT_ROOT=str(scratch / "output"),
        # Metadata-only data has no images: every one is missing, which raw_index refuses at
        # the default limit. The folder listing still runs, as it does on a real download.
        RADHARMONY_UNREADABLE_LIMIT="1",
    )
    command = [
        str(BIN / "dagster"),
        "asset",
        "materialize",
        "-m",
        "radharmony_pipeline.definitions",
        "--select",
        "raw_index,labels",
        "--partition",
        PARTITION,
    ]
    cpu = children_cpu()
    start = time.perf_counter()
    completed = subprocess.run(command, env=environ, capture_output=True, text=True)
    return time.perf_counter() - start, children_cpu() - cpu, completed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, help="data root holding full-scale rexgradient/")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch_dir:
        scratch = Path(scratch_dir)
        data_root = args.root
        if data_root is None:
            data_root = scratch / "data"
            subprocess.run(
                [
                    str(BIN / "radharmony"),
                    "synth",
                    "--rexgradient-metadata-only",
                    "--full-scale",
                    "--out",
                    str(data_root),
                ],
                check=True,
            )
        (data_root / "rexgradient" / "deid_png").mkdir(exist_ok=True)
        train_json = data_root / TRAIN_JSON
        size_mib = train_json.stat().st_size / 2**20
        bare, bare_cpu = bare_json_load(train_json)
        cli, cli_cpu, completed = cli_materialize(data_root, scratch)
    log = completed.stdout + completed.stderr
    evaluations = log.count("ASSET_CHECK_EVALUATION")
    load = os.getloadavg()
    print(f"train JSON: {size_mib:.0f} MiB")
    print(f"bare json.load:                       {bare:6.2f} s   CPU {bare_cpu:6.2f} s")
    print(
        f"CLI materialize raw_index,labels:     {cli:6.2f} s   CPU {cli_cpu:6.2f} s   "
        f"exit code {completed.returncode}"
    )
    print(f"check evaluations in the run's log:   {evaluations}")
    print(f"ratio CLI / json.load, wall time:     {cli / bare:6.2f}x  (target <= 5x)")
    print(f"ratio CLI / json.load, CPU time:      {cli_cpu / bare_cpu:6.2f}x")
    print(f"load average (1, 5, 15 min):          {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    if completed.returncode or os.environ.get("BENCH_LOG"):
        print(log[-6000:], file=sys.stderr)
    return completed.returncode


if __name__ == "__main__":
    sys.exit(main())
