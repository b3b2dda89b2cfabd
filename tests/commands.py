"""A command of the project run to completion in a subprocess, as a user runs it."""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path


def run_ok(
    command: Sequence[str],
    *,
    timeout: float,
    cwd: Path | str | None = None,
    env: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess:
    """Run `command` (output captured as text) within `timeout` seconds; fail the test with the
    tails of its output unless it exits 0."""
    completed = subprocess.run(
        list(command), cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    return completed
