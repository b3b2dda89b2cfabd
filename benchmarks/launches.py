"""Launching the pipeline as a user does (`dg launch` in a fresh process) and reading back
what the run did: the helpers of bench_reruns.py and bench_corpus.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import cv2
import numpy as np
from common import REPOSITORY, REXGRADIENT_PARTITION, drop_page_cache, write_radiograph_png

from radharmony_pipeline.processing.storage import output_layout as layout

PARTITION = REXGRADIENT_PARTITION

SUMMARY = """
import json, sys
import dagster as dg
with dg.DagsterInstance.get() as instance:
    run = instance.get_runs(limit=1)[0]
    steps = {s.step_key: round(s.end_time - s.start_time, 1)
             for s in instance.get_run_step_stats(run.run_id) if s.end_time}
    counts = {}
    for record in instance.get_records_for_run(run.run_id).records:
        event = record.event_log_entry.dagster_event
        if event is None or event.event_type_value != "ASSET_MATERIALIZATION":
            continue
        materialization = event.event_specific_data.materialization
        counts[materialization.asset_key.to_user_string()] = {
            k: getattr(v, "value", v) for k, v in materialization.metadata.items()
            if k in ("decoded", "reused", "packed_rows_written", "packed_rows_replayed")
        }
    print(json.dumps({"status": str(run.status), "steps": steps, "counts": counts}))
"""


def change_sources(sources: list[Path], share: float, round_number: int) -> int:
    """Rewrite a fresh share of the sources with other pixels; how many."""
    count = max(1, round(len(sources) * share))
    rng = np.random.default_rng(1000 + round_number)
    for position in rng.choice(len(sources), count, replace=False):
        height, width = cv2.imread(str(sources[position]), cv2.IMREAD_UNCHANGED).shape
        write_radiograph_png(sources[position], rng, height, width)
    return count


def environment(data: Path, output: Path, home: Path) -> dict[str, str]:
    venv = Path(sys.executable).parent
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith(("RADHARMONY_", "DAGSTER_"))},
        "PATH": f"{venv}:{os.environ.get('PATH', '')}",
        "VIRTUAL_ENV": str(venv.parent),
        "DAGSTER_HOME": str(home),
        "RADHARMONY_DATA_ROOT": str(data),
        "RADHARMONY_OUTPUT_ROOT": str(output),
    }


def launch_command() -> list[str]:
    quiet = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}
    dg = str(Path(sys.executable).with_name("dg"))
    return [dg, "launch", "--job", "all_stages", "--partition", PARTITION,
            "--config-json", json.dumps(quiet)]  # fmt: skip


def launch(env: dict[str, str]) -> float:
    start = time.perf_counter()
    completed = subprocess.run(launch_command(), cwd=REPOSITORY, env=env, capture_output=True)
    wall = time.perf_counter() - start
    if completed.returncode != 0:
        raise SystemExit(f"dg launch failed:\n{completed.stderr.decode()[-3000:]}")
    return wall


def launch_and_kill_halfway(env: dict[str, str], output: Path, images: int) -> float:
    """A first build killed (SIGKILL, its whole process group) once half of its PNGs are
    written; the seconds until the kill."""
    start = time.perf_counter()
    process = subprocess.Popen(
        launch_command(), cwd=REPOSITORY, env=env, start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    pattern = layout.resized_png_glob(PARTITION)
    while process.poll() is None and len(list(output.glob(pattern))) < images // 2:
        time.sleep(0.2)
    if process.returncode is not None:  # e.g. the disk filled up: there is nothing to kill
        raise SystemExit(
            f"the first build exited with {process.returncode} before half of its {images} "
            f"PNGs were written under {output}; launch it by hand to see why"
        )
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    return time.perf_counter() - start


def stat_each_command(listed: Path) -> list[str]:
    """A stat of each file `listed` (one path a line) in sequence by coreutils, no Python:
    on a cold cache, the disk's own cost of looking at each source once."""
    return ["xargs", "-d", "\\n", "-a", str(listed), "stat", "--printf="]


def cold_stat_floor(listed: Path) -> float:
    """Seconds of stat_each_command after the page cache is dropped (root only)."""
    drop_page_cache()
    start = time.perf_counter()
    subprocess.run(stat_each_command(listed), check=True)
    return time.perf_counter() - start


def summary(env: dict[str, str]) -> dict:
    completed = subprocess.run(
        [sys.executable, "-c", SUMMARY], env=env, capture_output=True, text=True, check=True
    )
    return json.loads(completed.stdout)
