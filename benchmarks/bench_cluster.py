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

Section `requests`: the S3 requests of the `images` step on the cluster path. The synthetic
datasets at `--scale` (small: ReXGradient train 50 images, no masks; ChestX-Det train 40
images, most with a union mask) on the disk-backed S3 server (s3rver behind tests/s3_server.js,
installed by `make s3-server`), outputs on `s3://`, sources local, per-image work on a local
`dask scheduler` with 2 single-threaded `dask worker` processes. Each partition's upstream
stages are built first; then the `images` step alone, whose requests the server counts. Prints
the requests per image by kind, and split by what they were for: the image's own objects
(PNGs), the Dask chunks' shards, and the step's own (tables, the packed array, listings).
Target: <= 3 per image.

    .venv/bin/python benchmarks/bench_cluster.py --section requests [--scale small]

Section `upload`: publishing a packed array of `--upload-mib` MiB (random bytes, 1024 by
default) to the disk-backed S3 server, each way in a fresh process: the store's
`publish_file` (a multipart upload in parts of store.PART_BYTES, one part in memory) and
s3fs's own `put_file` (parts of 50 MiB, 10 at a time). Prints wall seconds, the process's
peak RSS above what it held before the upload, the server's peak RSS, and the requests by
kind; the object's size and a few ranges are checked against the file.

    .venv/bin/python benchmarks/bench_cluster.py --section upload [--upload-mib 1024]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections import Counter
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
from radharmony_pipeline.processing.storage.atomic import TEMP_MARKER
from radharmony_pipeline.settings import SCHEDULER_VARIABLE, TIMEOUT_VARIABLE, job_timeout
from radharmony_pipeline.sources import SourceLocation, open_source
from radharmony_pipeline.synthetic import generate_datasets

# One thread per worker process, on loopback; nothing else set (daemonic, as it ships).
WORKER_OPTIONS = ("--nworkers", "1", "--nthreads", "1", "--host", "127.0.0.1", "--no-dashboard")
OVERHEAD_TARGET = 0.85  # Dask throughput / local pool throughput
SCALING_TARGET = 1.7  # two workers / one worker
REQUESTS_TARGET = 3  # S3 requests per image in the `images` step (issue 60)
# The disk-backed S3 server of the tests (see tests/s3_server.js; `make s3-server`).
S3_SERVER_SCRIPT = Path(__file__).resolve().parents[1] / "tests" / "s3_server.js"
S3_BUCKET = "radharmony-bench"
S3_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "bench",
    "AWS_SECRET_ACCESS_KEY": "bench-secret",
    "AWS_DEFAULT_REGION": "us-east-1",
}
REQUEST_PARTITIONS = ("rexgradient.train", "chestx_det.train")
# `.partial-<pid>@<host>-<32 hex>-<name>` (atomic.temporary_sibling); a shard's name.
TEMPORARY_NAME = re.compile(rf"^{re.escape(TEMP_MARKER)}.*?-[0-9a-f]{{32}}-(.*)$")
SHARD_NAME = re.compile(r"^shard\d+-")


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


@dataclass
class S3Server:
    """The disk-backed S3 server (tests/s3_server.js) on 127.0.0.1, stopped by its PID."""

    endpoint: str
    process: subprocess.Popen
    request_log: Path

    def stats(self) -> dict:
        with urllib.request.urlopen(f"{self.endpoint}/-/stats", timeout=30) as answer:
            return json.loads(answer.read())

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def start_s3_server(folder: Path) -> S3Server:
    node = shutil.which("node")
    if node is None or not (S3_SERVER_SCRIPT.parents[1] / "node_modules" / "s3rver").is_dir():
        raise SystemExit("the disk-backed S3 server is not installed: run `make s3-server`")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    request_log = folder / "requests.log"
    command = [node, "--openssl-legacy-provider", str(S3_SERVER_SCRIPT)]
    command += ["--directory", str(folder / "objects"), "--address", "127.0.0.1"]
    command += ["--port", str(port), "--bucket", S3_BUCKET, "--request-log", str(request_log)]
    with open(folder / "s3-server.log", "wb") as log:
        process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **S3_CREDENTIALS}
        )
    server = S3Server(f"http://127.0.0.1:{port}", process, request_log)
    deadline = time.monotonic() + 60
    while True:
        try:
            server.stats()
            return server
        except OSError as error:
            if process.poll() is not None or time.monotonic() > deadline:
                server.stop()
                log = folder / "s3-server.log"
                raise SystemExit(f"the S3 server did not start: see {log}") from error
            time.sleep(0.2)


