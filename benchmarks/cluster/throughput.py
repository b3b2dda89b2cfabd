"""bench_cluster.py's throughput sections: the `images` stage on the local process pool against
a Dask cluster on this machine (`dask`), and the plain process pool against the supervised one
that bounds each image's time (`time-limit`)."""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from common import DEFAULT_NOISE, WARMUP_IMAGES, Table, prepare_jpeg_sources, run_stage

from cluster.services import start_dask_cli
from radharmony_pipeline.defs.run_settings import RunSettingsResource
from radharmony_pipeline.processing.execution.parallel import map_in_chunks, map_with_time_limit
from radharmony_pipeline.processing.execution.supervised import TimeLimit
from radharmony_pipeline.processing.jobs.mask_jobs import MaskTarget, mask_job_stopped, run_mask_job
from radharmony_pipeline.settings import SCHEDULER_VARIABLE, TIMEOUT_VARIABLE, job_timeout
from radharmony_pipeline.sources import SourceLocation, open_source
from radharmony_pipeline.synthetic import generate_datasets

OVERHEAD_TARGET = 0.85  # Dask throughput / local pool throughput
SCALING_TARGET = 1.7  # two workers / one worker
TIME_LIMIT_TARGET = 0.9  # supervised pool throughput / plain pool throughput
KINDS = ("local", "cluster", "single")  # the `dask` section's configurations, in round order
SMOKE_SHAPE = (300, 240)  # --smoke: a few small JPEGs, figures meaningless


def timed_rate(sources: Sequence[Path], scratch: Path, name: str, warmup: bool = True) -> float:
    """Images per second of one `images` pass in a fresh folder, after an untimed warm-up
    (imports in the workers, page cache) unless `warmup` is false."""
    workers = RunSettingsResource().executor().slots()
    if warmup:
        run_stage(sources[:WARMUP_IMAGES], scratch / f"{name}-warmup", workers)
    run = run_stage(sources, scratch / name, workers)
    return len(sources) / run.seconds


def dask_rate(sources: Sequence[Path], scratch: Path, workers: int, name: str) -> float:
    """timed_rate on a fresh `dask` CLI cluster of `workers`, selected as the asset selects
    it: through SCHEDULER_VARIABLE."""
    # `dask worker` as it ships (daemonic worker processes): each thread's supervised child
    # that bounds every image's time is then a subprocess.
    processes = start_dask_cli(workers, scratch / f"{name}-logs")
    os.environ[SCHEDULER_VARIABLE] = processes.address
    try:
        return timed_rate(sources, scratch, name)
    finally:
        del os.environ[SCHEDULER_VARIABLE]
        processes.stop()


def dask_section(images: int, rounds: int, keep: Path | None, smoke: bool) -> Table:
    """The local pool with os.cpu_count() workers, a Dask cluster of as many single-threaded
    workers and one of a single worker, in `rounds` rounds, the order reversed every round;
    the best pass of each compared. A smoke run times the local pool once, unwarmed: it starts
    no cluster."""
    cores = os.cpu_count() or 1
    kinds = KINDS[:1] if smoke else KINDS
    with tempfile.TemporaryDirectory(prefix="bench_cluster_") as scratch_name:
        scratch = Path(scratch_name)
        shape = SMOKE_SHAPE if smoke else None
        sources, written, seconds = prepare_jpeg_sources(
            keep or scratch / "sources", images, DEFAULT_NOISE, shape
        )
        print(f"sources: {len(sources)} JPEGs ({written} written in {seconds:.1f} s)", flush=True)
        measure: dict[str, Callable[[str], float]] = {
            "local": lambda name: timed_rate(sources, scratch, name, warmup=not smoke),
            "cluster": lambda name: dask_rate(sources, scratch, cores, name),
            "single": lambda name: dask_rate(sources, scratch, 1, name),
        }
        rates: dict[str, list[float]] = {kind: [] for kind in kinds}
        for round_number in range(rounds):
            order = kinds if round_number % 2 == 0 else kinds[::-1]
            for kind in order:
                rates[kind].append(measure[kind](f"{kind}-{round_number}"))
    passes = "; ".join(
        f"{kind} " + ", ".join(f"{rate:.1f}" for rate in values) for kind, values in rates.items()
    )
    print(f"every pass (images/s): {passes}", flush=True)
    best = {kind: max(values) for kind, values in rates.items()}
    local = best["local"]
    print(f"1. local process pool, {cores} workers: {local:.1f} images/s", flush=True)
    rows: list[list[object]] = [[f"local pool, {cores} workers", f"{local:.1f} images/s", ""]]
    if "cluster" in best:
        cluster, single = best["cluster"], best["single"]
        print(
            f"2. Dask, {cores} single-threaded workers on this machine: {cluster:.1f} images/s, "
            f"{cluster / local:.2f}x the local pool (target >= {OVERHEAD_TARGET:g}x)"
        )
        print(
            f"3. Dask, 1 worker: {single:.1f} images/s; {cores} workers / 1 worker = "
            f"{cluster / single:.2f}x (target >= {SCALING_TARGET:g}x on 2 cores)"
        )
        rows += [
            [f"Dask ×{cores} / local pool", f"{cluster / local:.2f}×", f"≥ {OVERHEAD_TARGET:g}×"],
            [f"Dask ×{cores} / Dask ×1", f"{cluster / single:.2f}×", f"≥ {SCALING_TARGET:g}×"],
        ]
    note = f"{len(sources)} JPEGs, best of {rounds} passes each; every pass (images/s): {passes}."
    figures = {"images": len(sources), "workers": cores, "rounds": rounds, "rates": rates}
    return Table(
        "cluster",
        "The `images` stage on a Dask cluster",
        ["figure", "value", "target"],
        rows,
        figures,
        note,
    )


def time_limit_section(repeats: int, rounds: int, warmup: bool = True) -> Table:
    """The plain process pool (map_in_chunks, no time limit) against the supervised one the
    `masks` and `images` stages use (map_with_time_limit), building the masks of a synthetic
    ChestX-Det train split `repeats` times into separate folders on all cores, in `rounds`
    rounds after an untimed warm-up (page cache, fork server) unless `warmup` is false."""
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
        if warmup:
            throughput(None)
        rates: dict[str, list[float]] = {"plain": [], "supervised": []}
        for _ in range(rounds):
            rates["plain"].append(throughput(None))
            rates["supervised"].append(throughput(limit))
    plain, supervised = (statistics.median(rates[name]) for name in ("plain", "supervised"))
    images = len(index) * repeats
    print(f"masks of {images} ChestX-Det images on {workers} workers, median of {rounds}:")
    print(f"  plain pool      {plain:.1f} images/s")
    print(f"  with time limit {supervised:.1f} images/s")
    print(f"  ratio {supervised / plain:.2f} (target >= {TIME_LIMIT_TARGET:g})", flush=True)
    rows = [
        [f"plain pool (map_in_chunks), {workers} workers", f"{plain:.1f} images/s", ""],
        ["supervised pool (map_with_time_limit)", f"{supervised:.1f} images/s", ""],
        ["supervised / plain", f"{supervised / plain:.2f}×", f"≥ {TIME_LIMIT_TARGET:g}×"],
    ]
    note = (
        f"Masks of {images} ChestX-Det images ({len(index)} in the split, {repeats} copies); "
        f"the median of {rounds} rounds."
    )
    figures = {"images": images, "workers": workers, "rounds": rounds, "rates": rates}
    return Table(
        "time_limit",
        "The per-image time limit's cost",
        ["figure", "value", "target"],
        rows,
        figures,
        note,
        "--section time-limit",
    )
