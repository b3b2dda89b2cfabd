"""The functions the pool tests hand to worker processes.

A worker imports the module that defines its function: this one imports nothing heavier than
the standard library, so a worker starts in milliseconds instead of importing the test module
(pytest, Dagster) again for every pool."""

from __future__ import annotations

import os
import time
from pathlib import Path, PurePosixPath


class ImageBroken(ValueError):
    """A distinct type, so the test sees the original type and not a generic wrapper."""


# Worker functions are top level so the process pool can pickle them by name.
def square(number: int) -> int:
    return number * number


def tag_with_pid(number: int) -> tuple[int, int]:
    return number, os.getpid()


def fail_on_seven(number: int) -> int:
    if number == 7:
        raise ImageBroken(f"image {number} is broken")
    return number


def slow_first(number: int) -> tuple[int, int]:
    if number == 0:
        time.sleep(1.0)
    return number, os.getpid()


def sleep_for(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def short_sleep(number: int) -> int:
    time.sleep(0.001)
    return number


def stuck_at_150(number: int) -> int:
    if number == 150:
        time.sleep(3600)
    return short_sleep(number)


def path_facts(item: tuple[Path, PurePosixPath]) -> tuple[type, str, tuple[str, ...], type]:
    path, pure = item
    return type(path), str(path), pure.parts, type(pure)


def stuck_on_bytes(item: bytes) -> int:
    if item == b"stuck":
        time.sleep(3600)
    return len(item)


class DiesOnArrival:
    """A worker function whose process exits while unpickling it, before any item."""

    def __call__(self, number: int) -> int:
        return number

    def __getstate__(self) -> dict:
        return {"dies": True}  # a non-empty state, so unpickling calls __setstate__

    def __setstate__(self, state: dict) -> None:
        os._exit(3)
