"""Benchmark: `images` throughput on the local process pool vs a Dask cluster on this machine.

On the same synthetic full-resolution JPEGs as bench_images.py (seeded, written once), in one
run, each timed pass on a fresh output folder (nothing to re-use):

1. the local process pool with os.cpu_count() workers (the default, no Dask);
2. a Dask cluster of the same size on this machine: `dask scheduler` and os.cpu_count()
   `dask worker` processes (one thread each, otherwise as the CLI ships: daemonic worker
   processes) on loopback, stopped by PID afterwards, selected the way the asset selects it,
   through RADHARMONY_DASK_SCHEDULER. Target: within 15 % of the local pool;
3. the same with one worker. Target: the full cluster >= 1.7x one worker (on 2 cores).

Each configuration first runs an untimed warm-up over a few images (imports in the workers,
page cache). Wall-clock times. The machine's load drifts (other processes share it), so the
three configurations are measured in `--rounds` rounds, the order reversed every round
(1-2-3, 3-2-1, ...), and the best pass of each is compared; every pass is printed.

    .venv/bin/python benchmarks/bench_cluster.py [--images 120] [--rounds 2] [--keep DIR]

Needs the scale extra (`pip install -e '.[scale]'`).

Section `time-limit` (formerly bench_time_limit.py; no Dask): what the per-image time limit
costs. Builds the masks of a synthetic ChestX-Det train split (repeated `--repeats` times into
separate folders) on all cores twice per round: through the plain process pool (map_in_chunks,
no time limit, the baseline) and through the supervised pool the `masks` and `images` stages
use (map_with_time_limit: one long-lived process per worker fed single images, one message
each way per image, a stuck image killed). Prints the median throughput of each over
`--rounds` (default 3) and their ratio. Target: ratio >= 0.9.

    .venv/bin/python benchmarks/bench_cluster.py --section time-limit [--repeats 20] [--rounds 3]
    .venv/bin/python benchmarks/bench_cluster.py --smoke   # no services: local pool, time limit
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from common import (
    DEFAULT_NOISE,
    WARMUP_IMAGES,
    add_smoke,
    machine_line,
    prepare_jpeg_sources,
    run_stage,
)

from radharmony_pipeline.defs.run_settings import RunSettingsResource
from radharmony_pipeline.processing.execution.parallel import map_in_chunks, map_with_time_limit
from radharmony_pipeline.processing.execution.supervised import TimeLimit
from radharmony_pipeline.processing.jobs.mask_jobs import MaskTarget, mask_job_stopped, run_mask_job
from radharmony_pipeline.settings import SCHEDULER_VARIABLE, TIMEOUT_VARIABLE, job_timeout
from radharmony_pipeline.sources import SourceLocation, open_source
from radharmony_pipeline.synthetic import generate_datasets

# One thread per worker process, on loopback; nothing else set (daemonic, as it ships).
WORKER_OPTIONS = ("--nworkers", "1", "--nthreads", "1", "--host", "127.0.0.1", "--no-dashboard")
OVERHEAD_TARGET = 0.85  # Dask throughput / local pool throughput
SCALING_TARGET = 1.7  # two workers / one worker


def timed_rate(sources: Sequence[Path], scratch: Path, name: str) -> float:
    """Images per second of one `images` pass in a fresh folder, after an untimed warm-up."""
    workers = RunSettingsResource().executor().slots()
    run_stage(sources[:WARMUP_IMAGES], scratch / f"{name}-warmup", workers)
    run = run_stage(sources, scratch / name, workers)
    return len(sources) / run.seconds


def dask_rate(sources: Sequence[Path], scratch: Path, workers: int, name: str) -> float:
    # `dask worker` as it ships (daemonic worker processes): each thread's supervised child
    # that bounds every image's time is then a subprocess.
    processes = start_dask_cli(workers, scratch / f"{name}-logs")
    os.environ[SCHEDULER_VARIABLE] = processes.address
    try:
        return timed_rate(sources, scratch, name)
    finally:
        del os.environ[SCHEDULER_VARIABLE]
        processes.stop()


@dataclass
class DaskProcesses:
    address: str
    started: list[subprocess.Popen] = field(default_factory=list)

    def stop(self) -> None:
        """Workers first, then the scheduler: SIGINT (a clean close), SIGKILL after 20 s."""
        for process in reversed(self.started):
            if process.poll() is None:
                process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def start_dask_cli(workers: int, logs: Path) -> DaskProcesses:
    """`dask scheduler` and `workers` `dask worker` processes on 127.0.0.1."""
    from distributed import Client

    logs.mkdir(parents=True, exist_ok=True)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    dask = str(Path(sys.executable).with_name("dask"))
    processes = DaskProcesses(f"tcp://127.0.0.1:{port}")
    commands = [[dask, "scheduler", "--host", "127.0.0.1", "--port", str(port), "--no-dashboard"]]
    commands += [
        [dask, "worker", processes.address, *WORKER_OPTIONS, "--name", f"w{number}"]
        for number in range(workers)
    ]
    try:
        for number, command in enumerate(commands):
            with open(logs / f"dask-{number}.log", "wb") as log:
                processes.started.append(
                    subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
                )
        with Client(processes.address, timeout=60) as client:
            client.wait_for_workers(workers, timeout=120)
    except BaseException:
        processes.stop()
        raise
    return processes


def time_limit_section(repeats: int, rounds: int) -> None:
    """The plain process pool against the supervised one, on ChestX-Det's masks."""
    workers = os.cpu_count() or 1
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch) / "data"
        generate_datasets(root, scale="tiny", seed=0, datasets=["chestx_det"])
        source = open_source("chestx_det", SourceLocation(), {"RADHARMONY_DATA_ROOT": str(root)})
        index = source.read_split("train").index

        def jobs() -> list:
            output = Path(tempfile.mkdtemp(dir=scratch))  # fresh: every mask is written
            return [
                job
                for copy in range(repeats)
                for job in source.mask_jobs(
                    "train", index, lambda key, copy=copy: MaskTarget(output, f"{copy}/{key}")
                )
            ]

        def throughput(limit: TimeLimit | None) -> float:
            batch = jobs()
            start = time.perf_counter()
            if limit is None:
                map_in_chunks(run_mask_job, batch, workers)
            else:
                map_with_time_limit(run_mask_job, batch, workers, limit)
            return len(batch) / (time.perf_counter() - start)

        limit = TimeLimit(job_timeout(os.environ), mask_job_stopped, TIMEOUT_VARIABLE)
        throughput(None)  # warm-up: page cache, fork server
        rates: dict[str, list[float]] = {"plain": [], "supervised": []}
        for _ in range(rounds):
            rates["plain"].append(throughput(None))
            rates["supervised"].append(throughput(limit))
    plain, supervised = (statistics.median(rates[name]) for name in ("plain", "supervised"))
    images = len(index) * repeats
    print(f"masks of {images} ChestX-Det images on {workers} workers, median of {rounds}:")
    print(f"  plain pool      {plain:.1f} images/s")
    print(f"  with time limit {supervised:.1f} images/s")
    print(f"  ratio {supervised / plain:.2f} (target >= 0.9)")


