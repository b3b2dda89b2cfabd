"""The processes bench_cluster.py's sections start and stop by PID, started as the cluster
tests start them (tests/cluster_services.py): a `dask scheduler` with `dask worker`
processes, and the disk-backed S3 server, with the S3 variables that point clients at it."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from common import REPOSITORY

# tests/ last on the path: benchmarks/ has modules of the same names (commands.py).
sys.path.append(str(REPOSITORY / "tests"))
from cluster_services import AWS_ENVIRONMENT, BUCKET, Services, s3_requests, start_dask
from cluster_services import start_s3_server as start_server_for

S3_BUCKET = BUCKET


@dataclass
class DaskProcesses:
    """A scheduler and its workers on 127.0.0.1."""

    services: Services

    @property
    def address(self) -> str:
        return self.services.scheduler

    def stop(self) -> None:
        """Workers first, then the scheduler."""
        self.services.stop()


def start_dask_cli(workers: int, logs: Path) -> DaskProcesses:
    """`dask scheduler` and `workers` single-threaded `dask worker` processes, which reach the
    S3 server this process's environment points at, if any."""
    logs.mkdir(parents=True, exist_ok=True)
    services = Services()
    endpoint = {"AWS_ENDPOINT_URL": os.environ.get("AWS_ENDPOINT_URL", "")}
    try:
        start_dask(services, logs, workers, extra_environment=endpoint)
    except BaseException:
        services.stop()
        raise
    return DaskProcesses(services)


@dataclass
class S3Server:
    """The disk-backed S3 server (tests/s3_server.js) on 127.0.0.1, stopped by its PID."""

    services: Services
    request_log: Path

    @property
    def endpoint(self) -> str:
        return self.services.s3_endpoint

    @property
    def pid(self) -> int:
        return self.services.s3_server.pid

    def stats(self) -> dict:
        """The server's counters; answered once every earlier request's line is logged."""
        return s3_requests(self.services)

    def stop(self) -> None:
        self.services.stop()

    def peak_mib(self) -> float:
        """The server process's peak resident memory so far (VmHWM)."""
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
        return float("nan")


def start_s3_server(folder: Path) -> S3Server:
    """The server on a free port, its objects, request log and output under `folder`."""
    services = Services()
    try:
        start_server_for(services, folder, directory=folder / "objects", request_log=True)
    except BaseException:
        services.stop()
        raise
    return S3Server(services, folder / "s3-requests.log")


@contextmanager
def s3_environment(server: S3Server) -> Iterator[None]:
    """The S3 credentials and the server's endpoint in os.environ (so this process's clients
    and every process it starts use the server), the earlier values restored after."""
    names = [*AWS_ENVIRONMENT, "AWS_ENDPOINT_URL"]
    saved = {name: os.environ.get(name) for name in names}
    os.environ.update({**AWS_ENVIRONMENT, "AWS_ENDPOINT_URL": server.endpoint})
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
