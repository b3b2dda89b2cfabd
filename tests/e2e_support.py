"""Helpers for tests/test_e2e_ui.py: a `dagster dev` server in a subprocess, and GraphQL calls.

Every wait is bounded; every failure message ends with the tail of dagster dev's log.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

# A throwaway instance: sqlite in DAGSTER_HOME, no telemetry, one heavy step at a time.
INSTANCE_YAML = """\
storage:
  sqlite:
    base_dir:
      env: DAGSTER_HOME
telemetry:
  enabled: false
nux:
  enabled: false
concurrency:
  pools:
    default_limit: 1
"""

REPOSITORY_NAME = "__repository__"  # what a `dg.Definitions` object is called as a repository


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def write_instance(home: Path) -> Path:
    home.mkdir(parents=True, exist_ok=True)
    (home / "dagster.yaml").write_text(INSTANCE_YAML)
    return home


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class DagsterDev:
    """`dagster dev` (webserver + daemon) in its own process group, logging to a file."""

    def __init__(
        self,
        repo: Path,
        env: Mapping[str, str],
        log_path: Path,
        port: int,
        program: tuple[str, ...] = ("dagster", "dev"),
    ):
        """`program` may name another server of the same options (`dagster-webserver`)."""
        self.port = port
        self.log_path = log_path
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        executable = Path(sys.executable).with_name(program[0])
        command = [str(executable), *program[1:], "-w", str(repo / "workspace.yaml")]
        self.proc = subprocess.Popen(
            [*command, "-h", "127.0.0.1", "-p", str(port)],
            cwd=repo,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            # dagster dev stops on SIGINT/SIGTERM through Python's SIGINT handler, which is
            # not installed when SIGINT arrives ignored (as in a shell's background jobs).
            preexec_fn=_default_sigint,
        )

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_tail(self, chars: int = 4000) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError as error:
            return f"(no dagster dev log: {error})"
        return "\n--- dagster dev log (tail) ---\n" + text[-chars:]

    def check_alive(self) -> None:
        code = self.proc.poll()
        if code is not None:
            raise AssertionError(f"dagster dev exited with code {code}" + self.log_tail())

    def graphql(self, query: str, variables: Mapping[str, Any] | None = None, timeout=30.0):
        body = json.dumps({"query": query, "variables": dict(variables or {})}).encode()
        request = urllib.request.Request(
            self.base_url + "/graphql",
            data=body,
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=timeout) as response:
            payload = json.loads(response.read())
        if payload.get("errors"):
            raise AssertionError(f"GraphQL errors: {payload['errors']}" + self.log_tail())
        return payload["data"]

    def wait_until_loaded(self, location: str, timeout: float = 120.0) -> None:
        """Until /server_info answers and the code location's repository is listed."""
        deadline = time.monotonic() + timeout
        last = "nothing yet"
        query = """
            query { repositoriesOrError {
              __typename
              ... on RepositoryConnection { nodes { name location { name } } }
              ... on PythonError { message }
            } }
        """
        while time.monotonic() < deadline:
            self.check_alive()
            try:
                with urllib.request.urlopen(self.base_url + "/server_info", timeout=5) as resp:
                    resp.read()
                data = self.graphql(query, timeout=10)["repositoriesOrError"]
                names = {(node["location"]["name"], node["name"]) for node in data.get("nodes", [])}
                if (location, REPOSITORY_NAME) in names:
                    return
                last = f"repositories: {data}"
            except (urllib.error.URLError, OSError, ValueError) as error:
                last = repr(error)
            time.sleep(0.25)
        raise AssertionError(
            f"dagster dev not ready after {timeout:.0f}s ({last})" + self.log_tail()
        )

    def stop(self, grace: float = 30.0) -> None:
        """SIGTERM the whole process group, wait, then SIGKILL whatever is left."""
        try:
            if self.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGTERM)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.proc.wait(timeout=grace)
            # The group may outlive its leader (run workers, code server): kill the rest.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=10)
        finally:
            self._log.close()