def smoke() -> int:
    """No Dask services: the local-pool pass on a few small JPEGs, and the `dask` CLI the
    cluster passes start is there."""
    print(machine_line(), flush=True)
    with tempfile.TemporaryDirectory(prefix="bench_cluster_") as scratch_name:
        scratch = Path(scratch_name)
        sources, _, _ = prepare_jpeg_sources(scratch / "sources", 4, DEFAULT_NOISE, (300, 240))
        print(f"smoke: local pool {timed_rate(sources, scratch, 'local'):.1f} images/s")
    dask = Path(sys.executable).with_name("dask")
    print(f"smoke: dask CLI {'found' if dask.exists() else 'missing (the scale extra)'}: {dask}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=120, help="number of source JPEGs")
    parser.add_argument("--section", choices=("dask", "time-limit"), default="dask")
    parser.add_argument("--rounds", type=int, help="passes per configuration (2; time-limit 3)")
    parser.add_argument("--repeats", type=int, default=20, help="time-limit: split copies")
    parser.add_argument("--keep", type=Path, help="folder of source JPEGs to reuse/extend")
    add_smoke(parser)
    args = parser.parse_args(argv)
    os.environ.pop(SCHEDULER_VARIABLE, None)
    if args.smoke:
        time_limit_section(1, 1)
        return smoke()
    if args.section == "time-limit":
        time_limit_section(args.repeats, args.rounds or 3)
        return 0
    args.rounds = args.rounds or 2
    cores = os.cpu_count() or 1
    print(machine_line(), flush=True)
    with tempfile.TemporaryDirectory(prefix="bench_cluster_") as scratch_name:
        scratch = Path(scratch_name)
        sources, written, seconds = prepare_jpeg_sources(
            args.keep or scratch / "sources", args.images, DEFAULT_NOISE
        )
        print(f"sources: {len(sources)} JPEGs ({written} written in {seconds:.1f} s)", flush=True)
        measure = {
            "local": lambda name: timed_rate(sources, scratch, name),
            "cluster": lambda name: dask_rate(sources, scratch, cores, name),
            "single": lambda name: dask_rate(sources, scratch, 1, name),
        }
        rates: dict[str, list[float]] = {kind: [] for kind in measure}
        for round_number in range(args.rounds):
            order = list(measure) if round_number % 2 == 0 else list(reversed(measure))
            for kind in order:
                rates[kind].append(measure[kind](f"{kind}-{round_number}"))
        passes = "; ".join(
            f"{kind} " + ", ".join(f"{rate:.1f}" for rate in values)
            for kind, values in rates.items()
        )
        print(f"every pass (images/s): {passes}", flush=True)
        local, cluster, single = (max(rates[kind]) for kind in ("local", "cluster", "single"))
    print(f"1. local process pool, {cores} workers: {local:.1f} images/s", flush=True)
    print(
        f"2. Dask, {cores} single-threaded workers on this machine: {cluster:.1f} images/s, "
        f"{cluster / local:.2f}x the local pool (target >= {OVERHEAD_TARGET:g}x)"
    )
    print(
        f"3. Dask, 1 worker: {single:.1f} images/s; {cores} workers / 1 worker = "
        f"{cluster / single:.2f}x (target >= {SCALING_TARGET:g}x on 2 cores)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
