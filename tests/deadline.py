"""A hang guard for one block of a test: the block is stopped when its time is up.

pytest-timeout bounds a whole test; some tests bound one part of it more tightly (an outage
must fail within the retry budget, an unreachable store must fail fast). An elapsed-time
assertion after the block would wait for a hang to end before reporting it; this interrupts
the block instead. It shares SIGALRM with pytest-timeout's signal method, so the enclosing
test's timer is put back, less the time the block took, when the block ends.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest


@contextmanager
def within(seconds: float, what: str) -> Iterator[None]:
    """Fail the test if the block has not ended after `seconds`."""
    previous_handler = signal.getsignal(signal.SIGALRM)
    outer_remaining, _ = signal.getitimer(signal.ITIMER_REAL)
    if outer_remaining and outer_remaining <= seconds:
        yield  # the test's own timeout comes first
        return

    def expired(signum, frame):
        pytest.fail(f"{what} did not end within {seconds} s", pytrace=False)

    started = time.monotonic()
    signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous_handler)
        if outer_remaining:
            left = outer_remaining - (time.monotonic() - started)
            signal.setitimer(signal.ITIMER_REAL, max(left, 0.001))
