"""The UI pages a user opens, timed to network idle in Chromium (bench_corpus.py)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from common import REPOSITORY as REPO

BIN = Path(sys.executable).parent
# The UI pages a user opens at full size, timed to network idle (item 8 of issue 30).
UI_PAGES = (
    "/assets/images?view=partitions",
    "/assets/images?partition=rexgradient.train",
    "/assets/unified_manifest",
    "/assets/unified_manifest?view=checks",
)


# One load of a page varies by tens of percent on this host: each is loaded this many times,
# the pages in turn, and its median kept.
UI_LOADS = 5


CHROMIUM = "/usr/bin/chromium"


def ui_pages(env: dict, log: Path) -> dict[str, dict[str, float]]:
    """Each UI page's median and range of seconds to network idle over UI_LOADS loads,
    printed; none where they cannot be timed."""
    if not Path(CHROMIUM).exists():
        print(f"  UI pages not timed: no {CHROMIUM} (apt-get install chromium)")
        return {}
    try:
        loads = time_ui_pages(env, log)
    except Exception as error:  # the re-runs after it are still worth measuring
        print(f"  UI pages not timed: {error!r} (see {log})", flush=True)
        return {}
    pages = {
        path: {
            "median": statistics.median(seconds),
            "min": min(seconds),
            "max": max(seconds),
            "loads": len(seconds),
        }
        for path, seconds in loads.items()
    }
    for path, times in pages.items():
        print(f"  {_ui_line(path, times)}", flush=True)
    return pages


def time_ui_pages(env: dict, log: Path) -> dict[str, list[float]]:
    """Seconds from navigation to network idle for each of UI_PAGES, loaded UI_LOADS times in
    turn, on a webserver of the rehearsal's instance (loopback, stopped by its process group
    in `finally`)."""
    from playwright.sync_api import sync_playwright

    port = _free_port()
    with log.open("ab") as sink:
        server = subprocess.Popen(
            [
                str(BIN / "dagster-webserver"),
                "-w",
                str(REPO / "workspace.yaml"),
                "-h",
                "127.0.0.1",
                "-p",
                str(port),
            ],
            cwd=REPO,
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        base = f"http://127.0.0.1:{port}"
        _wait_for(base + "/server_info", timeout=180)
        timings: dict[str, list[float]] = {path: [] for path in UI_PAGES}
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True)
            page = browser.new_page(viewport={"width": 1600, "height": 1000})
            page.goto(base + "/assets", wait_until="networkidle", timeout=120_000)  # warm-up
            for _ in range(UI_LOADS):
                for path in UI_PAGES:
                    start = time.perf_counter()
                    page.goto(base + path, wait_until="networkidle", timeout=120_000)
                    timings[path].append(time.perf_counter() - start)
            browser.close()
        return timings
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _wait_for(url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def _ui_line(page: str, times: dict) -> str:
    return (
        f"UI {page:<46} network idle after {times['median']:5.2f} s "
        f"(median of {times['loads']}; {times['min']:.2f}–{times['max']:.2f} s)"
    )