def request_purpose(path: str) -> str:
    """What a request was for, from the object's path: the image's own objects (its PNGs,
    under their names or temporary ones), a Dask chunk's shard, or the step's own."""
    name = urllib.parse.unquote(path.rsplit("/", 1)[-1])
    temporary = TEMPORARY_NAME.match(name)
    if temporary is not None:
        name = temporary.group(1)
        if SHARD_NAME.match(name):
            return "shards"
    return "per image" if name.endswith(".png") else "step"


@dataclass(frozen=True)
class StepRequests:
    """One `images` step: its images, wall seconds, and S3 requests by kind and purpose."""

    images: int
    seconds: float
    by_kind: Counter
    by_purpose: Counter

    def line(self, name: str) -> str:
        total = sum(self.by_kind.values())
        kinds = ", ".join(f"{kind} {n / self.images:.2f}" for kind, n in self.by_kind.most_common())
        purposes = ", ".join(
            f"{purpose} {self.by_purpose[purpose] / self.images:.2f}"
            for purpose in ("per image", "shards", "step")
        )
        return (
            f"  {name}: {self.seconds:.1f} s, {total} S3 requests = "
            f"{total / self.images:.2f} per image (target <= {REQUESTS_TARGET})\n"
            f"    by kind, per image: {kinds}\n    by purpose, per image: {purposes}"
        )

    def per_image(self) -> float:
        return sum(self.by_kind.values()) / self.images


def images_step_requests(server: S3Server, data: Path, partition: str) -> list[StepRequests]:
    """The `images` step of `partition` alone (its upstream stages built first, uncounted),
    run twice: a first build, then a re-run with nothing changed."""
    import dagster as dg

    from radharmony_pipeline.defs.assets.images import images
    from radharmony_pipeline.defs.assets.index_and_labels import raw_index_and_labels
    from radharmony_pipeline.defs.assets.masks import masks
    from radharmony_pipeline.defs.resources import pipeline_resources

    resources = pipeline_resources(data_root=data, output_root=f"s3://{S3_BUCKET}/{partition}")
    stages = [raw_index_and_labels, masks, images]
    upstream = [dg.AssetKey(name) for name in ("raw_index", "labels", "masks")]
    built = dg.materialize(stages, partition_key=partition, resources=resources, selection=upstream)
    if not built.success:
        raise SystemExit(f"building the stages before `images` of {partition} failed")
    runs = []
    for _run in ("first build", "re-run"):
        server.stats()  # answered once every earlier request's line is in the log
        offset = server.request_log.stat().st_size if server.request_log.exists() else 0
        start = time.perf_counter()
        result = dg.materialize(
            stages, partition_key=partition, resources=resources, selection=[dg.AssetKey("images")]
        )
        seconds = time.perf_counter() - start
        if not result.success:
            raise SystemExit(f"the `images` step of {partition} failed")
        server.stats()
        with open(server.request_log, "rb") as log:
            log.seek(offset)
            lines = [line.split() for line in log.read().decode().splitlines()]
        (materialization,) = result.asset_materializations_for_node("images")
        runs.append(
            StepRequests(
                images=int(materialization.metadata["images"].value),
                seconds=seconds,
                by_kind=Counter(fields[0] for fields in lines),
                by_purpose=Counter(request_purpose(fields[4]) for fields in lines),
            )
        )
    return runs


def requests_section(scale: str) -> int:
    """The S3 requests per image of the `images` step on the cluster path (see the module's
    docstring); exit status 1 when a partition is over REQUESTS_TARGET."""
    from radharmony_pipeline.synthetic import generate_datasets

    print(machine_line(), flush=True)
    over = []
    with tempfile.TemporaryDirectory(prefix="bench_cluster_requests_") as scratch_name:
        scratch = Path(scratch_name)
        data = scratch / "data"
        generate_datasets(data, scale=scale, seed=0, datasets=["rexgradient", "chestx_det"])
        server = start_s3_server(scratch)
        saved = {name: os.environ.get(name) for name in [*S3_CREDENTIALS, "AWS_ENDPOINT_URL"]}
        os.environ.update({**S3_CREDENTIALS, "AWS_ENDPOINT_URL": server.endpoint})
        dask = None
        try:
            dask = start_dask_cli(2, scratch / "dask-logs")
            os.environ[SCHEDULER_VARIABLE] = dask.address
            for partition in REQUEST_PARTITIONS:
                first, rerun = images_step_requests(server, data, partition)
                print(f"{partition}: {first.images} images", flush=True)
                print(first.line("first build"))
                print(rerun.line("re-run, nothing changed"), flush=True)
                if max(first.per_image(), rerun.per_image()) > REQUESTS_TARGET:
                    over.append(partition)
        finally:
            os.environ.pop(SCHEDULER_VARIABLE, None)
            if dask is not None:
                dask.stop()
            server.stop()
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
    if over:
        print(f"over {REQUESTS_TARGET} requests per image: {', '.join(over)}")
    return 1 if over else 0


