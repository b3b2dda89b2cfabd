"""A process pool that bounds the time of every item: a stuck item becomes a result, not a hang.

ProcessPoolExecutor cannot stop one task: a worker spinning inside C code (pycocotools on
malformed RLE text, a decoder on a hostile file) holds its chunk and the step forever. Here
every worker is a long-lived process fed items over its own pipe, with the next ones already
queued (so it never waits for the parent between items), and it reports every result. The
parent collects results at most every COLLECT_SECONDS, and queues enough items to cover that
interval at each worker's own pace. It kills a worker whose current item exceeds the limit
(or that died), records `on_timeout(item, reason)` for that item, puts the items queued
behind it back in line and starts a fresh worker. Handing out as many items as each worker
wants at the time, not fixed chunks, also keeps every worker busy until the last item (no
chunk left running on one worker at the end).

Workers are multiprocessing children, or, in a daemonic process (a stock Dask worker), which
multiprocessing forbids to have children, plain subprocesses of the same interpreter
(ChildProcessContext) serving the same protocol.
"""

from __future__ import annotations

import itertools
import math
import multiprocessing
import os
import pickle
import select
import subprocess
import sys
import time
import traceback
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, Pipe, wait
from multiprocessing.reduction import ForkingPickler
from pathlib import PosixPath, PurePath, PurePosixPath
from typing import Any, Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")

# A worker must import and report ready within this, whatever the per-item limit.
_START_SECONDS = 120.0
# An idle worker told to stop exits at once; after this it is killed.
_EXIT_SECONDS = 5.0


class WorkerError(RuntimeError):
    """A worker raised an exception that could not be sent back as itself."""


class WorkerStartError(RuntimeError):
    """Worker processes keep exiting before they report ready: no item can run."""


# Workers that exit one after another before reporting ready (an import that fails in the
# child, a script whose top level runs work when the child imports it) stop the map after
# this many, instead of each using up an item of a partition of 239,000.
_START_FAILURES = 8


@dataclass(frozen=True)
class TimeLimit(Generic[T, R]):
    """At most `seconds` per item; `on_timeout(item, reason)` is the result of an item that
    exceeded it or whose process died. `set_by` names where the limit is set, for the reason
    (`took longer than 5 s (set_by); stopped`), so the row tells the user what to change."""

    seconds: float
    on_timeout: Callable[[T, str], R]
    set_by: str | None = None

    def exceeded(self) -> str:
        """The reason recorded for an item that ran past the limit."""
        where = f" ({self.set_by})" if self.set_by else ""
        return f"took longer than {self.seconds:g} s{where}; stopped"


# The parent wakes to collect results at most this often: a wake-up per result costs the
# parent about as much CPU as a small image's resize (benchmarks/README.md), and a worker
# loses nothing by the wait as long as it holds enough items to cover the interval.
COLLECT_SECONDS = 0.02
# Items a worker holds at once: the one it works on and at least the next, so it starts the
# next as soon as it sends a result instead of waiting for the parent to answer; more for
# quick items, so that it is still busy when the parent next looks. Items of a tenth of a
# millisecond (an image a killed build had already written) need hundreds per interval: at
# 16 the workers waited most of the time. The pipe's share (_QUEUE_BYTES) bounds it first.
MIN_ITEMS_IN_HAND = 2
MAX_ITEMS_IN_HAND = 1024
# Queued items may fill at most half a pipe (64 KiB on Linux); a bigger one waits
# until its worker is idle (reading), so the parent never blocks writing into the pipe of a
# worker that is stuck on its current item.
_QUEUE_BYTES = 32 << 10


def _path_as_text(path: PurePath) -> tuple[type, tuple[str]]:
    return type(path), (os.fspath(path),)


class _ItemPickler(ForkingPickler):
    """Items as ForkingPickler sends them, local paths as their text: a Path pickles as its
    parts, which the worker joins and parses again, most of an image job's unpickling."""

    _extra_reducers = {
        **ForkingPickler._extra_reducers,
        PosixPath: _path_as_text,
        PurePosixPath: _path_as_text,
    }


