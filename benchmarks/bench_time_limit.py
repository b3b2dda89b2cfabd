"""Benchmark: what the per-image time limit costs (issue 9).

Builds the masks of a synthetic ChestX-Det train split (repeated into separate folders) on
all cores twice per round: through the plain process pool (map_in_chunks, no time limit, the
baseline) and through the supervised pool the `masks` and `images` stages use
(map_with_time_limit: one
long-lived process per worker fed single images, one message each way per image, a stuck
image killed). Prints the median
throughput of each and their ratio. Target: ratio >= 0.9.

    .venv/bin/python benchmarks/bench_time_limit.py [--repeats 20] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from radharmony_pipeline.processing.execution.parallel import map_in_chunks, map_with_time_limit
from radharmony_pipeline.processing.execution.supervised import TimeLimit
from radharmony_pipeline.processing.jobs.mask_jobs import MaskTarget, mask_job_stopped, run_mask_job
from radharmony_pipeline.settings import TIMEOUT_VARIABLE, job_timeout
from radharmony_pipeline.sources import SourceLocation, open_source
from radharmony_pipeline.synthetic import generate_datasets


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
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
                for copy in range(args.repeats)
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
        for _ in range(args.rounds):
            rates["plain"].append(throughput(None))
            rates["supervised"].append(throughput(limit))
    plain, supervised = (statistics.median(rates[name]) for name in ("plain", "supervised"))
    images = len(index) * args.repeats
    print(f"masks of {images} ChestX-Det images on {workers} workers, median of {args.rounds}:")
    print(f"  plain pool      {plain:.1f} images/s")
    print(f"  with time limit {supervised:.1f} images/s")
    print(f"  ratio {supervised / plain:.2f} (target >= 0.9)")


if __name__ == "__main__":
    main()
