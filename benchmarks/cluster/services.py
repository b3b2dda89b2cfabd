"""The processes bench_cluster.py's sections start and stop by PID: a `dask scheduler` with
`dask worker` processes, and the disk-backed S3 server of the tests (tests/s3_server.js,
installed by `make s3-server`), with the S3 variables that point clients at it."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from common import REPOSITORY

# One thread per worker process, on loopback; nothing else set (daemonic, as it ships).
WORKER_OPTIONS = ("--nworkers", "1", "--nthreads", "1", "--host", "127.0.0.1", "--no-dashboard")
S3_SERVER_SCRIPT = REPOSITORY / "tests" / "s3_server.js"
S3_BUCKET = "radharmony-bench"
S3_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "bench",
    "AWS_SECRET_ACCESS_KEY": "bench-secret",
    "AWS_DEFAULT_REGION": "us-east-1",
}
STOP_SECONDS = 20  # a clean close's wait before SIGKILL


def free_port() -> int:
    """A loopback port nothing listens on now (the OS's choice)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def stop_process(process: subprocess.Popen) -> None:
    """SIGINT (a clean close), SIGKILL after STOP_SECONDS."""
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
    try:
        process.wait(timeout=STOP_SECONDS)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@dataclass
class DaskProcesses:
    address: str
    started: list[subprocess.Popen] = field(default_factory=list)

    def stop(self) -> None:
        """Workers first, then the scheduler."""
        for process in reversed(self.started):
            stop_process(process)


def start_dask_cli(workers: int, logs: Path) -> DaskProcesses:
    """`dask scheduler` and `workers` `dask worker` processes on 127.0.0.1, each inheriting
    this process's environment (the S3 variables included, when set)."""
    from distributed import Client

    logs.mkdir(parents=True, exist_ok=True)
    port = free_port()
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


@dataclass
class S3Server:
    """The disk-backed S3 server (tests/s3_server.js) on 127.0.0.1, stopped by its PID."""

    endpoint: str
    process: subprocess.Popen
    request_log: Path

    def stats(self) -> dict:
        """The server's counters; answered once every earlier request's line is logged."""
        with urllib.request.urlopen(f"{self.endpoint}/-/stats", timeout=30) as answer:
            return json.loads(answer.read())

    def stop(self) -> None:
        stop_process(self.process)

    def peak_mib(self) -> float:
        """The server process's peak resident memory so far (VmHWM)."""
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
        return float("nan")


def start_s3_server(folder: Path) -> S3Server:
    """The server on a free port, its objects, request log and output under `folder`."""
    node = shutil.which("node")
    if node is None or not (S3_SERVER_SCRIPT.parents[1] / "node_modules" / "s3rver").is_dir():
        raise SystemExit("the disk-backed S3 server is not installed: run `make s3-server`")
    port = free_port()
    request_log = folder / "requests.log"
    command = [node, "--openssl-legacy-provider", str(S3_SERVER_SCRIPT)]
    command += ["--directory", str(folder / "objects"), "--address", "127.0.0.1"]
    command += ["--port", str(port), "--bucket", S3_BUCKET, "--request-log", str(request_log)]
    log = folder / "s3-server.log"
    with open(log, "wb") as output:
        process = subprocess.Popen(
            command, stdout=output, stderr=subprocess.STDOUT, env={**os.environ, **S3_CREDENTIALS}
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
                raise SystemExit(f"the S3 server did not start: see {log}") from error
            time.sleep(0.2)


@contextmanager
def s3_environment(server: S3Server) -> Iterator[None]:
    """The S3 credentials and the server's endpoint in os.environ (so this process's clients
    and every process it starts use the server), the earlier values restored after."""
    names = [*S3_CREDENTIALS, "AWS_ENDPOINT_URL"]
    saved = {name: os.environ.get(name) for name in names}
    os.environ.update({**S3_CREDENTIALS, "AWS_ENDPOINT_URL": server.endpoint})
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