def _serve(function: Callable[[T], R], connection: Connection) -> None:
    """In the worker: report ready, then answer each (index, item) of every batch received
    with its own result, until told to stop (None) or the parent is gone; the first
    exception is sent and ends it."""
    connection.send(("ready", None, None))
    while True:
        try:
            message = connection.recv()
        except EOFError:
            return
        if message is None:
            return
        for index, item in message:
            try:
                result = function(item)
            except BaseException as error:
                try:
                    connection.send(("raise", index, pickle.dumps(error)))
                except Exception:
                    text = "".join(traceback.format_exception(error))
                    connection.send(("raise", index, pickle.dumps(WorkerError(text))))
                return
            connection.send(("item", index, result))


@dataclass
class _Worker:
    process: Any
    connection: Connection
    deadline: float
    # Asked whether a result is waiting: one poll(2) call, where Connection.poll() builds,
    # fills and closes a selector each time (the parent asks once per result).
    readable: select.poll = field(init=False)
    in_hand: deque[int] = field(default_factory=deque)  # item indices, oldest = current
    message_bytes: deque[int] = field(default_factory=deque)  # their pickled sizes
    started: bool = False
    # Its pace in the current map(): items finished since its first result arrived there
    # (start-up and idle time between maps not counted).
    finished: int = 0
    first_result_at: float = 0.0  # meaningful once `finished` is at least 1

    def __post_init__(self) -> None:
        self.readable = select.poll()
        self.readable.register(self.connection.fileno(), select.POLLIN)

    def has_message(self) -> bool:
        """Whether something (a result, or the end of the pipe) is waiting to be read."""
        return bool(self.readable.poll(0))

    def items_wanted(self) -> int:
        """Enough items to stay busy until the parent next collects, at this worker's own
        pace (a worker that has not yet shown its pace, or is slow, holds the minimum)."""
        if not self.knows_its_pace():
            return MIN_ITEMS_IN_HAND
        per_item = max((time.monotonic() - self.first_result_at) / (self.finished - 1), 1e-4)
        cover = 1 + math.ceil(3 * COLLECT_SECONDS / per_item)
        return max(MIN_ITEMS_IN_HAND, min(MAX_ITEMS_IN_HAND, cover))

    def knows_its_pace(self) -> bool:
        """Whether two results have come in: until then the parent does not pause, as the
        worker holds only the minimum."""
        return self.finished >= 2

    def forget_pace(self) -> None:
        self.finished, self.first_result_at = 0, 0.0

    def queued_bytes(self) -> int:
        """Bytes of items waiting in its pipe behind the current one."""
        return sum(self.message_bytes) - (self.message_bytes[0] if self.message_bytes else 0)


class SupervisedPool(Generic[T, R]):
    """Up to `workers` processes running `function`, each item bounded by `limit`.

    Healthy workers stay alive between map() calls, so a caller that maps many small batches
    (a Dask worker running chunk after chunk) starts its processes once. A failed map()
    stops them all; close() (or leaving the `with` block) stops the rest.
    """

    def __init__(
        self,
        function: Callable[[T], R],
        workers: int,
        limit: TimeLimit[T, R],
        context: multiprocessing.context.BaseContext,
    ) -> None:
        self.function = function
        self.workers = workers
        self.limit = limit
        self.context = context
        self._active: list[_Worker] = []

    def __enter__(self) -> SupervisedPool[T, R]:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        for worker in self._active:
            _stop(worker)
        self._active = []

    def map(self, items: Sequence[T], on_done: Callable[[int], None] | None = None) -> list[R]:
        """[function(item) for item in items], in order; on_done(finished_items) is called
        here as items finish."""
        try:
            return self._map(items, on_done)
        except BaseException:
            self.close()
            raise

    def _map(self, items: Sequence[T], on_done: Callable[[int], None] | None) -> list[R]:
        results: list[Any] = [None] * len(items)
        waiting = deque(range(len(items)))
        finished = 0
        active, limit = self._active, self.limit

        def record(index: int, result: Any) -> None:
            nonlocal finished
            results[index] = result
            finished += 1
            if on_done is not None:
                on_done(finished)

        for worker in [w for w in active if not w.process.is_alive()]:
            active.remove(worker)  # died while idle since the last map()
            _stop(worker)
        for worker in active:
            worker.forget_pace()  # its idle time since the last map() is no part of it
        last_wake = -math.inf
        failed_starts = 0  # workers in a row that exited before reporting ready
        while finished < len(items):
            while len(active) < min(self.workers, len(waiting)):
                active.append(_start(self.function, self.context))
            for worker in active:
                _hand_out(worker, items, waiting, limit.seconds)
            earliest = min(w.deadline for w in active)
            if all(w.knows_its_pace() for w in active):
                # Results that arrive meanwhile are collected together at the next wake-up;
                # a deadline is checked late by at most the pause, never early.
                pause = min(last_wake + COLLECT_SECONDS, earliest) - time.monotonic()
                if pause > 0:
                    time.sleep(pause)
            timeout = max(0.0, earliest - time.monotonic())
            ready = set(
                wait([w.connection for w in active] + [w.process.sentinel for w in active], timeout)
            )
            now = last_wake = time.monotonic()
            for worker in list(active):
                exited = worker.process.sentinel in ready
                if worker.connection not in ready and not exited and now < worker.deadline:
                    continue  # nothing to read, within its time
                outcome = _drain(worker, record, limit.seconds, exited)
                failed_starts = 0 if worker.started else failed_starts + (outcome == "dead")
                if outcome == "running":
                    continue
                active.remove(worker)
                _stop(worker)
                if outcome == "late":
                    reason = limit.exceeded()
                else:
                    code = worker.process.exitcode
                    if failed_starts >= _START_FAILURES:
                        raise WorkerStartError(_start_failure(failed_starts, code))
                    reason = f"worker process died (exit code {code}) while processing it"
                if worker.in_hand:
                    current = worker.in_hand.popleft()
                    record(current, limit.on_timeout(items[current], reason))
                    waiting.extendleft(reversed(worker.in_hand))
        return results


