"""Where per-image chunks run: the local process pool (default) or a Dask cluster.

Setting RADHARMONY_DASK_SCHEDULER to a scheduler address (`tcp://host:8786`) sends the
chunks of the `masks` and `images` steps to that `distributed` cluster; its workers need the
project installed (`pip install -e '.[scale]'`) and read/write the same output root. With a
time limit, each Dask worker thread runs its chunks' items in a supervised child process of
its own (kept between chunks), so a stuck image becomes an error row there too, with the
workers as `dask worker` starts them (daemonic by default, see worker_context).
"""

from __future__ import annotations

import functools
import multiprocessing
import os
import pickle
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

from .parallel import (
    Progress,
    default_chunk_size,
    map_in_chunks,
    process_context,
    split_into_chunks,
    worker_count,
)
from .supervised import ChildProcessContext, SupervisedPool, TimeLimit

T = TypeVar("T")
R = TypeVar("R")

SCHEDULER_VARIABLE = "RADHARMONY_DASK_SCHEDULER"
CONNECT_TIMEOUT_SECONDS = 30


def dask_scheduler(environ: Mapping[str, str] = os.environ) -> str | None:
    """The scheduler address from RADHARMONY_DASK_SCHEDULER, or None for the local pool."""
    address = (environ.get(SCHEDULER_VARIABLE) or "").strip()
    return address or None


def worker_slots(environ: Mapping[str, str] = os.environ) -> int:
    """How many chunks can run at once: the cluster's worker threads, else local workers."""
    address = dask_scheduler(environ)
    if address is None:
        return worker_count(environ)
    with _client(address) as client:
        return _thread_count(client, address)


def map_per_image(
    function: Callable[[T], R],
    items: Sequence[T],
    workers: int,
    on_progress: Progress | None = None,
    chunk_size: int | None = None,
    time_limit: TimeLimit[T, R] | None = None,
) -> list[R]:
    """[function(item) for item in items] on the Dask cluster if one is configured, else on
    the local process pool (see parallel.map_in_chunks); results in input order.

    `time_limit` bounds every item in either place (supervised.py; see apply_to_chunk).
    """
    address = dask_scheduler()
    if address is None:
        return map_in_chunks(function, items, workers, chunk_size, on_progress, time_limit)
    return map_on_dask(function, items, address, chunk_size, on_progress, time_limit)


def map_on_dask(
    function: Callable[[T], R],
    items: Sequence[T],
    address: str,
    chunk_size: int | None = None,
    on_progress: Progress | None = None,
    time_limit: TimeLimit[T, R] | None = None,
) -> list[R]:
    """Chunks of `items` as Dask tasks on the scheduler at `address`; the first failure is
    raised here (remaining tasks cancelled). on_progress(done_items, total) as chunks finish;
    `time_limit` bounds each item on the worker (apply_to_chunk)."""
    from distributed import as_completed  # the scale extra; imported only when configured
    from distributed.client import FutureCancelledError

    if not items:
        return []
    with _client(address) as client:
        slots = _thread_count(client, address)
        chunks = split_into_chunks(items, chunk_size or default_chunk_size(len(items), slots))
        # pure=False: a re-run must recompute (files may have changed), not reuse a result.
        task = functools.partial(apply_to_chunk, function, time_limit=time_limit)
        futures = client.map(task, chunks, pure=False)
        position = {future.key: index for index, future in enumerate(futures)}
        by_chunk: dict[int, list[R]] = {}
        done = 0
        try:
            for future in as_completed(futures, loop=client.loop):
                index = position[future.key]
                by_chunk[index] = future.result()
                done += len(chunks[index])
                if on_progress is not None:
                    on_progress(done, len(items))
        except FutureCancelledError as error:
            # Distributed cancels every future once the scheduler is gone (its reason says
            # so); a lost *worker* only moves its tasks elsewhere and never reaches here.
            client.cancel(futures)
            raise RuntimeError(
                f"lost the Dask scheduler {address!r} ({SCHEDULER_VARIABLE}) with {done} of "
                f"{len(items)} items done: {error}. Restart the scheduler (`dask scheduler`) "
                "and its workers, then re-run: outputs already written are re-used"
            ) from error
        except BaseException:
            client.cancel(futures)
            raise
    return [result for index in range(len(chunks)) for result in by_chunk[index]]


def apply_to_chunk(
    function: Callable[[T], R], chunk: Sequence[T], time_limit: TimeLimit[T, R] | None = None
) -> list[R]:
    """Run on a Dask worker: one task per chunk, so scheduling costs are paid per chunk.

    With a time limit the items run in this worker thread's supervised child process: a
    thread cannot be stopped, a process can, and an item over the limit becomes
    `time_limit.on_timeout(item, reason)` as on the local pool.
    """
    if time_limit is None:
        return [function(item) for item in chunk]
    return _thread_pool(function, time_limit).map(chunk)


# This worker process's supervised pools, one per Dask worker thread: (task key, pool).
_POOLS: dict[int, tuple[bytes, SupervisedPool]] = {}


def _thread_pool(function: Callable[[T], R], time_limit: TimeLimit[T, R]) -> SupervisedPool:
    """The calling thread's one-process pool for `function`, kept alive for its next chunks
    (starting a process per chunk would cost ~10 ms each); replaced when the task changes."""
    key = pickle.dumps((function, time_limit))
    thread = threading.get_ident()
    cached = _POOLS.get(thread)
    if cached is not None and cached[0] == key:
        return cached[1]
    if cached is not None:
        cached[1].close()
    pool = SupervisedPool(function, 1, time_limit, worker_context())
    _POOLS[thread] = (key, pool)
    return pool


def worker_context() -> multiprocessing.context.BaseContext | ChildProcessContext:
    """How this Dask worker starts its supervised child: the fork server, except in a
    daemonic worker process (`dask worker`'s default), which multiprocessing forbids to have
    children; there a plain subprocess of the same interpreter, started in about a second
    and kept between chunks."""
    if multiprocessing.current_process().daemon:
        return ChildProcessContext()
    return process_context()


def close_thread_pools() -> None:
    """Stop this process's per-thread supervised children, once no Dask task runs here. A
    Dask worker's clean exit stops them anyway (a child stuck in an item outlives a killed
    worker until its item ends); a process that hosts in-process Dask workers (tests) calls
    this when they stop, since each child also keeps multiprocessing's fork server alive."""
    while _POOLS:
        _thread, (_key, pool) = _POOLS.popitem()
        pool.close()


def _thread_count(client, address: str) -> int:
    """Worker threads on the cluster; waits a while for a first worker instead of queueing
    tasks that nothing would ever run."""
    try:
        client.wait_for_workers(1, timeout=CONNECT_TIMEOUT_SECONDS)
    except TimeoutError as error:
        raise RuntimeError(
            f"the Dask scheduler {address!r} ({SCHEDULER_VARIABLE}) has no workers after "
            f"{CONNECT_TIMEOUT_SECONDS} s; start some with `dask worker {address}`"
        ) from error
    return sum(client.nthreads().values())


def _client(address: str):
    from distributed import Client

    try:
        return Client(address, timeout=CONNECT_TIMEOUT_SECONDS, set_as_default=False)
    except OSError as error:
        raise OSError(
            f"cannot reach the Dask scheduler {address!r} named by {SCHEDULER_VARIABLE}: "
            f"{error}. Start it with `dask scheduler` or unset the variable to use the "
            "local process pool."
        ) from error
