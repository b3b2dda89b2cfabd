"""The rehearsal on the cluster path (bench_corpus.py --cluster): the instance on PostgreSQL,
the output root on the disk-backed S3 server, the per-image work on two stock `dask worker`
processes of one thread each, all started per size and stopped by PID; and what a step cost
each of them: the server's requests by kind and bytes, every service's peak RSS; and a Dask
worker lost for good halfway through a build (issue 60's fault at size)."""

from __future__ import annotations

import contextlib
import shutil
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psutil
from common import REPOSITORY

# The services the cluster tests start, started the same way: one definition of each (tests/
# last on the path: benchmarks/ has modules of the same names).
sys.path.append(str(REPOSITORY / "tests"))  # after benchmarks/: its commands.py wins
from cluster_services import (
    BUCKET,
    Services,
    s3,
    s3_requests,
    start_dask,
    start_postgres,
    start_s3_server,
)

DASK_WORKERS = 2  # one thread each: the two cores the local run's pool uses
OUTPUT_PREFIX = "corpus"
# The build that loses a worker writes here, beside the measured steps' outputs.
WORKER_LOSS_PREFIX = "worker-loss"
# A started service's role, by what its command line runs.
ROLES = {
    "postgres": "postgres",
    "s3_server.js": "s3 server",
    "dask scheduler": "dask scheduler",
    "dask worker": "dask worker",
}


@dataclass
class ClusterPath:
    """The started services of one size, and where its outputs' objects lie on disk."""

    services: Services
    objects: Path  # the server's folder: `du` of it is the bytes a step added to the bucket

    def environment(self, home: Path, prefix: str = OUTPUT_PREFIX) -> dict[str, str]:
        """What a step's command needs to use the cluster path, its instance at `home`, its
        outputs under `prefix` of the bucket."""
        return {
            **self.services.environment(),
            "DAGSTER_HOME": str(home),
            "RADHARMONY_OUTPUT_ROOT": f"s3://{BUCKET}/{prefix}",
        }

    def processes(self) -> dict[str, list[psutil.Process]]:
        """Every live service process by the role of the process started (its children in
        the same role: a worker's nanny starts the worker and it its pool, postgres a backend
        per connection)."""
        found: dict[str, list[psutil.Process]] = {}
        for started in self.services.processes:
            if started.poll() is not None:
                continue
            parent = psutil.Process(started.pid)
            found.setdefault(role(parent), []).extend([parent, *parent.children(recursive=True)])
        return found

    def reset_peaks(self) -> None:
        """Each service process's peak RSS (VmHWM) set back to its current RSS (Linux's
        clear_refs), so the next reading is the step's own peak."""
        for processes in self.processes().values():
            for process in processes:
                with contextlib.suppress(OSError):  # ended since, or not ours to reset
                    Path(f"/proc/{process.pid}/clear_refs").write_text("5")

    def peaks_mb(self) -> dict[str, float]:
        """The largest peak RSS (VmHWM) of one process of each role since reset_peaks."""
        peaks: dict[str, float] = {}
        for name, processes in self.processes().items():
            for process in processes:
                try:
                    status = Path(f"/proc/{process.pid}/status").read_text()
                except OSError:
                    continue
                for line in status.splitlines():
                    if line.startswith("VmHWM:"):
                        peak = int(line.split()[1]) / 1024
                        peaks[name] = max(peaks.get(name, 0.0), peak)
        return peaks

    def leftover_temporaries(self) -> list[str]:
        """The keys of the bucket that a writer left under a temporary name."""
        from radharmony_pipeline.processing.storage.atomic import TEMP_MARKER

        return [key for key in s3(self.services).find(BUCKET) if TEMP_MARKER in key]

    @contextmanager
    def worker_lost_after(self, puts: int) -> Iterator[dict]:
        """While the block runs, once the server has taken `puts` more PUTs: one Dask worker
        lost for good, as a machine is, its nanny killed first (SIGKILL) so that nothing
        starts it again, then the worker. The dict yielded gets `lost_after_s`, the seconds
        until the loss, unless the block ended first."""
        ended, loss = threading.Event(), {}

        def watch() -> None:
            start, first = time.perf_counter(), self.requests()["PUT"]
            while not ended.wait(0.5):
                if self.requests()["PUT"] - first >= puts:
                    (worker,) = self.processes()["dask worker"][:1]
                    for process in [worker, *worker.children(recursive=True)]:
                        with contextlib.suppress(psutil.Error):
                            process.kill()
                    loss["lost_after_s"] = time.perf_counter() - start
                    return

        watcher = threading.Thread(target=watch, name="worker-loss", daemon=True)
        watcher.start()
        try:
            yield loss
        finally:
            ended.set()
            watcher.join()

    def open_object(self, prefix: str, name: str):
        """The object `name` under `prefix` of the bucket, open for reading."""
        return s3(self.services).open(f"{BUCKET}/{prefix}/{name}")

    def object_count(self, prefix: str, folder: str) -> int:
        return len(s3(self.services).find(f"{BUCKET}/{prefix}/{folder}"))

    def requests(self) -> Counter:
        """The server's requests so far by kind (and 5xx answers), its bytes in and out."""
        stats = s3_requests(self.services)
        counts = Counter(stats["requests"])
        counts["5xx"] = stats["status"].get("5xx", 0)
        counts.update({"bytes in": stats["bytes_in"], "bytes out": stats["bytes_out"]})
        return counts


def role(process: psutil.Process) -> str:
    try:
        command = " ".join(process.cmdline())
    except psutil.Error:
        return "ended"
    for marker, name in ROLES.items():
        if marker in command:
            return name
    return "other"


@contextmanager
def cluster_path(size_dir: Path) -> Iterator[ClusterPath]:
    """PostgreSQL, the S3 server (its objects under `size_dir`/bucket, deleted after) and a
    Dask scheduler with DASK_WORKERS workers, for one size's steps."""
    logs = size_dir / "service-logs"
    logs.mkdir(parents=True, exist_ok=True)
    objects = size_dir / "bucket"
    services = Services()
    try:
        start_postgres(services, logs)
        start_s3_server(services, logs, directory=objects)
        start_dask(services, logs, workers=DASK_WORKERS)
        yield ClusterPath(services, objects)
    finally:
        services.stop()
        shutil.rmtree(objects, ignore_errors=True)
