"""Per-image work spread over a process pool in chunks, results in input order."""

from __future__ import annotations

import math
import multiprocessing
import os
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ProcessPoolExecutor, wait
from typing import TypeVar

from .supervised import TimeLimit, run_supervised

T = TypeVar("T")
R = TypeVar("R")

WORKERS_VARIABLE = "RADHARMONY_WORKERS"
CHUNKS_PER_WORKER = 4  # enough slack that a slow chunk does not leave the other workers idle

Progress = Callable[[int, int], None]


def worker_count(environ: Mapping[str, str] = os.environ) -> int:
    """RADHARMONY_WORKERS if set (a positive integer), else the machine's CPU count."""
    raw = environ.get(WORKERS_VARIABLE)
    if raw is None:
        return os.cpu_count() or 1
    try:
        workers = int(raw.strip())
    except ValueError:
        workers = 0
    if workers < 1:
        raise ValueError(f"{WORKERS_VARIABLE} must be a positive integer, got {raw!r}")
    return workers


def default_chunk_size(item_count: int, workers: int) -> int:
    """Items per chunk so that each worker gets about CHUNKS_PER_WORKER chunks."""
    return max(1, math.ceil(item_count / (workers * CHUNKS_PER_WORKER)))


def split_into_chunks(items: Sequence[T], chunk_size: int) -> list[list[T]]:
    return [list(items[start : start + chunk_size]) for start in range(0, len(items), chunk_size)]


def apply_to_chunk(function: Callable[[T], R], chunk: Sequence[T]) -> list[R]:
    """Run in a worker: one task per chunk, so pickling costs are paid per chunk, not item."""
    return [function(item) for item in chunk]


_PRELOAD = [
    "radharmony_pipeline.processing.image_jobs",
    "radharmony_pipeline.processing.mask_jobs",
]


def _process_context() -> multiprocessing.context.BaseContext:
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


def _run_in_process(
    function: Callable[[T], R], chunks: list[list[T]], total: int, on_progress: Progress | None
) -> list[R]:
    results: list[R] = []
    for chunk in chunks:
        results.extend(apply_to_chunk(function, chunk))
        if on_progress is not None:
            on_progress(len(results), total)
    return results


def _collect_in_order(
    futures: dict[Future, int], chunks: list[list[T]], total: int, on_progress: Progress | None
) -> list[R]:
    """Wait for every chunk, reporting progress as they finish; the first failure is raised."""
    by_chunk: dict[int, list[R]] = {}
    pending = set(futures)
    done_items = 0
    while pending:
        finished, pending = wait(pending, return_when=FIRST_EXCEPTION)
        for future in finished:
            # result() re-raises a worker's exception with its original type and message.
            index = futures[future]
            by_chunk[index] = future.result()
            done_items += len(chunks[index])
            if on_progress is not None:
                on_progress(done_items, total)
    return [result for index in range(len(chunks)) for result in by_chunk[index]]


def _run_in_pool(
    function: Callable[[T], R],
    chunks: list[list[T]],
    workers: int,
    total: int,
    on_progress: Progress | None,
) -> list[R]:
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=_process_context())
    try:
        futures = {
            pool.submit(apply_to_chunk, function, chunk): i for i, chunk in enumerate(chunks)
        }
        return _collect_in_order(futures, chunks, total, on_progress)
    finally:
        # On failure, drop the queued chunks instead of finishing work nobody will use.
        pool.shutdown(wait=True, cancel_futures=True)


def map_in_chunks(
    function: Callable[[T], R],
    items: Sequence[T],
    workers: int,
    chunk_size: int | None = None,
    on_progress: Progress | None = None,
    time_limit: TimeLimit[T, R] | None = None,
) -> list[R]:
    """[function(item) for item in items], computed by `workers` processes over chunks.

    `function` must be a picklable top-level function. workers == 1 runs in this process
    with no pool, unless a `time_limit` is given: then every item runs in a worker process
    that is killed when one item exceeds it (see supervised.py). on_progress(done_items,
    total_items) is called here, in the parent, each time a chunk finishes.
    """
    if workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    if chunk_size is not None and chunk_size < 1:
        raise ValueError(f"chunk_size must be at least 1, got {chunk_size}")
    size = chunk_size or default_chunk_size(len(items), workers)
    chunks = split_into_chunks(items, size)
    if time_limit is not None and chunks:
        context = _process_context()
        return run_supervised(function, chunks, workers, time_limit, context, on_progress)
    if workers == 1 or len(chunks) <= 1:
        # One chunk cannot be shared; a pool would only add process start-up time.
        return _run_in_process(function, chunks, len(items), on_progress)
    return _run_in_pool(function, chunks, min(workers, len(chunks)), len(items), on_progress)