# Run in a fresh interpreter: its peak RSS (ru_maxrss) past what it held before the upload
# (its resident memory then) is the upload's.
UPLOADER = """
import json, resource, sys, time
from pathlib import Path
import psutil
from radharmony_pipeline.processing.storage.store import output_path, publish_file
way, local, url = sys.argv[1:4]
target = output_path(url)
target.fs.connect()
before = psutil.Process().memory_info().rss // 1024
start = time.perf_counter()
if way == "store":
    publish_file(target, Path(local))
else:
    target.fs.put_file(local, target.path)
seconds = time.perf_counter() - start
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"seconds": seconds, "before_kib": before, "peak_kib": peak}))
"""


def write_random_file(path: Path, mib: int) -> None:
    with open(path, "wb") as handle:
        for _ in range(mib):
            handle.write(os.urandom(2**20))


def server_peak_mib(server: S3Server) -> float:
    """The server process's peak resident memory so far (VmHWM)."""
    for line in Path(f"/proc/{server.process.pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def same_ranges(local: Path, url: str, size: int) -> bool:
    """The object's size and four 1 MiB ranges (start, two inside, end) equal the file's."""
    from radharmony_pipeline.processing.storage.store import file_size, output_path

    target = output_path(url)
    if file_size(target) != size:
        return False
    with open(local, "rb") as handle:
        for start in (0, size // 3, 2 * size // 3, max(0, size - 2**20)):
            handle.seek(start)
            expected = handle.read(2**20)
            got = target.fs.cat_file(target.path, start=start, end=start + len(expected))
            if got != expected:
                return False
    return True


def upload_section(mib: int) -> int:
    """Peak memory and requests of one large upload, the store's way and s3fs's (see the
    module's docstring)."""
    print(machine_line(), flush=True)
    with tempfile.TemporaryDirectory(prefix="bench_cluster_upload_") as scratch_name:
        scratch = Path(scratch_name)
        local = scratch / "packed.npy"
        write_random_file(local, mib)
        size = local.stat().st_size
        server = start_s3_server(scratch)
        environment = {**os.environ, **S3_CREDENTIALS, "AWS_ENDPOINT_URL": server.endpoint}
        saved = {name: os.environ.get(name) for name in [*S3_CREDENTIALS, "AWS_ENDPOINT_URL"]}
        os.environ.update({**S3_CREDENTIALS, "AWS_ENDPOINT_URL": server.endpoint})
        try:
            for way in ("store", "s3fs"):
                url = f"s3://{S3_BUCKET}/upload-{way}/packed.npy"
                before = server.stats()["requests"]
                done = subprocess.run(
                    [sys.executable, "-c", UPLOADER, way, str(local), url],
                    env=environment,
                    capture_output=True,
                    text=True,
                )
                if done.returncode != 0:
                    raise SystemExit(f"the {way} upload failed:\n{done.stderr[-3000:]}")
                figures = json.loads(done.stdout.strip().splitlines()[-1])
                after = server.stats()["requests"]
                kinds = {
                    k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)
                }
                grown = (figures["peak_kib"] - figures["before_kib"]) / 1024
                equal = "equal" if same_ranges(local, url, size) else "DIFFERENT"
                print(
                    f"{way}: {mib} MiB in {figures['seconds']:.1f} s "
                    f"({mib / figures['seconds']:.0f} MiB/s), peak RSS "
                    f"{figures['peak_kib'] / 1024:.0f} MiB (+{grown:.0f} MiB for the upload), "
                    f"requests {kinds}, object {equal}",
                    flush=True,
                )
            print(f"server peak RSS {server_peak_mib(server):.0f} MiB")
        finally:
            server.stop()
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
    return 0


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
    parser.add_argument(
        "--section", choices=("dask", "time-limit", "requests", "upload"), default="dask"
    )
    parser.add_argument("--upload-mib", type=int, default=1024, help="upload: the file's MiB")
    parser.add_argument("--scale", default="small", help="requests: synthetic datasets' scale")
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
    if args.section == "requests":
        return requests_section(args.scale)
    if args.section == "upload":
        return upload_section(args.upload_mib)
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
