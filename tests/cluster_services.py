"""Real services for the cluster test, on loopback: PostgreSQL, an S3 server (moto, in memory,
or s3rver, on disk: tests/s3_server.js) and a Dask scheduler with worker processes. Each is a
separate process, stopped by its PID."""

from __future__ import annotations

import glob
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parents[1]
# The disk-backed S3 server: s3rver from the npm registry (package.json, installed into
# node_modules by `make s3-server`) behind our launcher, which closes its gaps (see the script).
S3_SERVER_SCRIPT = REPO / "tests" / "s3_server.js"
S3_SERVER_PACKAGE = REPO / "node_modules" / "s3rver" / "package.json"
S3_SERVER_INSTALL = "make s3-server"
# s3rver's ListObjectsV2 continuation tokens use DES, which Node's OpenSSL 3 only has there.
NODE_OPTIONS = ["--openssl-legacy-provider"]
PG_USER = "radharmony"
PG_PASSWORD = "radharmony-test"
PG_DATABASE = "dagster"
BUCKET = "radharmony-test"
# The marks of a test module that talks to S3: its tier, and a fresh s3fs client for the
# module and each test (s3fs keeps one client per set of options, and each module starts its
# own server; conftest.py has the fixtures).
S3_TESTS = [
    pytest.mark.cluster,
    pytest.mark.usefixtures("fresh_s3_clients_for_module", "fresh_s3_clients"),
]
INITDB_OPTIONS = ["-A", "scram-sha-256", "-E", "UTF8", "--no-sync"]
# A throw-away cluster: durability is not under test, and 4 concurrent runs need connections.
SERVER_OPTIONS = ["-c", "fsync=off", "-c", "max_connections=200"]
# One single-threaded worker process each: two workers = two cores, like the local pool here.
WORKER_OPTIONS = ["--nworkers", "1", "--nthreads", "1", "--host", "127.0.0.1", "--no-dashboard"]
# moto accepts any credentials; these only have to be present for botocore.
AWS_ENVIRONMENT = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_until(ready: Callable[[], bool], what: str, process: subprocess.Popen, timeout=120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with code {process.returncode} while starting")
        if ready():
            return
        time.sleep(0.3)
    raise TimeoutError(f"{what} not ready after {timeout} s")


def port_open(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def postgres_bin_dir() -> Path:
    """The server binaries of Debian's `postgresql` package, installed with apt if missing."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"))
    if not found:
        subprocess.run(["apt-get", "update", "-qq"], check=True)
        subprocess.run(
            ["apt-get", "install", "-y", "-qq", "postgresql"],
            check=True,
            env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
        )
        found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"))
    return Path(found[-1]).parent


@dataclass
class Services:
    """The started processes (by PID) and what a client needs to reach them."""

    processes: list[subprocess.Popen] = field(default_factory=list)
    scratch: list[Path] = field(default_factory=list)
    pg_port: int = 0
    pg_server: subprocess.Popen | None = None
    pg_command: list = field(default_factory=list)
    pg_options: dict = field(default_factory=dict)
    s3_endpoint: str = ""
    s3_server: subprocess.Popen | None = None
    s3_command: list = field(default_factory=list)
    scheduler: str = ""

    def environment(self) -> dict[str, str]:
        return {
            **AWS_ENVIRONMENT,
            "AWS_ENDPOINT_URL": self.s3_endpoint,
            "DAGSTER_PG_USERNAME": PG_USER,
            "DAGSTER_PG_PASSWORD": PG_PASSWORD,
            "DAGSTER_PG_HOST": "127.0.0.1",
            "DAGSTER_PG_PORT": str(self.pg_port),
            "DAGSTER_PG_DB": PG_DATABASE,
            "RADHARMONY_DASK_SCHEDULER": self.scheduler,
        }

    def start(self, command: list[str], log: Path, **options) -> subprocess.Popen:
        handle = open(log, "wb")  # noqa: SIM115 - closed with the process's lifetime
        process = subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT, **options)
        handle.close()
        self.processes.append(process)
        return process

    def stop(self) -> None:
        for process in reversed(self.processes):
            if process.poll() is None:
                # SIGINT: a fast, clean shutdown for postgres (and Dask, moto, s3rver).
                process.send_signal(signal.SIGINT)
        for process in reversed(self.processes):
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)
        for folder in self.scratch:
            shutil.rmtree(folder, ignore_errors=True)


def start_postgres(services: Services, logs: Path) -> None:
    """A throw-away cluster in a temp folder owned by `postgres` (the server refuses root),
    password authentication on 127.0.0.1 only, with the database Dagster uses."""
    bin_dir = postgres_bin_dir()
    # Not under pytest's tmp_path: its parents are private to root, and postgres must enter.
    folder = Path(tempfile.mkdtemp(prefix="radharmony-pg-"))
    services.scratch.append(folder)
    os.chmod(folder, 0o755)
    data = folder / "data"
    password_file = folder / "password"
    password_file.write_text(PG_PASSWORD)
    shutil.chown(folder, "postgres", "postgres")
    shutil.chown(password_file, "postgres", "postgres")
    as_postgres = {"user": "postgres", "group": "postgres", "extra_groups": [], "cwd": folder}
    subprocess.run(
        [bin_dir / "initdb", "-D", data, "-U", PG_USER, "--pwfile", password_file, *INITDB_OPTIONS],
        check=True,
        capture_output=True,
        **as_postgres,
    )
    services.pg_port = free_port()
    services.pg_command = [
        bin_dir / "postgres",
        *("-D", data, "-h", "127.0.0.1", "-p", str(services.pg_port), "-k", str(folder)),
        *SERVER_OPTIONS,
    ]
    services.pg_options = as_postgres
    services.pg_server = services.start(
        services.pg_command, logs / "postgres.log", **services.pg_options
    )
    wait_until(lambda: port_open(services.pg_port), "postgres", services.pg_server)
    create_database(services, PG_DATABASE)


def restart_postgres(services: Services, logs: Path, down_seconds: float) -> None:
    """Stop the server (fast shutdown: every connection is closed), keep it down for
    `down_seconds`, and start it again on the same port and data."""
    server = services.pg_server
    server.send_signal(signal.SIGINT)
    server.wait(timeout=30)
    time.sleep(down_seconds)
    services.pg_server = services.start(
        services.pg_command, logs / "postgres-restarted.log", **services.pg_options
    )
    wait_until(lambda: port_open(services.pg_port), "postgres", services.pg_server)
    _connect_with_retry(services.pg_port, PG_DATABASE).close()


def create_database(services: Services, name: str) -> None:
    connection = _connect_with_retry(services.pg_port, "postgres")
    connection.autocommit = True
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE DATABASE {name}")
    connection.close()


def _connect_with_retry(port: int, database: str):
    import psycopg2

    deadline = time.monotonic() + 60
    while True:
        try:
            return psycopg2.connect(
                host="127.0.0.1", port=port, user=PG_USER, password=PG_PASSWORD, dbname=database
            )
        except psycopg2.OperationalError:
            # "the database system is starting up" between the port opening and readiness
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)


def pg_connect(services: Services, database: str = PG_DATABASE):
    return _connect_with_retry(services.pg_port, database)


def start_moto(services: Services, logs: Path) -> None:
    port = free_port()
    server = services.start(
        [BIN / "moto_server", "-H", "127.0.0.1", "-p", str(port)], logs / "moto.log"
    )
    services.s3_endpoint = f"http://127.0.0.1:{port}"
    wait_until(lambda: port_open(port), "moto_server", server)
    s3(services).mkdir(BUCKET)


def s3_server_command(
    directory: Path, port: int, buckets: tuple[str, ...] = (), request_log: Path | None = None
) -> list[str]:
    """The command that serves `directory` as S3 on 127.0.0.1:`port` (tests/s3_server.js);
    a clear error naming the install step when node or the installed s3rver is missing."""
    node = shutil.which("node")
    if node is None or not S3_SERVER_PACKAGE.exists():
        missing = "node (Debian's nodejs)" if node is None else f"{S3_SERVER_PACKAGE.parent}"
        raise RuntimeError(
            f"the disk-backed S3 server needs {missing}: run `{S3_SERVER_INSTALL}` in {REPO} "
            "(installs s3rver from the npm registry as package.json pins it)"
        )
    command = [node, *NODE_OPTIONS, str(S3_SERVER_SCRIPT), "--directory", str(directory)]
    command += ["--address", "127.0.0.1", "--port", str(port)]
    for bucket in buckets:
        command += ["--bucket", bucket]
    return command + (["--request-log", str(request_log)] if request_log else [])


def start_s3_server(
    services: Services, logs: Path, directory: Path | None = None, request_log: bool = False
) -> subprocess.Popen:
    """s3rver on disk at `directory` (by default a temp folder removed at stop) with the
    test bucket; its requests are counted (s3_requests), and logged one a line to
    logs/s3-requests.log when `request_log`."""
    if directory is None:
        directory = Path(tempfile.mkdtemp(prefix="radharmony-s3-"))
        services.scratch.append(directory)
    port = free_port()
    command = s3_server_command(
        directory, port, (BUCKET,), logs / "s3-requests.log" if request_log else None
    )
    services.s3_command = command
    services.s3_server = services.start(
        command, logs / "s3-server.log", env={**os.environ, **AWS_ENVIRONMENT}
    )
    services.s3_endpoint = f"http://127.0.0.1:{port}"
    wait_until(lambda: port_open(port), "s3_server.js", services.s3_server)
    return services.s3_server


def restart_s3_server(services: Services, logs: Path, down_seconds: float) -> None:
    """Kill the disk-backed server (-9: requests in flight are cut, an upload half received),
    keep it down for `down_seconds`, and start it again on the same port and folder."""
    server = services.s3_server
    server.kill()
    server.wait(timeout=30)
    time.sleep(down_seconds)
    services.s3_server = services.start(
        services.s3_command, logs / "s3-server-restarted.log", env={**os.environ, **AWS_ENVIRONMENT}
    )
    port = int(services.s3_endpoint.rsplit(":", 1)[1])
    wait_until(lambda: port_open(port), "s3_server.js", services.s3_server)


def bucket_files(services: Services, prefix: str) -> dict[str, bytes]:
    """Every object under `prefix` of the test bucket, by its key relative to the prefix."""
    fs = s3(services)
    base = f"{BUCKET}/{prefix}"
    return {key[len(base) + 1 :]: fs.cat_file(key) for key in fs.find(base)}


def s3_requests(services: Services) -> dict:
    """What the disk-backed server served so far: requests by kind (GET, GET_RANGE, HEAD, PUT,
    LIST, COPY, DELETE, PART, MULTIPART_START, ...), by status class, bytes in and out."""
    with urllib.request.urlopen(f"{services.s3_endpoint}/-/stats", timeout=30) as answer:
        return json.loads(answer.read())


def s3(services: Services):
    """An s3fs client on the test's endpoint (a fresh instance; listings are not cached)."""
    import s3fs

    return s3fs.S3FileSystem(
        key=AWS_ENVIRONMENT["AWS_ACCESS_KEY_ID"],
        secret=AWS_ENVIRONMENT["AWS_SECRET_ACCESS_KEY"],
        client_kwargs={"endpoint_url": services.s3_endpoint},
        skip_instance_cache=True,
    )


def start_dask(
    services: Services, logs: Path, workers: int = 2, extra_environment: dict | None = None
) -> None:
    """`dask scheduler` and `workers` single-threaded `dask worker` processes (their nanny
    PIDs follow the scheduler's in `services.processes`)."""
    port = free_port()
    services.scheduler = f"tcp://127.0.0.1:{port}"
    scheduler = services.start(
        [BIN / "dask", "scheduler", "--host", "127.0.0.1", "--port", str(port), "--no-dashboard"],
        logs / "dask-scheduler.log",
    )
    wait_until(lambda: port_open(port), "dask scheduler", scheduler)
    # `dask worker` as it ships (daemonic worker processes): nothing set for the pipeline.
    environment = {**os.environ, **services.environment(), **(extra_environment or {})}
    for number in range(workers):
        services.start(
            [BIN / "dask", "worker", services.scheduler, *WORKER_OPTIONS, "--name", f"w{number}"],
            logs / f"dask-worker-{number}.log",
            env=environment,
        )
    from distributed import Client

    with Client(services.scheduler, timeout=60) as client:
        client.wait_for_workers(workers, timeout=120)
