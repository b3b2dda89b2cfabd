"""Benchmark: what the object-store retry layer costs when nothing fails, and what 10 %
injected 503 SlowDown answers cost a run."""

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

import cluster_services as services  # noqa: E402
from common import Table, add_options, timed, write_table  # noqa: E402

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
    median, low, high = (
        100 * (r - 1) for r in (statistics.median(ratios), min(ratios), max(ratios))
    )
    return f"{median:+.1f} % (rounds {low:+.1f} % to {high:+.1f} %)"


def request_rows(objects: int, rounds: int, with_layer, without_layer) -> tuple[list, dict]:
    """The layer against the bare client, interleaved: rows and figures."""
    layered, bare = interleaved(with_layer, without_layer, rounds)
    rows = [
        [
            "requests: s3fs client directly (floor)",
            summary(bare, objects, 1000, "ms per object"),
            "",
        ],
        ["requests: through the retry layer", summary(layered, objects, 1000, "ms per object"), ""],
        ["cost of the layer, wall", ratio_line(layered, bare, 0), "≤ 5 %"],
        ["cost of the layer, CPU", ratio_line(layered, bare, 1), ""],
    ]
    return rows, {"objects": objects, "rounds": rounds, "layered": layered, "bare": bare}


def request_figures(endpoint: str, objects: int, rounds: int) -> tuple[list, dict]:
    os.environ.update({**services.AWS_ENVIRONMENT, "AWS_ENDPOINT_URL": endpoint})
    root = output_path(f"s3://{services.BUCKET}/bench")
    payload = os.urandom(17_000)
    with_layer(root, 20, payload), without_layer(root, 20, payload)  # warm-up
    print(f"requests: {objects} objects x {rounds} rounds (publish + read back, 17 kB each)")
    return request_rows(
        objects,
        rounds,
        lambda: with_layer(root, objects, payload),
        lambda: without_layer(root, objects, payload),
    )


def run_figures(
    running: services.Services, proxy_port: int, control: Path, rounds: int
) -> tuple[list, dict]:
    import dagster as dg
    from fault_support import STAGES
    from test_sources_on_s3 import DEFINITIONS

    from radharmony_pipeline.defs.resources import pipeline_resources
    from radharmony_pipeline.synthetic import generate_datasets

    bucket = services.BUCKET
    os.environ.update(
        {**services.AWS_ENVIRONMENT, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{proxy_port}"}
    )
    local = Path(tempfile.mkdtemp(prefix="bench-store-")) / "data"
    generate_datasets(local, scale="tiny", seed=7, mimic_format="mixed")
    services.s3(running).put(f"{local}/", f"{bucket}/data/", recursive=True)

    def one_run(prefix: str, faults: dict) -> None:
        control.write_text(json.dumps(faults))
        time.sleep(0.01)
        for key in PARTITIONS:
            result = dg.materialize(
                DEFINITIONS,
                partition_key=key,
                resources=pipeline_resources(f"s3://{bucket}/data", f"s3://{bucket}/{prefix}"),
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
    rows = [
        ["run: fault-free", summary(clean, 1, 1, "s"), ""],
        ["run: 10 % answered 503", summary(faulty, 1, 1, "s"), ""],
        ["10 % 503s against fault-free, wall", ratio_line(faulty, clean, 0), ""],
    ]
    return rows, {"rounds": rounds, "clean": clean, "faulty": faulty}


def main() -> None:
    """On a moto S3 server: small objects published and read back through the storage layer
    (every request under the retry policy) against the same requests on the s3fs client
    (the floor); then the stages of two tiny partitions on the store through the tests'
    fault proxy, fault-free and with 10 % of requests answered 503. Rounds interleave the two
    sides, A-B then B-A (a drift in load cancels out); the cost is the median of per-round
    ratios. `--smoke` needs no services: two sums stand in for the sides."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--objects", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--run-rounds", type=int, default=2)
    parser.add_argument("--skip-run", action="store_true", help="only the request figures")
    add_options(parser)
    args = parser.parse_args()
    title = "The object-store retry layer: fault-free, and with 10 % of requests answered 503"
    if args.smoke:  # no moto, no proxy: two sums stand in for the two sides
        rows, figures = request_rows(1, 2, lambda: sum(range(20_000)), lambda: sum(range(10_000)))
        write_table(
            args, Table("store_retries", title, ["figure", "value", "target"], rows, figures)
        )
        return
    logs = Path(tempfile.mkdtemp(prefix="bench-store-logs-"))
    running = services.Services()
    try:
        services.start_moto(running, logs)
        rows, figures = request_figures(running.s3_endpoint, args.objects, args.rounds)
        if not args.skip_run:
            os.environ["RADHARMONY_WORKERS"] = "2"
            control = logs / "faults.json"
            control.write_text("{}")
            port = services.free_port()
            upstream = running.s3_endpoint.rsplit(":", 1)[1]
            proxy_script = str(REPO / "tests" / "fault_proxy.py")
            command = [sys.executable, proxy_script, str(port), upstream, str(control)]
            proxy = running.start(command, logs / "proxy.log")
            services.wait_until(lambda: services.port_open(port), "fault proxy", proxy)
            run_rows, figures["run"] = run_figures(running, port, control, args.run_rounds)
            rows += run_rows
    finally:
        running.stop()
    write_table(args, Table("store_retries", title, ["figure", "value", "target"], rows, figures))


if __name__ == "__main__":
    main()