def run_supervised(
    function: Callable[[T], R],
    items: Sequence[T],
    workers: int,
    limit: TimeLimit[T, R],
    context: multiprocessing.context.BaseContext,
    on_done: Callable[[int], None] | None = None,
) -> list[R]:
    """[function(item) for item in items], in order, with up to `workers` processes started
    for this call and stopped after it; on_done(finished_items) is called as items finish."""
    with SupervisedPool(function, workers, limit, context) as pool:
        return pool.map(items, on_done)


def _start(function: Callable, context: multiprocessing.context.BaseContext) -> _Worker:
    mine, theirs = context.Pipe(duplex=True)
    process = context.Process(target=_serve, args=(function, theirs), daemon=True)
    process.start()
    theirs.close()
    return _Worker(process, mine, time.monotonic() + _START_SECONDS)


def _start_failure(count: int, code: int | None) -> str:
    return (
        f"{count} worker processes in a row exited before reporting ready (last exit code "
        f"{code}), so nothing can run in them. A worker imports the calling program's main "
        "module: a script that starts this work at its top level must do so under "
        "`if __name__ == '__main__':`; otherwise the environment is broken (importing "
        "radharmony_pipeline in a new `python` of the same environment shows what fails)"
    )


def _hand_out(worker: _Worker, items: Sequence, waiting: deque[int], seconds: float) -> None:
    """Give the worker the items it wants (see _Worker.items_wanted) in one message, within
    the pipe's share for queued items (a large item only when the worker is idle).

    One message for several items is pickled once: the objects they share (a job's output
    root and dataset folder, its field names) are written and rebuilt once, and the pipe is
    written and read once. Results still come back one per item, so the limit and a dead
    worker are charged to the item it was working on."""
    count = min(worker.items_wanted() - len(worker.in_hand), len(waiting))
    while count > 0:
        batch = list(itertools.islice(waiting, count))
        message = _ItemPickler.dumps([(index, items[index]) for index in batch])
        if not worker.in_hand or worker.queued_bytes() + len(message) <= _QUEUE_BYTES:
            break
        count //= 2  # fewer items fit the pipe's share; none when even one does not
    if count <= 0:
        return
    for _ in batch:
        waiting.popleft()
    if not worker.in_hand and worker.started:
        worker.deadline = time.monotonic() + seconds
    worker.in_hand.extend(batch)
    # Each item's share of the message: what leaves the pipe once its batch is read.
    share, extra = divmod(len(message), len(batch))
    worker.message_bytes.extend([share] * (len(batch) - 1) + [share + extra])
    try:
        worker.connection.send_bytes(message)
    except OSError:
        # The worker died (before the pipe's other end was read): the wait sees its end
        # and records that against its first item, so a worker that cannot start at all
        # uses up items instead of being restarted for ever.
        return


