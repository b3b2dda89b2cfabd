"""The pipeline's commands run as a user runs them, and what they cost: `dg launch` and what
the run did (from its instance), a cold stat of each source by coreutils, and any command
under /usr/bin/time with the peak RSS of its largest process and of its process tree."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
from common import REPOSITORY, drop_page_cache

from radharmony_pipeline.processing.storage import output_layout as layout

# --- `dg launch` as a user runs it, and what the run did -------------------------------------

LAUNCHED_PARTITION = "rexgradient.train"
QUIET = json.dumps({"loggers": {"console": {"config": {"log_level": "WARNING"}}}})
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


def launch_environment(data: Path, output: Path, home: Path) -> dict[str, str]:
    venv = Path(sys.executable).parent
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith(("RADHARMONY_", "DAGSTER_"))},
        "PATH": f"{venv}:{os.environ.get('PATH', '')}",
        "VIRTUAL_ENV": str(venv.parent),
        "DAGSTER_HOME": str(home),
        "RADHARMONY_DATA_ROOT": str(data),
        "RADHARMONY_OUTPUT_ROOT": str(output),
    }


def launch_command(
    job: str = "all_stages", partition: str | None = LAUNCHED_PARTITION
) -> list[str]:
    dg = str(Path(sys.executable).with_name("dg"))
    chosen = ["--partition", partition] if partition else []
    return [dg, "launch", "--config-json", QUIET, "--job", job, *chosen]


def launch(env: dict[str, str]) -> float:
    """Wall seconds of `dg launch` of ReXGradient train's `all_stages`."""
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
    pattern = layout.resized_png_glob(LAUNCHED_PARTITION)
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


def launch_summary(env: dict[str, str]) -> dict:
    """The latest run's status, its steps' seconds and its stages' counts (decoded, reused,
    packed rows written and replayed), from the instance."""
    completed = subprocess.run(
        [sys.executable, "-c", SUMMARY], env=env, capture_output=True, text=True, check=True
    )
    return json.loads(completed.stdout)


# --- any command under /usr/bin/time ---------------------------------------------------------


def under_time(command: list[str], env: dict | None = None) -> tuple[float, int, int, str]:
    """(wall, peak RSS of the largest process as /usr/bin/time gives it, peak summed RSS of
    the process tree sampled every 50 ms, stderr) of a command, which must succeed."""
    started, tree_peak = time.perf_counter(), 0
    process = subprocess.Popen(
        ["/usr/bin/time", "-f", "maxrss_kb=%M", *command],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    watched = psutil.Process(process.pid)
    while process.poll() is None:
        tree_peak = max(tree_peak, _tree_rss(watched))
        time.sleep(0.05)
    wall, (out, err) = time.perf_counter() - started, process.communicate()
    if process.returncode != 0:
        raise SystemExit(f"{command[:4]} failed ({process.returncode}):\n{out}\n{err}")
    largest = int(re.search(r"maxrss_kb=(\d+)", err).group(1)) * 1024
    return wall, largest, tree_peak, err


def _tree_rss(process: psutil.Process) -> int:
    total = 0
    with contextlib.suppress(psutil.Error):  # it ended meanwhile
        for member in [process, *process.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):  # this one ended meanwhile
                total += member.memory_info().rss
    return total
