"""Progress lines for long per-image work: done, rate and ETA, at most every few seconds."""

from __future__ import annotations

import time
from typing import Protocol


class InfoLogger(Protocol):
    def info(self, msg: str) -> None: ...


class ProgressLog:
    """Feed it `update(done, total)`; it logs when `interval` seconds passed or work finished."""

    def __init__(self, log: InfoLogger, unit: str, total: int, interval: float = 5.0):
        self._log = log
        self._unit = unit
        self._total = total
        self._interval = interval
        self._started = time.monotonic()
        self._last = self._started

    def update(self, done: int, total: int | None = None) -> None:
        total = self._total if total is None else total
        now = time.monotonic()
        if done < total and now - self._last < self._interval:
            return
        self._last = now
        elapsed = max(now - self._started, 1e-9)
        rate = done / elapsed
        eta = (total - done) / rate if rate > 0 else float("inf")
        self._log.info(
            f"{done}/{total} {self._unit} ({rate:.1f}/s, ETA {eta:.0f} s)"
            if done < total
            else f"{done}/{total} {self._unit} in {elapsed:.1f} s ({rate:.1f}/s)"
        )
