"""Where per-image chunks run: the local process pool (default) or a Dask cluster.

Setting RADHARMONY_DASK_SCHEDULER to a scheduler address (`tcp://host:8786`) sends the
chunks of the `masks` and `images` steps to that `distributed` cluster; its workers need the
project installed (`pip install -e '.[scale]'`) and read/write the same output root.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

from .parallel import (
    Progress,
    default_chunk_size,
    map_in_chunks,
    split_into_chunks,
    worker_count,
)
from .supervised import TimeLimit

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

    `time_limit` bounds every item on the local pool (supervised.py). A Dask worker cannot
    stop one task of its threads, so on a cluster it does not apply: there the scheduler's
    own timeouts and worker restarts are the bound (README "Running on a cluster").
    """
    address = dask_scheduler()
    if address is None:
        return map_in_chunks(function, items, workers, chunk_size, on_progress, time_limit)
    return map_on_dask(function, items, address, chunk_size, on_progress)


def map_on_dask(
    function: Callable[[T], R],
    items: Sequence[T],
    address: str,
    chunk_size: int | None = None,
    on_progress: Progress | None = None,
) -> list[R]:
    """Chunks of `items` as Dask tasks on the scheduler at `address`; the first failure is
    raised here (remaining tasks cancelled). on_progress(done_items, total) as chunks finish."""
    from distributed import as_completed  # the scale extra; imported only when configured

    if not items:
        return []
    with _client(address) as client:
        slots = _thread_count(client, address)
        chunks = split_into_chunks(items, chunk_size or default_chunk_size(len(items), slots))
        # pure=False: a re-run must recompute (files may have changed), not reuse a result.
        futures = client.map(functools.partial(apply_to_chunk, function), chunks, pure=False)
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
        except BaseException:
            client.cancel(futures)
            raise
    return [result for index in range(len(chunks)) for result in by_chunk[index]]


def apply_to_chunk(function: Callable[[T], R], chunk: Sequence[T]) -> list[R]:
    """Run on a Dask worker: one task per chunk, so scheduling costs are paid per chunk."""
    return [function(item) for item in chunk]


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
