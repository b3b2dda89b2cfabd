"""Benchmark: what the object-store retry layer costs when nothing fails, and what 10 %
injected 503 SlowDown answers cost a run.

1. Requests: publishing and reading back small objects (a resized PNG's size) on a moto S3
   server, through the storage layer (`publish`, `read_bytes`: every request under the retry
   policy) against the same requests made on the s3fs client directly (the floor: no layer).
2. A run: the stages of two tiny partitions with datasets and outputs on the store, through
   the fault proxy of the tests, fault-free and with 10 % of requests answered 503.

Rounds alternate the two sides, and the medians are compared (a shared machine is noisy).
Run: `.venv/bin/python benchmarks/bench_store_retries.py [--objects N] [--rounds R]`.
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

from radharmony_pipeline.processing.atomic import temporary_sibling  # noqa: E402
from radharmony_pipeline.processing.storage import output_path, publish, read_bytes  # noqa: E402

PARTITIONS = ["chestx_det.test", "chexlocalize.val"]


def with_layer(root, count: int, payload: bytes) -> float:
    started = time.perf_counter()
    for index in range(count):
        path = root / f"layer/{index}.png"
        publish(path, lambda handle: handle.write(payload))
        read_bytes(path)
    return time.perf_counter() - started


def without_layer(root, count: int, payload: bytes) -> float:
    """The same requests (upload to a temporary key, copy, delete, read) on the client."""
    fs = root.fs
    started = time.perf_counter()
    for index in range(count):
        path = root / f"bare/{index}.png"
        temp = temporary_sibling(path)
        fs.pipe_file(temp.path, payload)
        fs.cp_file(temp.path, path.path)
        fs.rm_file(temp.path)
        fs.cat_file(path.path)
    return time.perf_counter() - started


def request_figures(endpoint: str, objects: int, rounds: int) -> None:
    os.environ.update({**AWS_ENVIRONMENT, "AWS_ENDPOINT_URL": endpoint})
    root = output_path(f"s3://{BUCKET}/bench")
    payload = os.urandom(17_000)
    with_layer(root, 20, payload), without_layer(root, 20, payload)  # warm-up
    layered, bare = [], []
    for _ in range(rounds):
        layered.append(with_layer(root, objects, payload))
        bare.append(without_layer(root, objects, payload))
    per_layered = statistics.median(layered) / objects * 1000
    per_bare = statistics.median(bare) / objects * 1000
    print(f"requests: {objects} objects x {rounds} rounds (publish + read back, 17 kB each)")
    print(f"  s3fs client directly (floor):  {per_bare:.2f} ms per object")
    print(f"  through the retry layer:       {per_layered:.2f} ms per object")
    print(f"  cost of the layer: {100 * (per_layered / per_bare - 1):+.1f} % (target <= 5 %)")


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

    def one_run(prefix: str, faults: dict) -> float:
        control.write_text(json.dumps(faults))
        time.sleep(0.01)
        started = time.perf_counter()
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
        return time.perf_counter() - started

    one_run("warm-up", {})  # untimed: imports, worker processes, the store's first objects
    clean, faulty = [], []
    for number in range(rounds):
        clean.append(one_run(f"clean{number}", {}))
        faulty.append(one_run(f"faulty{number}", {"error_rate": 0.1, "error_codes": ["SlowDown"]}))
    control.write_text("{}")
    print(f"run: stages of {', '.join(PARTITIONS)} on S3, {rounds} rounds (from scratch)")
    print(f"  fault-free:          {statistics.median(clean):.1f} s")
    print(f"  10 % answered 503:   {statistics.median(faulty):.1f} s")
    print(f"  ratio: {statistics.median(faulty) / statistics.median(clean):.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objects", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--run-rounds", type=int, default=1)
    parser.add_argument("--skip-run", action="store_true", help="only the request figures")
    args = parser.parse_args()
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
