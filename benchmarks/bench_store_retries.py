"""Benchmark: what the object-store retry layer costs when nothing fails, and what 10 %
injected 503 SlowDown answers cost a run.

1. Requests: publishing and reading back small objects (a resized PNG's size) on a moto S3
   server, through the storage layer (`publish`, `read_bytes`: every request under the retry
   policy) against the same requests made on the s3fs client directly (the floor: no layer).
2. A run: the stages of two tiny partitions with datasets and outputs on the store, through
   the fault proxy of the tests, fault-free and with 10 % of requests answered 503.

A shared machine is noisy: rounds interleave the two sides, in an order reversed every
round (A-B, B-A, ...); each side's median wall and CPU time (this process's, the client's
side of each request) is printed with its spread (min-max over the rounds), and the cost is
the median of the per-round ratios, so that a drift in load between rounds cancels out.
Run: `.venv/bin/python benchmarks/bench_store_retries.py [--objects N] [--rounds R]`;
`--smoke` needs
no services and checks the timing and printing helpers only.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from cluster_services import (  # noqa: E402
    AWS_ENVIRONMENT,
    BUCKET,
    Services,
    free_port,
    port_open,
    s3,
    start_moto,
    wait_until,
)
from common import add_smoke, timed  # noqa: E402

from radharmony_pipeline.processing.storage.atomic import temporary_sibling  # noqa: E402
from radharmony_pipeline.processing.storage.store import output_path, publish, read_bytes  # noqa: E402

PARTITIONS = ["chestx_det.test", "chexlocalize.val"]


def with_layer(root, count: int, payload: bytes) -> None:
    for index in range(count):
        path = root / f"layer/{index}.png"
        publish(path, lambda handle: handle.write(payload))
        read_bytes(path)


def without_layer(root, count: int, payload: bytes) -> None:
    """The same requests (upload to a temporary key, copy, delete, read) on the client."""
    fs = root.fs
    for index in range(count):
        path = root / f"bare/{index}.png"
        temp = temporary_sibling(path)
        fs.pipe_file(temp.path, payload)
        fs.cp_file(temp.path, path.path)
        fs.rm_file(temp.path)
        fs.cat_file(path.path)


def wall_and_cpu(action) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process) of action()."""
    timing = timed(action)
    return timing.seconds, timing.cpu


def interleaved(first, second, rounds: int) -> tuple[list, list]:
    """Timings of `rounds` passes of each, A-B then B-A, alternating."""
    a, b = [], []
    for number in range(rounds):
        if number % 2 == 0:
            a.append(wall_and_cpu(first))
            b.append(wall_and_cpu(second))
        else:
            b.append(wall_and_cpu(second))
            a.append(wall_and_cpu(first))
    return a, b


def summary(timings: list[tuple[float, float]], per: int, unit: float, label: str) -> str:
    walls = [wall / per * unit for wall, _ in timings]
    cpus = [cpu / per * unit for _, cpu in timings]
    return (
        f"wall {statistics.median(walls):.2f} (spread {min(walls):.2f}-{max(walls):.2f}), "
        f"CPU {statistics.median(cpus):.2f} (spread {min(cpus):.2f}-{max(cpus):.2f}) {label}"
    )


def ratio_line(test: list, base: list, position: int) -> str:
    ratios = [t[position] / b[position] for t, b in zip(test, base, strict=True)]
    median, low, high = (100 * (r - 1) for r in (statistics.median(ratios), *minmax(ratios)))
    return f"{median:+.1f} % (rounds {low:+.1f} % to {high:+.1f} %)"


def minmax(values: list[float]) -> tuple[float, float]:
    return min(values), max(values)


