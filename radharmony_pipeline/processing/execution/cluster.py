"""Where per-image work runs: the local process pool or a Dask cluster, chosen once.

The caller (defs/run_settings.py) picks an Executor, LocalPool(workers) or DaskCluster(address),
and hands it down. A DaskCluster sends the chunks of the `masks` and `images` steps to that
`distributed` cluster; its workers need the project installed (`pip install -e '.[scale]'`)
and read/write the same output root. With a time limit, each Dask worker thread runs its
chunks' items in a supervised child process of its own (kept between chunks), so a stuck
image becomes an error row there too, with the workers as `dask worker` starts them
(daemonic by default, see worker_context).
"""

from __future__ import annotations

import functools
import multiprocessing
import pickle
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from radharmony_pipeline.processing.execution.parallel import (
    Progress,
    default_chunk_size,
    map_in_chunks,
    map_with_time_limit,
    process_context,
    split_into_chunks,
)
from radharmony_pipeline.processing.execution.supervised import (
    ChildProcessContext,
    SupervisedPool,
    TimeLimit,
)
from radharmony_pipeline.settings import SCHEDULER_VARIABLE

T = TypeVar("T")
R = TypeVar("R")

CONNECT_TIMEOUT_SECONDS = 30


@dataclass(frozen=True)
class LocalPool:
    """This machine's process pool of `workers` processes."""

    workers: int

    def slots(self) -> int:
        """How many items or chunks run at once."""
        return self.workers


@dataclass(frozen=True)
class DaskCluster:
    """The `distributed` cluster whose scheduler listens at `address` (`tcp://host:8786`)."""

    address: str

    def slots(self) -> int:
        """How many chunks run at once: the cluster's worker threads (waits for a first)."""
        with _client(self.address) as client:
            return _thread_count(client, self.address)


Executor = LocalPool | DaskCluster


def map_per_image(
    function: Callable[[T], R],
    items: Sequence[T],
    executor: Executor,
    on_progress: Progress | None = None,
    chunk_size: int | None = None,
) -> list[R]:
    """[function(item) for item in items] on `executor`, results in input order."""
    if isinstance(executor, DaskCluster):
        return map_on_dask(function, items, executor.address, chunk_size, on_progress)
    return map_in_chunks(function, items, executor.workers, chunk_size, on_progress)


def map_per_image_with_time_limit(
    function: Callable[[T], R],
    items: Sequence[T],
    executor: Executor,
    time_limit: TimeLimit[T, R],
    on_progress: Progress | None = None,
) -> list[R]:
    """As map_per_image, each item bounded by `time_limit` in either place (supervised.py;
    on Dask, see apply_to_chunk_with_time_limit)."""
    if isinstance(executor, DaskCluster):
        return map_on_dask_with_time_limit(
            function, items, executor.address, time_limit, on_progress=on_progress
        )
    return map_with_time_limit(function, items, executor.workers, time_limit, on_progress)


def map_on_dask(
    function: Callable[[T], R],
    items: Sequence[T],
    address: str,
    chunk_size: int | None = None,
    on_progress: Progress | None = None,
) -> list[R]:
    """Chunks of `items` as Dask tasks on the scheduler at `address`, each chunk's items run
    in the worker thread (apply_to_chunk); the first failure is raised here (remaining tasks
    cancelled). on_progress(done_items, total) as chunks finish."""
    task = functools.partial(apply_to_chunk, function)
    return _chunks_on_dask(task, items, address, chunk_size, on_progress)


def map_on_dask_with_time_limit(
    function: Callable[[T], R],
    items: Sequence[T],
    address: str,
    time_limit: TimeLimit[T, R],
    chunk_size: int | None = None,
    on_progress: Progress | None = None,
) -> list[R]:
    """As map_on_dask, each item bounded by `time_limit` on its worker
    (apply_to_chunk_with_time_limit)."""
    task = functools.partial(apply_to_chunk_with_time_limit, function, time_limit)
    return _chunks_on_dask(task, items, address, chunk_size, on_progress)


def _chunks_on_dask(
    task: Callable[[list[T]], list[R]],
    items: Sequence[T],
    address: str,
    chunk_size: int | None,
    on_progress: Progress | None,
) -> list[R]:
    from distributed import as_completed  # the scale extra; imported only when configured
    from distributed.client import FutureCancelledError

    if not items:
        return []
    with _client(address) as client:
        slots = _thread_count(client, address)
        chunks = split_into_chunks(items, chunk_size or default_chunk_size(len(items), slots))
        # pure=False: a re-run must recompute (files may have changed), not reuse a result.
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


def apply_to_chunk(function: Callable[[T], R], chunk: Sequence[T]) -> list[R]:
    """Run on a Dask worker: one task per chunk, so scheduling costs are paid per chunk; the
    items run in this worker thread."""
    return [function(item) for item in chunk]


def apply_to_chunk_with_time_limit(
    function: Callable[[T], R], time_limit: TimeLimit[T, R], chunk: Sequence[T]
) -> list[R]:
    """Run on a Dask worker: the chunk's items in this worker thread's supervised child
    process. A thread cannot be stopped, a process can, and an item over the limit becomes
    `time_limit.on_timeout(item, reason)` as on the local pool."""
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
