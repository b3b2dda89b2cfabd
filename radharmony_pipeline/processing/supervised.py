"""A process pool that bounds the time of every item: a stuck item becomes a result, not a hang.

ProcessPoolExecutor cannot stop one task: a worker spinning inside C code (pycocotools on
malformed RLE text, a decoder on a hostile file) holds its chunk and the step forever. Here
each chunk runs in its own process that reports every finished item; the parent kills a
process whose current item exceeds the limit (or that died), records `on_timeout(item,
reason)` for that item, and hands the rest of the chunk to a fresh process.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import time
import traceback
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any, Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")

TIMEOUT_VARIABLE = "RADHARMONY_JOB_TIMEOUT"
DEFAULT_TIMEOUT_SECONDS = 300.0
# A worker must import and report ready within this, whatever the per-item limit.
_START_SECONDS = 120.0


class WorkerError(RuntimeError):
    """A worker raised an exception that could not be sent back as itself."""


@dataclass(frozen=True)
class TimeLimit(Generic[T, R]):
    """At most `seconds` per item; `on_timeout(item, reason)` is the result of an item that
    exceeded it or whose process died."""

    seconds: float
    on_timeout: Callable[[T, str], R]


def job_timeout(environ: Any = os.environ) -> float:
    """RADHARMONY_JOB_TIMEOUT (seconds per image, a positive number), else the default."""
    raw = environ.get(TIMEOUT_VARIABLE)
    if raw is None or not raw.strip():
        return DEFAULT_TIMEOUT_SECONDS
    try:
        seconds = float(raw)
    except ValueError:
        seconds = 0.0
    if not seconds > 0 or seconds == float("inf"):
        raise ValueError(
            f"{TIMEOUT_VARIABLE} must be a positive number of seconds per image, got {raw!r}"
        )
    return seconds


def _run_chunk(function: Callable[[T], R], items: Sequence[T], connection: Connection) -> None:
    """In the worker: report ready, then each item's result (or the first exception)."""
    connection.send(("ready", None))
    for item in items:
        try:
            result = function(item)
        except BaseException as error:
            try:
                connection.send(("raise", pickle.dumps(error)))
            except Exception:
                text = "".join(traceback.format_exception(error))
                connection.send(("raise", pickle.dumps(WorkerError(text))))
            return
        connection.send(("item", result))
    connection.close()


@dataclass
class _Task(Generic[T]):
    chunk: int
    items: list[T]


@dataclass
class _Worker(Generic[T]):
    task: _Task[T]
    process: Any
    connection: Connection
    deadline: float
    finished: int = 0
    started: bool = False

    @property
    def current(self) -> T:
        return self.task.items[self.finished]


@dataclass
class _Collector(Generic[R]):
    chunk_sizes: list[int]
    on_progress: Callable[[int, int], None] | None
    by_chunk: dict[int, list[R]] = field(default_factory=dict)
    done: int = 0

    def add(self, chunk: int, result: R) -> None:
        self.by_chunk.setdefault(chunk, []).append(result)
        self.done += 1
        if self.on_progress is not None and len(self.by_chunk[chunk]) == self.chunk_sizes[chunk]:
            self.on_progress(self.done, sum(self.chunk_sizes))

    def in_order(self) -> list[R]:
        return [r for index in range(len(self.chunk_sizes)) for r in self.by_chunk.get(index, [])]


def run_supervised(
    function: Callable[[T], R],
    chunks: list[list[T]],
    workers: int,
    limit: TimeLimit[T, R],
    context: multiprocessing.context.BaseContext,
    on_progress: Callable[[int, int], None] | None = None,
) -> list[R]:
    """[function(item) for every item of every chunk], in order, with `workers` processes."""
    pending = deque(_Task(index, chunk) for index, chunk in enumerate(chunks) if chunk)
    collector: _Collector[R] = _Collector([len(chunk) for chunk in chunks], on_progress)
    active: list[_Worker[T]] = []
    try:
        while pending or active:
            while pending and len(active) < workers:
                active.append(_start(function, pending.popleft(), context))
            timeout = max(0.0, min(w.deadline for w in active) - time.monotonic())
            wait([w.connection for w in active] + [w.process.sentinel for w in active], timeout)
            for worker in list(active):
                outcome = _drain(worker, collector, limit.seconds)
                if outcome == "running" and time.monotonic() < worker.deadline:
                    continue
                active.remove(worker)
                _stop(worker)
                if outcome == "running":
                    reason = f"took longer than {limit.seconds:g} s ({TIMEOUT_VARIABLE}); stopped"
                    _give_up_on_current(worker, collector, limit, pending, reason)
                elif outcome == "died":
                    code = worker.process.exitcode
                    reason = f"worker process died (exit code {code}) while processing it"
                    _give_up_on_current(worker, collector, limit, pending, reason)
    finally:
        for worker in active:
            _stop(worker)
    return collector.in_order()


def _start(function: Callable, task: _Task, context: multiprocessing.context.BaseContext):
    receiver, sender = context.Pipe(duplex=False)
    process = context.Process(target=_run_chunk, args=(function, task.items, sender), daemon=True)
    process.start()
    sender.close()
    return _Worker(task, process, receiver, time.monotonic() + _START_SECONDS)


def _drain(worker: _Worker, collector: _Collector, seconds: float) -> str:
    """Read every message the worker sent: 'running', 'finished' or 'died'."""
    # Checked before reading: once the process is gone, everything it sent is in the pipe.
    alive = worker.process.is_alive()
    while True:
        try:
            if not worker.connection.poll():
                break
            kind, payload = worker.connection.recv()
        except (EOFError, OSError):
            break
        if kind == "raise":
            raise pickle.loads(payload)
        if kind == "item":
            collector.add(worker.task.chunk, payload)
            worker.finished += 1
        worker.started = True
        worker.deadline = time.monotonic() + seconds
    if worker.finished == len(worker.task.items):
        return "finished"
    if not alive:
        return "died"
    return "running"


def _give_up_on_current(worker, collector, limit, pending, reason: str) -> None:
    """The current item gets its timeout result; the rest of the chunk runs again."""
    collector.add(worker.task.chunk, limit.on_timeout(worker.current, reason))
    rest = worker.task.items[worker.finished + 1 :]
    if rest:
        pending.appendleft(_Task(worker.task.chunk, rest))


def _stop(worker: _Worker) -> None:
    if worker.process.is_alive():
        worker.process.kill()
    worker.process.join()
    worker.connection.close()