def _drain(
    worker: _Worker, record: Callable[[int, Any], None], seconds: float, exited: bool
) -> str:
    """Read every message the worker sent: 'running', 'late' (current item over the limit,
    or not started in time) or 'dead'. `exited`: its process had ended before this call, so
    everything it sent is in the pipe."""
    while True:
        try:
            if not worker.has_message():
                break
            kind, index, payload = worker.connection.recv()
        except (EOFError, OSError):
            break
        if kind == "raise":
            raise pickle.loads(payload)
        if kind == "item":
            worker.in_hand.popleft()
            worker.message_bytes.popleft()
            worker.finished += 1
            if worker.finished == 1:
                worker.first_result_at = time.monotonic()
            record(index, payload)
        worker.started = True
        # The next item in hand starts now; an idle worker has no deadline.
        worker.deadline = time.monotonic() + seconds if worker.in_hand else float("inf")
    if exited:
        return "dead"
    if time.monotonic() >= worker.deadline:
        return "late"
    return "running"


def _stop(worker: _Worker) -> None:
    """An idle worker is told to exit; a busy, stuck or starting one is killed."""
    if worker.process.is_alive() and worker.started and not worker.in_hand:
        try:
            worker.connection.send(None)
            worker.process.join(timeout=_EXIT_SECONDS)
        except OSError:
            pass
    if worker.process.is_alive():
        worker.process.kill()
    worker.process.join()
    worker.connection.close()


class ChildProcess:
    """A worker started as `python -c ...` rather than by multiprocessing, with the part of
    multiprocessing.Process that SupervisedPool uses. A daemonic process may start it."""

    def __init__(self, target: Callable, args: tuple, daemon: bool = True) -> None:
        if target is not _serve:
            raise ValueError("a ChildProcess only runs a supervised worker")
        self.function, self.connection = args
        self._popen: subprocess.Popen | None = None
        self.sentinel: int | None = None

    def start(self) -> None:
        descriptor = self.connection.fileno()
        # The child imports what this process can: its module search path, as spawn passes
        # it (on the command line, so the child's environment is simply inherited).
        paths = [p for p in sys.path if p]
        self._popen = subprocess.Popen(
            [sys.executable, "-c", _CHILD_ENTRY.format(paths=paths, descriptor=descriptor)],
            stdin=subprocess.PIPE,
            pass_fds=(descriptor,),
        )
        # Readable once the child has ended, like a multiprocessing sentinel.
        self.sentinel = os.pidfd_open(self._popen.pid)
        try:
            self._popen.stdin.write(pickle.dumps(self.function))
            self._popen.stdin.close()
        except OSError:
            pass  # it died at once: its end shows in the wait, and the item is recorded

    def is_alive(self) -> bool:
        return self._popen is not None and self._popen.poll() is None

    @property
    def exitcode(self) -> int | None:
        return None if self._popen is None else self._popen.poll()

    def kill(self) -> None:
        if self.is_alive():
            self._popen.kill()

    def join(self, timeout: float | None = None) -> None:
        if self._popen is None:
            return
        try:
            self._popen.wait(timeout)
        except subprocess.TimeoutExpired:
            return
        if self.sentinel is not None:
            os.close(self.sentinel)
            self.sentinel = None


_CHILD_ENTRY = (
    "import sys; sys.path[:0] = {paths!r}; "
    "from radharmony_pipeline.processing.execution.supervised import serve_child; "
    "serve_child({descriptor})"
)


def serve_child(descriptor: int) -> None:
    """The body of a ChildProcess: the function from stdin, then _serve on the inherited
    connection."""
    function = pickle.loads(sys.stdin.buffer.read())
    _serve(function, Connection(descriptor))


class ChildProcessContext:
    """A stand-in for a multiprocessing context whose workers are ChildProcess subprocesses."""

    @staticmethod
    def Pipe(duplex: bool = True) -> tuple[Connection, Connection]:
        return Pipe(duplex)

    Process = ChildProcess
