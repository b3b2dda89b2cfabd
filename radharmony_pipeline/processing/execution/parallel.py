"""Per-image work spread over a process pool in chunks, results in input order."""

from __future__ import annotations

import math
import multiprocessing
import resource
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from typing import TypeVar

from radharmony_pipeline.processing.execution.supervised import TimeLimit, run_supervised

T = TypeVar("T")
R = TypeVar("R")

CHUNKS_PER_WORKER = 4  # enough slack that a slow chunk does not leave the other workers idle

Progress = Callable[[int, int], None]


def default_chunk_size(item_count: int, workers: int) -> int:
    """Items per chunk so that each worker gets about CHUNKS_PER_WORKER chunks."""
    return max(1, math.ceil(item_count / (workers * CHUNKS_PER_WORKER)))


def split_into_chunks(items: Sequence[T], chunk_size: int) -> list[list[T]]:
    """Consecutive runs of `chunk_size` items, for executors that take whole chunks (Dask)."""
    return [list(items[start : start + chunk_size]) for start in range(0, len(items), chunk_size)]


_PRELOAD = [
    "radharmony_pipeline.processing.jobs.image_jobs",
    "radharmony_pipeline.processing.jobs.mask_jobs",
    "radharmony_pipeline.processing.imaging.dicom_decode",
    "scipy.sparse",  # the area resize's weights (imported on first use elsewhere)
]


def process_context() -> multiprocessing.context.BaseContext:
    """The start method of every worker process: a fork server that preloads our modules."""
    # Never "fork": the Dagster step calling us may hold threads (event log writers, gRPC),
    # and forking a threaded process can copy a held lock into the child and deadlock it.
    # "forkserver" forks from a clean single-threaded server (cheap per worker); "spawn" is
    # the portable fallback. Either way workers re-import the function's module, which is
    # why these processing modules stay free of dagster imports.
    methods = multiprocessing.get_all_start_methods()
    if "forkserver" not in methods:
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    # The fork server imports these once; every worker forked from it then starts in
    # milliseconds instead of re-importing numpy, OpenCV, pydicom and pycocotools (~1 s).
    context.set_forkserver_preload(_PRELOAD)
    return context


def map_in_chunks(
    function: Callable[[T], R],
    items: Sequence[T],
    workers: int,
    chunk_size: int | None = None,
    on_progress: Progress | None = None,
) -> list[R]:
    """[function(item) for item in items], computed by `workers` processes.

    `function` must be a picklable top-level function. Items travel to the pool in chunks of
    `chunk_size` (concurrent.futures' own chunking, so pickling is paid per chunk); workers
    == 1 runs in this process with no pool. on_progress(done_items, total_items) is called
    here, in the parent, each time another chunk's worth of items is done, and at the end.
    """
    size = _chunk_size(len(items), workers, chunk_size)
    report = _every_chunk(size, len(items), on_progress)
    if workers == 1 or len(items) <= size:
        # One chunk cannot be shared; a pool would only add process start-up time.
        return _collect(map(function, items), report)
    chunks = math.ceil(len(items) / size)
    pool = ProcessPoolExecutor(max_workers=min(workers, chunks), mp_context=process_context())
    try:
        # map() yields in input order and re-raises a worker's exception with its type.
        return _collect(pool.map(function, items, chunksize=size), report)
    finally:
        # On failure, drop the queued chunks instead of finishing work nobody will use.
        pool.shutdown(wait=True, cancel_futures=True)


