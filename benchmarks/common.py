"""What every benchmark needs: the run's context, options and results JSON, timing, the page
cache, and the `images` stage as its asset runs it. No benchmark imports another."""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing.forkserver
import os
import platform
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import psutil
from tables import table as markdown_table

if TYPE_CHECKING:
    from radharmony_pipeline.processing.jobs.image_jobs import ImageJob, ImageRow

# Pool workers re-import the main script (as __mp_main__), and with it this module: its top
# level holds only imports and definitions, and the stage's modules are imported when used.
BENCHMARKS = Path(__file__).resolve().parent
REPOSITORY = BENCHMARKS.parent
# A run's tables go to results/runs/ (not in git); publishing one is moving it up to results/,
# whose files the README's tables are generated from: a partial or noisy run (a smoke, a
# single step, a before/after comparison) never replaces a published figure by itself.
RUNS = BENCHMARKS / "results" / "runs"
SIZE = 224  # the output side every image benchmark resizes to
# Names bench_cluster.py takes from here, imported when asked for: the synthetic package's
# import costs a script that writes no sources a second.
FROM_SYNTHETIC_INPUTS = ("DEFAULT_NOISE", "prepare_jpeg_sources")
STARTED = datetime.now(UTC)  # this module is imported as a run starts: `measured` begins here
LOAD_AT_START = os.getloadavg()[0]


def __getattr__(name: str) -> object:
    if name in FROM_SYNTHETIC_INPUTS:
        import synthetic_inputs

        return getattr(synthetic_inputs, name)
    raise AttributeError(f"module 'common' has no attribute {name!r}")


# --- the run's context, options and results ------------------------------------------------


def machine_line() -> str:
    processor = platform.processor() or "unknown processor"
    return (
        f"machine: os.cpu_count()={os.cpu_count()}, {processor} / {platform.machine()}, "
        f"Python {platform.python_version()} ({platform.system()} {platform.release()})"
    )


def load_line() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} {five:.2f} {fifteen:.2f}"


def add_smoke(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="tiny input, a few seconds: checks the benchmark runs, its figures mean nothing",
    )


def add_options(parser: argparse.ArgumentParser) -> None:
    """--smoke and --results DIR, which every benchmark writing results JSON takes."""
    add_smoke(parser)
    parser.add_argument(
        "--results",
        type=Path,
        metavar="DIR",
        help="folder for the results JSON (default benchmarks/results/runs; with --smoke a "
        "new temporary folder)",
    )


@dataclass
class Table:
    """One results file: a titled table as the README shows it, the figures behind it."""

    name: str  # the file's name under the results folder, without .json
    title: str
    columns: list[str]
    rows: list[list[object]]
    figures: dict = field(default_factory=dict)
    note: str = ""
    section: str = ""  # the options that choose it, after the script's name


def write_table(args: argparse.Namespace, result: Table) -> Path:
    """`result` written as <results folder>/<name>.json and printed as the README shows it."""
    if args.results is None:
        args.results = Path(tempfile.mkdtemp(prefix="bench-results-")) if args.smoke else RUNS
    script = Path(sys.argv[0]).name
    ended, loads = datetime.now(UTC), (LOAD_AT_START, os.getloadavg()[0])
    record = {
        "benchmark": f"{script} {result.section}".strip(),
        "title": result.title,
        "source": f"commit {_commit()}",
        "measured": f"{STARTED:%Y-%m-%d %H:%M}–{ended:%H:%M} UTC, load "
        f"{min(loads):.1f}–{max(loads):.1f}",
        "command": f".venv/bin/python benchmarks/{script} {shlex.join(_own_options())}".strip(),
        "columns": result.columns,
        "rows": [["" if cell is None else str(cell) for cell in row] for row in result.rows],
        **({"note": result.note} if result.note else {}),
        "figures": result.figures,
    }
    target = args.results / f"{result.name}.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(record, indent=2, ensure_ascii=False, default=_plain) + "\n")
    print(f"\n### {result.title}\n", *markdown_table(result.columns, record["rows"]), sep="\n")
    print(f"(written to {target})", flush=True)
    return target


def _own_options() -> list[str]:
    """This run's options without --results, which says where figures go, not what ran."""
    kept, options = [], iter(sys.argv[1:])
    for option in options:
        if option == "--results":
            next(options, None)  # its folder
        elif not option.startswith("--results="):
            kept.append(option)
    return kept


def _commit() -> str:
    done = subprocess.run(
        ["git", "describe", "--always", "--dirty"], cwd=REPOSITORY, capture_output=True, text=True
    )
    return done.stdout.strip() or "unknown"


def _plain(value: object) -> object:
    """NumPy scalars and paths as JSON takes them."""
    return value.item() if isinstance(value, np.generic) else str(value)


# --- timing --------------------------------------------------------------------------------


@dataclass
class Timing:
    seconds: float  # wall, median of the repeats
    cpu: float  # CPU seconds of this process, median of the repeats
    peak_rss_mib: float  # this process's peak RSS so far
    result: object  # the last call's


