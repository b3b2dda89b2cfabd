"""bench_cluster.py's `upload` section: publishing a packed array of random bytes to the
disk-backed S3 server, each way in a fresh process: the store's `publish_file` (a multipart
upload in parts of store.PART_BYTES, one part in memory) and s3fs's own `put_file` (parts of
50 MiB, 10 at a time). Wall seconds, the process's peak RSS above what it held before the
upload, the server's peak RSS and the requests by kind; the object's size and a few ranges
are checked against the file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import Table

from cluster.services import S3_BUCKET, s3_environment, start_s3_server

WAYS = ("store", "s3fs")
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


def upload(way: str, local: Path, url: str) -> dict:
    """The UPLOADER's figures for one way, in a fresh process with this one's environment."""
    done = subprocess.run(
        [sys.executable, "-c", UPLOADER, way, str(local), url], capture_output=True, text=True
    )
    if done.returncode != 0:
        raise SystemExit(f"the {way} upload failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def upload_table(mib: int, ways: dict[str, dict], server_peak: float) -> Table:
    """One row per way; every figure behind them."""
    rows = []
    for way, figures in ways.items():
        seconds, peak = figures["seconds"], figures["peak_kib"] / 1024
        grown = (figures["peak_kib"] - figures["before_kib"]) / 1024
        requests = ", ".join(f"{kind} {count}" for kind, count in figures["requests"].items())
        object_check = "equal" if figures["equal"] else "DIFFERENT"
        rows.append(
            [
                way,
                f"{seconds:.1f} s",
                f"{mib / seconds:.0f} MiB/s",
                f"{peak:.0f} MiB (+{grown:.0f} MiB)",
                requests,
                object_check,
            ]
        )
    columns = ["way", "wall", "rate", "peak RSS (for the upload)", "requests", "object"]
    note = (
        f"{mib} MiB of random bytes, each way in a fresh process: the store's publish_file "
        f"and s3fs's put_file. The S3 server's peak RSS: {server_peak:.0f} MiB."
    )
    figures = {"mib": mib, "ways": ways, "server_peak_mib": server_peak}
    title = "A large upload to S3: the store's way and s3fs's"
    return Table("cluster_upload", title, columns, rows, figures, note, "--section upload")


def upload_section(mib: int) -> Table:
    """Peak memory and requests of one large upload, the store's way and s3fs's (see the
    module's docstring)."""
    ways: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="bench_cluster_upload_") as scratch_name:
        scratch = Path(scratch_name)
        local = scratch / "packed.npy"
        write_random_file(local, mib)
        size = local.stat().st_size
        server = start_s3_server(scratch)
        try:
            with s3_environment(server):
                for way in WAYS:
                    url = f"s3://{S3_BUCKET}/upload-{way}/packed.npy"
                    before = server.stats()["requests"]
                    figures = upload(way, local, url)
                    after = server.stats()["requests"]
                    figures["requests"] = {
                        k: after[k] - before.get(k, 0)
                        for k in after
                        if after[k] != before.get(k, 0)
                    }
                    figures["equal"] = same_ranges(local, url, size)
                    grown = (figures["peak_kib"] - figures["before_kib"]) / 1024
                    equal = "equal" if figures["equal"] else "DIFFERENT"
                    print(
                        f"{way}: {mib} MiB in {figures['seconds']:.1f} s "
                        f"({mib / figures['seconds']:.0f} MiB/s), peak RSS "
                        f"{figures['peak_kib'] / 1024:.0f} MiB (+{grown:.0f} MiB for the "
                        f"upload), requests {figures['requests']}, object {equal}",
                        flush=True,
                    )
                    ways[way] = figures
            server_peak = server.peak_mib()
            print(f"server peak RSS {server_peak:.0f} MiB")
            return upload_table(mib, ways, server_peak)
        finally:
            server.stop()


PNG_BYTES = 48_000  # a resized 224² radiograph PNG, about


def put_floor_section(objects: int, rounds: int = 2) -> Table:
    """The floor of the cluster path's cost per image here: `objects` PNG-sized objects
    published one after another by the store (publish_bytes: one PUT each) to the S3 server
    on this machine, beside the same files published to the local disk; per object, the
    wall and the CPU it costs this process and the server. The best of `rounds`."""
    import psutil

    from radharmony_pipeline.processing.storage.store import output_path, publish_bytes

    body = os.urandom(PNG_BYTES)
    best: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="bench_cluster_put_floor_") as scratch_name:
        scratch = Path(scratch_name)
        server = start_s3_server(scratch)
        try:
            with s3_environment(server):
                roots = {
                    "local disk": output_path(str(scratch / "local")),
                    "S3 server": output_path(f"s3://{S3_BUCKET}/floor"),
                }
                served = psutil.Process(server.pid)
                for repeat in range(rounds):
                    for where, root in roots.items():
                        server_cpu = sum(served.cpu_times()[:2])
                        cpu, start = time.process_time(), time.perf_counter()
                        for number in range(objects):
                            publish_bytes(root / f"{repeat}/{number:06d}.png", body)
                        figures = {
                            "wall_ms": (time.perf_counter() - start) * 1e3 / objects,
                            "client_cpu_ms": (time.process_time() - cpu) * 1e3 / objects,
                            "server_cpu_ms": (sum(served.cpu_times()[:2]) - server_cpu)
                            * 1e3
                            / objects,
                        }
                        print(f"round {repeat + 1}, {where}: {figures}", flush=True)
                        if where not in best or figures["wall_ms"] < best[where]["wall_ms"]:
                            best[where] = figures
        finally:
            server.stop()
    rows = [
        [
            where,
            f"{1e3 / f['wall_ms']:,.0f}",
            f"{f['wall_ms']:.2f} ms",
            f"{f['client_cpu_ms']:.2f} ms",
            f"{f['server_cpu_ms']:.2f} ms",
        ]
        for where, f in best.items()
    ]
    note = (
        f"{objects:,} objects of {PNG_BYTES:,} bytes (a resized PNG), one after another by "
        f"store.publish_bytes, best of {rounds} rounds; client and server share 2 cores."
    )
    return Table(
        "cluster_put_floor",
        "The floor of an image's output on the S3 server: one PUT",
        ["where", "objects/s", "wall per object", "client CPU", "server CPU"],
        rows,
        {"objects": objects, "bytes": PNG_BYTES, "best": best},
        note,
        "--section put-floor",
    )