# Requests to the file system in flight at once when a partition's files are only looked at
# (a stat, a PNG header) and the tree is not in the page cache (a first run on a download, or
# after a build wrote more than memory): each is then a disk read, and the disk serves many
# at a time. On a cached tree threads cost more than they save (the GIL changes hands at
# every call: a look at 60,000 cached sources took three times as long on 16 threads as in
# sequence), so chunks run in sequence, and only a chunk whose thread went to sleep waiting
# (a disk read, a network file system's reply) sends the next ones to the threads, until a
# chunk run in sequence again shows the tree answering from memory. Sleeps are counted, not
# timed: the kernel splits a thread's CPU time into user and system time by sampling it at
# each tick, which at a chunk's few milliseconds read a cached chunk's system calls as time
# outside Python often enough to send most of an unchanged re-run's look to the threads.
FILE_SYSTEM_THREADS = 16
_THREAD_CHUNK = 256  # items per task: a future per item would cost more than a cached stat
# A cold stat of a ReXGradient image sleeps about 5 times here (one per block read); a
# cached one never does. Counted for the thread where the kernel keeps a count per thread
# (Linux), else for the process, whose other threads sleep far less often than that.
_SLEEPS_PER_ITEM = 0.5
_SLEEP_COUNT = getattr(resource, "RUSAGE_THREAD", resource.RUSAGE_SELF)
_CHUNKS_BETWEEN_PROBES = 128  # threaded between two chunks in sequence: ~3 % of a cold pass


def map_on_file_system(function: Callable[[T], R], items: Sequence[T]) -> list[R]:
    """[function(item) for item in items], in order, for functions that mostly wait on the
    file system (which releases the GIL): in sequence while it answers from memory, on
    FILE_SYSTEM_THREADS threads while it waits on the disk."""
    chunks = split_into_chunks(items, _THREAD_CHUNK)
    results: list[R] = []
    position = 0
    # Threads start with the first task submitted: a cached tree never starts one.
    with ThreadPoolExecutor(FILE_SYSTEM_THREADS) as pool:
        while position < len(chunks):
            done, slept = _in_sequence(function, chunks[position])
            results.extend(done)
            position += 1
            if slept:
                batch = chunks[position : position + _CHUNKS_BETWEEN_PROBES]
                position += len(batch)
                threaded = pool.map(lambda rest: [function(item) for item in rest], batch)
                results.extend(result for rest in threaded for result in rest)
    return results


def _in_sequence(function: Callable[[T], R], items: Sequence[T]) -> tuple[list[R], bool]:
    """[function(item) for item in items] on this thread, and whether it mostly slept
    waiting (its voluntary context switches; a preemption is not one)."""
    before = resource.getrusage(_SLEEP_COUNT).ru_nvcsw
    results = [function(item) for item in items]
    sleeps = resource.getrusage(_SLEEP_COUNT).ru_nvcsw - before
    return results, sleeps > _SLEEPS_PER_ITEM * len(items)


def map_with_time_limit(
    function: Callable[[T], R],
    items: Sequence[T],
    workers: int,
    time_limit: TimeLimit[T, R],
    on_progress: Progress | None = None,
    progress_every: int | None = None,
) -> list[R]:
    """[function(item) for item in items], each item in one of `workers` supervised processes
    (supervised.py): an item over `time_limit` becomes `time_limit.on_timeout(item, reason)`
    and its process is replaced. Items are handed out as each worker wants them, so there is
    no chunk size; on_progress(done_items, total_items) comes every `progress_every` items
    (default: as often as map_in_chunks reports its chunks) and at the end."""
    size = _chunk_size(len(items), workers, progress_every)
    if not items:
        return []
    report = _every_chunk(size, len(items), on_progress)
    return run_supervised(function, items, workers, time_limit, process_context(), report)


def _chunk_size(item_count: int, workers: int, chunk_size: int | None) -> int:
    if workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    if chunk_size is not None and chunk_size < 1:
        raise ValueError(f"chunk_size must be at least 1, got {chunk_size}")
    return chunk_size or default_chunk_size(item_count, workers)


def _every_chunk(size: int, total: int, on_progress: Progress | None) -> Callable[[int], None]:
    """A done-count callback that forwards to on_progress once per chunk and at the end."""

    def report(done: int) -> None:
        if on_progress is not None and (done % size == 0 or done == total):
            on_progress(done, total)

    return report


def _collect(results: Iterable[R], report: Callable[[int], None]) -> list[R]:
    collected: list[R] = []
    for result in results:
        collected.append(result)
        report(len(collected))
    return collected
