"""Benchmark: `images` throughput on the local process pool vs a Dask cluster on this machine,
what the per-image time limit costs, and the S3 requests and memory of the cluster path.

Section `dask` (the default; cluster/throughput.py; table `cluster`): on the same synthetic
full-resolution JPEGs as bench_images.py (seeded, written once), each timed pass on a fresh
output folder (nothing to re-use):

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

Section `time-limit` (formerly bench_time_limit.py; cluster/throughput.py; table
`time_limit`; no Dask): builds the masks of a synthetic ChestX-Det train split (repeated
`--repeats` times into separate folders) on all cores twice per round: through the plain
process pool (map_in_chunks, no time limit, the baseline) and through the supervised pool the
`masks` and `images` stages use (map_with_time_limit: one long-lived process per worker fed
single images, one message each way per image, a stuck image killed). The median throughput
of each over `--rounds` (default 3) and their ratio. Target: ratio >= 0.9.

    .venv/bin/python benchmarks/bench_cluster.py --section time-limit [--repeats 20] [--rounds 3]

Section `requests` (cluster/requests.py; table `cluster_requests`): the S3 requests per image
of the `images` step on the cluster path, the synthetic datasets at `--scale` (small:
ReXGradient train 50 images, no masks; ChestX-Det train 40 images, most with a union mask) on
the disk-backed S3 server (s3rver behind tests/s3_server.js, installed by `make s3-server`).
Target: <= 3 per image; exits 1 when a partition is over it.

    .venv/bin/python benchmarks/bench_cluster.py --section requests [--scale small]

Section `upload` (cluster/upload.py; table `cluster_upload`): publishing a packed array of
`--upload-mib` MiB (1024 by default) to the same server, the store's way and s3fs's.

    .venv/bin/python benchmarks/bench_cluster.py --section upload [--upload-mib 1024]

Section `put-floor` (cluster/upload.py; table `cluster_put_floor`): the floor of an image's
output on the cluster path: `--images` × 25 (3,000) PNG-sized objects published one after
another by the store (one PUT each) to the same server, beside the same to the local disk;
per object the wall and the CPU it costs the client and the server.

    .venv/bin/python benchmarks/bench_cluster.py --section put-floor [--images 120]

Section `loader` (cluster/loader.py; table `cluster_loader`): training from the bucket:
ManifestDataset's samples/s with 0, 2 and 4 DataLoader workers over a shuffled pass of
`--samples` rows of a `--rows`-row train partition, from the local disk and from the same
files on the S3 server, alternated in each of `--rounds` (2) rounds, and the bytes the server
sent per sample. Target: the bucket >= half the local disk's rate with 4 workers. With
`--training-root`, ReXGradient's train in an output root a run left instead (the rehearsal's at
the real size: bench_corpus.py --keep leaves it under --work/n1/output).

    .venv/bin/python benchmarks/bench_cluster.py --section loader [--rows 20000] [--samples 4000]
    .venv/bin/python benchmarks/bench_cluster.py --section loader --training-root DIR

A smoke run starts no services: the time limit on one copy of the split in one round and the
local pool on 4 small JPEGs, neither warmed up (tables `time_limit` and `cluster`), and looks
for the `dask` CLI the cluster passes start.

    .venv/bin/python benchmarks/bench_cluster.py --smoke
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from common import add_options, machine_line, write_table

# Pool workers re-import this script (as __mp_main__) in every pool a section starts, so its
# top level imports only what parsing needs; each section's module is imported as it runs.
SECTIONS = ("dask", "time-limit", "requests", "upload", "put-floor", "loader")
SMOKE_IMAGES = 4
SMOKE_ROWS = 256


def parse_arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=120, help="number of source JPEGs")
    parser.add_argument("--section", choices=SECTIONS, default="dask")
    parser.add_argument("--upload-mib", type=int, default=1024, help="upload: the file's MiB")
    parser.add_argument("--scale", default="small", help="requests: synthetic datasets' scale")
    parser.add_argument("--rounds", type=int, help="passes per configuration (2; time-limit 3)")
    parser.add_argument("--repeats", type=int, default=20, help="time-limit: split copies")
    parser.add_argument("--rows", type=int, default=20_000, help="loader: packed array's rows")
    parser.add_argument("--samples", type=int, default=4_000, help="loader: samples per pass")
    parser.add_argument(
        "--training-root",
        type=Path,
        help="loader: an output root a run left (its manifest's ReXGradient train rows), "
        "instead of a synthetic partition of --rows",
    )
    parser.add_argument("--keep", type=Path, help="folder of source JPEGs to reuse/extend")
    add_options(parser)
    return parser.parse_args(argv)


def smoke(args: argparse.Namespace) -> int:
    """No services, no warm-ups: the time limit's two pools once and the local-pool pass on a
    few small JPEGs, each writing its table; and the `dask` CLI the cluster passes start.
    With `--section loader` or `put-floor`, that section on a few rows or objects, its S3
    server started."""
    from cluster.throughput import dask_section, time_limit_section

    if args.section == "loader":
        from cluster.loader import loader_section

        write_table(args, loader_section(SMOKE_ROWS, SMOKE_ROWS // 2, 1, args.training_root))
        return 0
    if args.section == "put-floor":
        from cluster.upload import put_floor_section

        write_table(args, put_floor_section(SMOKE_ROWS, 1))
        return 0

    write_table(args, time_limit_section(1, 1, warmup=False))
    write_table(args, dask_section(SMOKE_IMAGES, 1, None, smoke=True))
    dask = Path(sys.executable).with_name("dask")
    print(f"smoke: dask CLI {'found' if dask.exists() else 'missing (the scale extra)'}: {dask}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_arguments(argv)
    from radharmony_pipeline.settings import SCHEDULER_VARIABLE

    # The local passes are the default executor's: a scheduler in the caller's environment
    # would send them to its cluster. The cluster passes set it themselves.
    os.environ.pop(SCHEDULER_VARIABLE, None)
    print(machine_line(), flush=True)
    if args.smoke:
        return smoke(args)
    if args.section == "time-limit":
        from cluster.throughput import time_limit_section

        write_table(args, time_limit_section(args.repeats, args.rounds or 3))
    elif args.section == "requests":
        from cluster.requests import requests_section

        requests = requests_section(args.scale)
        write_table(args, requests)
        return 1 if requests.figures["over"] else 0
    elif args.section == "loader":
        from cluster.loader import loader_section

        write_table(
            args,
            loader_section(args.rows, args.samples, args.rounds or 2, args.training_root),
        )
    elif args.section == "put-floor":
        from cluster.upload import put_floor_section

        write_table(args, put_floor_section(args.images * 25, args.rounds or 2))
    elif args.section == "upload":
        from cluster.upload import upload_section

        write_table(args, upload_section(args.upload_mib))
    else:
        from cluster.throughput import dask_section

        write_table(args, dask_section(args.images, args.rounds or 2, args.keep, smoke=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