def request_figures(endpoint: str, objects: int, rounds: int) -> None:
    os.environ.update({**AWS_ENVIRONMENT, "AWS_ENDPOINT_URL": endpoint})
    root = output_path(f"s3://{BUCKET}/bench")
    payload = os.urandom(17_000)
    with_layer(root, 20, payload), without_layer(root, 20, payload)  # warm-up
    layered, bare = interleaved(
        lambda: with_layer(root, objects, payload),
        lambda: without_layer(root, objects, payload),
        rounds,
    )
    print(f"requests: {objects} objects x {rounds} rounds (publish + read back, 17 kB each)")
    print(f"  s3fs client directly (floor): {summary(bare, objects, 1000, 'ms per object')}")
    print(f"  through the retry layer:      {summary(layered, objects, 1000, 'ms per object')}")
    print(f"  cost of the layer, wall: {ratio_line(layered, bare, 0)} (target <= 5 %)")
    print(f"  cost of the layer, CPU:  {ratio_line(layered, bare, 1)}")


def run_figures(services: Services, proxy_port: int, control: Path, rounds: int) -> None:
    import dagster as dg
    from fault_support import STAGES
    from test_sources_on_s3 import DEFINITIONS

    from radharmony_pipeline.defs.resources import pipeline_resources
    from radharmony_pipeline.synthetic import generate_datasets

    os.environ.update({**AWS_ENVIRONMENT, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{proxy_port}"})
    local = Path(tempfile.mkdtemp(prefix="bench-store-")) / "data"
    generate_datasets(local, scale="tiny", seed=7, mimic_format="mixed")
    s3(services).put(f"{local}/", f"{BUCKET}/data/", recursive=True)

    def one_run(prefix: str, faults: dict) -> None:
        control.write_text(json.dumps(faults))
        time.sleep(0.01)
        for key in PARTITIONS:
            result = dg.materialize(
                DEFINITIONS,
                partition_key=key,
                resources=pipeline_resources(f"s3://{BUCKET}/data", f"s3://{BUCKET}/{prefix}"),
                selection=STAGES.without_checks(),
                instance=dg.DagsterInstance.ephemeral(),
                raise_on_error=False,
            )
            assert result.success, f"{prefix} {key} failed"

    one_run("warm-up", {})  # untimed: imports, worker processes, the store's first objects
    names = iter(range(10**6))
    slow_down = {"error_rate": 0.1, "error_codes": ["SlowDown"]}
    faulty, clean = interleaved(
        lambda: one_run(f"faulty{next(names)}", slow_down),
        lambda: one_run(f"clean{next(names)}", {}),
        rounds,
    )
    control.write_text("{}")
    print(f"run: stages of {', '.join(PARTITIONS)} on S3, {rounds} rounds (from scratch)")
    print(f"  fault-free:          {summary(clean, 1, 1, 's')}")
    print(f"  10 % answered 503:   {summary(faulty, 1, 1, 's')}")
    print(f"  10 % 503s against fault-free, wall: {ratio_line(faulty, clean, 0)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objects", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--run-rounds", type=int, default=2)
    parser.add_argument("--skip-run", action="store_true", help="only the request figures")
    add_smoke(parser)
    args = parser.parse_args()
    if args.smoke:  # no moto, no proxy: the interleaving and the printed figures only
        clean, faulty = interleaved(lambda: sum(range(10_000)), lambda: sum(range(20_000)), 2)
        print(f"smoke: {summary(clean, 1, 1e3, 'ms')}; {ratio_line(faulty, clean, 0)}")
        return
    logs = Path(tempfile.mkdtemp(prefix="bench-store-logs-"))
    services = Services()
    try:
        start_moto(services, logs)
        request_figures(services.s3_endpoint, args.objects, args.rounds)
        if not args.skip_run:
            os.environ["RADHARMONY_WORKERS"] = "2"
            control = logs / "faults.json"
            control.write_text("{}")
            port = free_port()
            upstream = services.s3_endpoint.rsplit(":", 1)[1]
            proxy = services.start(
                [
                    sys.executable,
                    str(REPO / "tests" / "fault_proxy.py"),
                    str(port),
                    upstream,
                    str(control),
                ],
                logs / "proxy.log",
            )
            wait_until(lambda: port_open(port), "fault proxy", proxy)
            run_figures(services, port, control, args.run_rounds)
    finally:
        services.stop()


if __name__ == "__main__":
    main()