def peak_rss_mib() -> float:
    """This process's peak resident set size (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def timed(function: Callable[[], object], repeats: int = 1, cold: bool = False) -> Timing:
    """Median wall and CPU seconds of `repeats` calls of function(), the page cache dropped
    before each when `cold` (root only)."""
    walls, cpus, result = [], [], None
    for _ in range(repeats):
        if cold:
            drop_page_cache()
        wall, cpu = time.perf_counter(), time.process_time()
        result = function()
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return Timing(statistics.median(walls), statistics.median(cpus), peak_rss_mib(), result)


def per_item(
    function: Callable[[object], object],
    items: Sequence,
    repeats: int = 1,
    clock: Callable[[], float] = time.perf_counter,
) -> float:
    """The best over `repeats` passes of `clock` seconds per item of function over `items`
    (the best: a pass can only be slowed down by other load, never sped up)."""
    best = math.inf
    for _ in range(repeats):
        start = clock()
        for item in items:
            function(item)
        best = min(best, (clock() - start) / len(items))
    return best


def cpu_per_image(function: Callable[[object], object], items: Sequence, repeats: int) -> float:
    """The best over `repeats` of the CPU seconds per item of function over `items`."""
    return per_item(function, items, repeats, time.process_time)


def ratio(part: float, whole: float) -> float:
    """part / whole, NaN when whole measured zero: CPU times count in clock ticks (10 ms
    here), and a smoke run's few images can take less than one."""
    return part / whole if whole > 0 else math.nan


def pool_cpu_seconds() -> float:
    """CPU seconds of this process and of every worker process so far (pool_cpu_times)."""
    return sum(pool_cpu_times())


def pool_cpu_times() -> tuple[float, float]:
    """(user, system) CPU seconds of this process and of every worker process so far.

    Workers are forked by multiprocessing's fork server, not by us: their CPU time shows in
    the server's children times once it has reaped them (it has, when the pool has joined
    them). The server's pid is a private attribute of multiprocessing; 0 without a server.
    """
    own = psutil.Process().cpu_times()
    user, system = own.user, own.system
    server = getattr(multiprocessing.forkserver._forkserver, "_forkserver_pid", None)
    if server:
        times = psutil.Process(server).cpu_times()
        user += times.user + times.children_user
        system += times.system + times.children_system
    return user, system


# --- the page cache ---------------------------------------------------------------------------

DROP_CACHES = Path("/proc/sys/vm/drop_caches")


def drop_page_cache() -> None:
    """Written data to disk, then every clean page, dentry and inode dropped (root only)."""
    os.sync()
    DROP_CACHES.write_text("3\n")


def can_drop_page_cache() -> bool:
    return os.access(DROP_CACHES, os.W_OK)


# --- the images stage, as its asset runs it --------------------------------------------------

STAGE_PARTITION = "chexpert.train"
WARMUP_IMAGES = 6  # the untimed pass over a few images before timed stage runs


def stage_jobs(sources: Sequence[Path], output_root: Path, partition: str) -> list[ImageJob]:
    """The jobs the `images` asset builds for these sources (letterbox, SIZE, no union
    masks), their PNGs where the layout puts `partition`'s under `output_root`."""
    from radharmony_pipeline.processing.jobs.image_jobs import ImageJob
    from radharmony_pipeline.processing.storage import output_layout as layout

    alike = {"union_mask_file": None, "mask_relative": None, "size": SIZE, "resize": "letterbox"}
    return [
        ImageJob(
            image_id=source.stem,
            source_file=source,
            output_root=output_root,
            image_relative=layout.resized_image(partition, source.stem),
            row=row,
            **alike,
        )
        for row, source in enumerate(sources)
    ]


@dataclass
class StageRun:
    seconds: float
    cpu_seconds: float  # this process's and its workers'
    rows: list[ImageRow]
    packed: Path


def run_stage(
    sources: Sequence[Path], output_root: Path, workers: int, partition: str = STAGE_PARTITION
) -> StageRun:
    """What `images` does for one partition, minus Dagster: jobs built as the asset builds
    them, build_packed_images (the asset's own call) and the rows' table."""
    from radharmony_pipeline.processing.jobs.image_jobs import (
        build_packed_images,
        image_job_stopped,
        image_table,
    )
    from radharmony_pipeline.processing.storage import output_layout as layout

    folder = output_root / layout.resized_image_folder(partition)
    packed = output_root / layout.packed_images(partition)
    start, cpu_start = time.perf_counter(), pool_cpu_seconds()
    folder.mkdir(parents=True, exist_ok=True)
    jobs = stage_jobs(sources, output_root, partition)
    # As the asset runs them: executor and time limit from the run settings (imported here,
    # as the stage's modules above, so pool workers re-importing this module import neither).
    from radharmony_pipeline.defs.run_settings import RunSettingsResource

    settings = RunSettingsResource(workers=workers)
    limit = settings.time_limit(image_job_stopped)
    rows = build_packed_images(jobs, packed, SIZE, settings.executor(), time_limit=limit)
    table = image_table(rows)
    seconds, cpu_seconds = time.perf_counter() - start, pool_cpu_seconds() - cpu_start
    failed = table[table["status"] != "ok"]
    if len(failed):
        raise SystemExit(f"images stage: {len(failed)} rows failed: {failed['error'].iloc[0]}")
    return StageRun(seconds, cpu_seconds, rows, packed)
