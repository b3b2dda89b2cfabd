"""map_in_chunks keeps order, uses real worker processes, propagates errors; worker parsing."""

from __future__ import annotations

import os
import resource
import select
import subprocess
import sys
import threading
import time
from multiprocessing.connection import Connection
from pathlib import Path, PurePosixPath

import psutil
import pytest
from pool_work import (
    DiesOnArrival,
    ImageBroken,
    fail_on_seven,
    path_facts,
    short_sleep,
    slow_first,
    square,
    stuck_at_150,
    stuck_on_bytes,
    tag_with_pid,
)

from radharmony_pipeline.defs.run_settings import RunSettingsResource
from radharmony_pipeline.processing.execution import parallel, supervised
from radharmony_pipeline.processing.execution.parallel import (
    FILE_SYSTEM_THREADS,
    default_chunk_size,
    map_in_chunks,
    map_on_file_system,
    map_with_time_limit,
    process_context,
)
from radharmony_pipeline.processing.execution.supervised import (
    SupervisedPool,
    TimeLimit,
    WorkerStartError,
    run_supervised,
)
from radharmony_pipeline.settings import WORKERS_VARIABLE, worker_count

LIMIT = TimeLimit(1.0, lambda item, reason: f"stopped: {reason}")


# --- map_in_chunks -------------------------------------------------------------------------


def test_order_is_preserved_in_process() -> None:
    items = list(range(23))
    assert map_in_chunks(square, items, workers=1) == [n * n for n in items]


def test_in_process_runs_every_item_once_in_this_process() -> None:
    calls: list[int] = []

    def record(number: int) -> int:  # a closure: fine in-process, unpicklable in a pool
        calls.append(number)
        return number

    assert map_in_chunks(record, [3, 1, 2], workers=1, chunk_size=2) == [3, 1, 2]
    assert calls == [3, 1, 2]


@pytest.mark.parametrize("chunk_size", [None, 1, 5, 100])
def test_order_is_preserved_with_two_workers(chunk_size: int | None) -> None:
    items = list(range(37, 0, -1))
    assert map_in_chunks(square, items, workers=2, chunk_size=chunk_size) == [n * n for n in items]


def test_two_workers_run_outside_this_process() -> None:
    results = map_in_chunks(tag_with_pid, list(range(16)), workers=2)
    assert [number for number, _ in results] == list(range(16))
    assert os.getpid() not in {pid for _, pid in results}


@pytest.mark.parametrize("workers", [1, 2])
def test_worker_exception_propagates_with_type_and_message(workers: int) -> None:
    with pytest.raises(ImageBroken, match="image 7 is broken"):
        map_in_chunks(fail_on_seven, list(range(20)), workers=workers, chunk_size=3)


@pytest.mark.parametrize("workers", [1, 2])
def test_progress_reports_items_done_up_to_the_total(workers: int) -> None:
    reports: list[tuple[int, int]] = []
    map_in_chunks(
        square,
        list(range(10)),
        workers=workers,
        chunk_size=3,
        on_progress=lambda *r: reports.append(r),
    )
    assert len(reports) == 4  # chunks of 3, 3, 3 and 1
    assert [done for done, _ in reports] == sorted(done for done, _ in reports)
    assert reports[-1] == (10, 10)
    assert {total for _, total in reports} == {10}


# --- with a time limit (the supervised pool) -------------------------------------------------


def test_supervised_progress_is_reported_per_chunk() -> None:
    reports: list[tuple[int, int]] = []
    results = map_with_time_limit(
        square,
        list(range(10)),
        workers=2,
        time_limit=LIMIT,
        on_progress=lambda *r: reports.append(r),
        progress_every=3,
    )
    assert results == [n * n for n in range(10)]
    assert reports == [(3, 10), (6, 10), (9, 10), (10, 10)]


@pytest.mark.slow
def test_a_slow_item_holds_back_only_the_item_queued_behind_it() -> None:
    # Items are handed out one at a time (plus one in hand), not in fixed chunks: while one
    # worker sleeps on item 0, the other does everything except what the first holds.
    roomy = TimeLimit(60.0, LIMIT.on_timeout)
    results = map_with_time_limit(slow_first, list(range(40)), workers=2, time_limit=roomy)
    assert [number for number, _ in results] == list(range(40))
    slow_worker = results[0][1]
    assert {number for number, pid in results if pid == slow_worker} <= {0, 1}


@pytest.mark.slow
def test_a_large_item_behind_a_stuck_one_never_blocks_the_parent() -> None:
    # 4 MB does not fit in a pipe: written to a worker stuck on its current item, it would
    # block the parent, and with it the time limit, forever.
    items = [b"stuck", b"x" * (4 << 20), b"ok"]
    outcome: list = []
    runner = threading.Thread(
        target=lambda: outcome.append(map_with_time_limit(stuck_on_bytes, items, 1, LIMIT)),
        daemon=True,
    )
    runner.start()
    runner.join(timeout=120)
    assert not runner.is_alive(), "the supervised pool hung"
    assert outcome[0][0].startswith("stopped: took longer than 1 s")
    assert outcome[0][1:] == [4 << 20, 2]


def test_a_supervised_pool_keeps_its_workers_between_maps() -> None:
    with SupervisedPool(tag_with_pid, 2, LIMIT, process_context()) as pool:
        first = pool.map(list(range(10)))
        second = pool.map(list(range(10, 20)))
    assert [number for number, _ in first + second] == list(range(20))
    first_pids, second_pids = {pid for _, pid in first}, {pid for _, pid in second}
    assert second_pids <= first_pids and os.getpid() not in first_pids


def test_paths_in_items_reach_the_workers_as_the_same_paths() -> None:
    # Sent as their text (supervised._ItemPickler), they arrive of the same type and parts,
    # odd names included.
    items = [
        (Path("/data/deid_png/p 1/ä/../x.png"), PurePosixPath("relative//dir/./y.png")),
        (Path("relative/file"), PurePosixPath("/")),
    ]
    results = run_supervised(path_facts, items, 2, LIMIT, process_context())
    assert results == [(type(path), str(path), pure.parts, PurePosixPath) for path, pure in items]


@pytest.mark.slow
def test_a_worker_that_died_while_idle_is_replaced_at_the_next_map() -> None:
    with SupervisedPool(tag_with_pid, 1, LIMIT, process_context()) as pool:
        [(_, pid)] = pool.map([1])
        exited = os.pidfd_open(pid)  # readable once the process has exited (not reaped)
        os.kill(pid, 9)
        try:
            assert select.select([exited], [], [], 30)[0], f"worker {pid} outlived kill -9"
        finally:
            os.close(exited)
        # The pool learns of the death from its parent (the fork server), which reports it
        # once it has reaped the process: until then the worker still looks idle and alive.
        reaped_by = time.monotonic() + 30
        while psutil.pid_exists(pid) and time.monotonic() < reaped_by:
            time.sleep(0.01)
        again = pool.map([2, 3])
    assert [number for number, _ in again] == [2, 3]
    assert {worker for _, worker in again} != {pid}


@pytest.mark.slow
def test_workers_that_die_on_start_use_up_items_instead_of_restarting_for_ever() -> None:
    limit = TimeLimit(30.0, lambda item, reason: f"{item}: {reason}")
    results = run_supervised(DiesOnArrival(), [1, 2, 3], 2, limit, process_context())
    assert results == [
        f"{n}: worker process died (exit code 3) while processing it" for n in (1, 2, 3)
    ]


@pytest.mark.slow
def test_workers_that_keep_dying_on_start_stop_the_map_with_the_likely_causes() -> None:
    """A partition of many items is not used up one failed start at a time."""
    limit = TimeLimit(30.0, lambda item, reason: f"{item}: {reason}")
    start = time.monotonic()
    with pytest.raises(WorkerStartError, match=r"8 worker processes in a row exited .*code 3"):
        run_supervised(DiesOnArrival(), list(range(1000)), 2, limit, process_context())
    assert time.monotonic() - start < 60


def test_no_items_gives_no_results() -> None:
    assert map_in_chunks(square, [], workers=2) == []


def test_invalid_workers_or_chunk_size_is_rejected() -> None:
    with pytest.raises(ValueError, match="workers"):
        map_in_chunks(square, [1], workers=0)
    with pytest.raises(ValueError, match="chunk_size"):
        map_in_chunks(square, [1], workers=1, chunk_size=0)


def test_default_chunk_size_gives_about_four_chunks_per_worker() -> None:
    assert default_chunk_size(1000, 5) == 50
    assert default_chunk_size(3, 8) == 1


# --- worker_count --------------------------------------------------------------------------


def test_worker_count_defaults_to_cpu_count() -> None:
    assert worker_count({}) == (os.cpu_count() or 1)
    assert worker_count({WORKERS_VARIABLE: " "}) == (os.cpu_count() or 1)  # blank: the default


@pytest.mark.parametrize("raw, expected", [("1", 1), ("3", 3), (" 12 ", 12)])
def test_worker_count_reads_the_variable(raw: str, expected: int) -> None:
    assert worker_count({WORKERS_VARIABLE: raw}) == expected


@pytest.mark.parametrize("raw", ["0", "-2", "two", "1.5"])
def test_worker_count_rejects_invalid_values_naming_the_variable(raw: str) -> None:
    with pytest.raises(ValueError, match=WORKERS_VARIABLE):
        worker_count({WORKERS_VARIABLE: raw})


def test_the_run_settings_read_workers_from_the_environment_by_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(WORKERS_VARIABLE, "5")
    assert RunSettingsResource().workers == 5
    assert RunSettingsResource(workers=3).workers == 3  # run config wins


def test_processing_modules_do_not_import_dagster() -> None:
    # Pool workers re-import the function's module; dagster would cost seconds per worker.
    code = (
        "import sys\n"
        "import radharmony_pipeline.processing.imaging.image_files\n"
        "import radharmony_pipeline.processing.annotations.masks\n"
        "import radharmony_pipeline.processing.execution.parallel\n"
        "assert 'dagster' not in sys.modules, 'dagster was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def count_waits(monkeypatch) -> list[int]:
    """The parent's waits for results from now on, one entry each."""
    waits: list[int] = []
    original = supervised.wait

    def counted_wait(*args, **kwargs):
        waits.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(supervised, "wait", counted_wait)
    return waits


def test_quick_items_are_collected_in_batches_not_one_wake_up_each(monkeypatch) -> None:
    # The parent pauses between wake-ups once a worker's pace is known, and queues enough
    # items to keep it busy meanwhile: far fewer waits than items, every result in order.
    waits = count_waits(monkeypatch)
    items = list(range(300))
    roomy = TimeLimit(60.0, LIMIT.on_timeout)
    results = run_supervised(short_sleep, items, 1, roomy, process_context())
    assert results == items
    assert len(waits) < len(items) / 4, f"{len(waits)} wake-ups for {len(items)} items"


def test_items_of_microseconds_are_handed_out_hundreds_at_a_time(monkeypatch) -> None:
    # A worker must hold enough of them to stay busy between the parent's wake-ups (an
    # image a killed build already wrote takes a tenth of a millisecond): with a few dozen
    # in hand, it waits for the parent most of the time.
    waits = count_waits(monkeypatch)
    items = list(range(20_000))
    roomy = TimeLimit(60.0, LIMIT.on_timeout)
    assert run_supervised(abs, items, 1, roomy, process_context()) == items
    assert len(waits) < len(items) / 100, f"{len(waits)} wake-ups for {len(items)} items"


def test_quick_items_travel_to_a_worker_several_per_message(monkeypatch) -> None:
    # Items handed out together are pickled and written into the pipe as one message.
    messages: list[int] = []
    original = Connection.send_bytes

    def counted_send(self, buffer, *args):
        messages.append(len(buffer))
        return original(self, buffer, *args)

    monkeypatch.setattr(Connection, "send_bytes", counted_send)
    items = list(range(300))
    roomy = TimeLimit(60.0, LIMIT.on_timeout)
    assert run_supervised(short_sleep, items, 1, roomy, process_context()) == items
    assert len(messages) < len(items) / 4, f"{len(messages)} messages for {len(items)} items"


@pytest.mark.slow
def test_an_item_stuck_inside_a_message_of_several_is_the_only_one_stopped() -> None:
    # By item 150 the worker holds many items from one message: the stuck one is charged
    # with the limit, the ones that came with it run in the next worker.
    results = map_with_time_limit(stuck_at_150, list(range(300)), workers=1, time_limit=LIMIT)
    assert results[150].startswith("stopped: took longer than 1 s")
    assert results[:150] + results[151:] == [n for n in range(300) if n != 150]


@pytest.mark.slow
def test_a_kept_worker_is_paced_by_the_current_map_not_its_idle_time(monkeypatch) -> None:
    # A pool kept between maps (a Dask worker between chunks) sits idle in between: that
    # time is no part of the worker's pace, which would otherwise look slow and be fed too
    # few items to cover the parent's pauses.
    roomy = TimeLimit(60.0, LIMIT.on_timeout)
    with SupervisedPool(short_sleep, 1, roomy, process_context()) as pool:
        assert pool.map(list(range(50))) == list(range(50))
        time.sleep(3)
        waits = count_waits(monkeypatch)
        items = list(range(300))
        assert pool.map(items) == items
    # Paced by its idle time, the worker held two items per pause: about 70 wake-ups.
    assert len(waits) < len(items) / 8, f"{len(waits)} wake-ups for {len(items)} items"


def test_file_system_map_keeps_order_uses_threads_and_raises_the_first_error() -> None:
    threads: set[int] = set()

    def square(item: int) -> int:
        threads.add(threading.get_ident())
        time.sleep(0.0005)  # waits, as a stat on a cold tree does: the threads overlap
        return item * item

    items = list(range(3000))
    assert map_on_file_system(square, items) == [item * item for item in items]
    # The first chunk here, the rest on the threads once it waited.
    assert threading.get_ident() in threads
    assert 2 < len(threads) <= FILE_SYSTEM_THREADS + 1
    # A few items run here, in order, without threads.
    threads.clear()
    assert map_on_file_system(square, [3, 1, 2]) == [9, 1, 4]
    assert threads == {threading.get_ident()}

    def fails_at_2000(item: int) -> int:
        time.sleep(0.0005)
        if item == 2000:
            raise OSError(f"item {item}")
        return item

    with pytest.raises(OSError, match="item 2000"):
        map_on_file_system(fails_at_2000, items)


def test_file_system_map_stays_on_the_calling_thread_while_answers_are_cached() -> None:
    threads: set[int] = set()

    def cube(item: int) -> int:  # no wait, as a stat the page cache answers
        threads.add(threading.get_ident())
        return item**3

    items = list(range(5000))
    assert map_on_file_system(cube, items) == [item**3 for item in items]
    assert threads == {threading.get_ident()}

    def slow_from_1000(item: int) -> int:  # the tree turns cold part-way through
        threads.add(threading.get_ident())
        if item >= 1000:
            time.sleep(0.0005)
        return -item

    threads.clear()
    assert map_on_file_system(slow_from_1000, items) == [-item for item in items]
    assert len(threads) > 2


def test_file_system_map_starts_threads_for_sleeps_and_leaves_them_when_cached():
    here = threading.get_ident()
    ran_on: dict[int, int] = {}
    zeros = os.open("/dev/zero", os.O_RDONLY)

    def busy_in_the_kernel(item: int) -> int:
        # CPU in system calls without a sleep, as cached lookups are: more system time per
        # item than a cold stat waits, which tick-sampled CPU time counted as a wait.
        ran_on[item] = threading.get_ident()
        return len(os.read(zeros, 4 << 20))

    try:
        items = list(range(1000))
        assert map_on_file_system(busy_in_the_kernel, items) == [4 << 20] * len(items)
    finally:
        os.close(zeros)
    assert set(ran_on.values()) == {here}

    def slow_first(item: int) -> int:
        ran_on[item] = threading.get_ident()
        if item < 256:
            time.sleep(0.0003)
        return item

    # Sleeping (as on a cold disk) does: the next chunks run on the threads, and the first
    # chunk in sequence after them, which answers from memory, brings the rest back here.
    ran_on.clear()
    items = list(range(60_000))
    assert map_on_file_system(slow_first, items) == items
    threaded = {item for item, thread in ran_on.items() if thread != here}
    assert threaded and min(threaded) >= 256
    assert max(threaded) < 40_000 and all(ran_on[item] == here for item in range(40_000, 60_000))


@pytest.mark.parametrize("scope", ["thread", "process"])
def test_a_chunk_in_sequence_is_waiting_when_it_slept_not_when_it_computed(monkeypatch, scope):
    if scope == "process":  # a kernel that keeps no count per thread
        monkeypatch.setattr(parallel, "_SLEEP_COUNT", resource.RUSAGE_SELF)
    items = list(range(20))
    assert parallel._in_sequence(lambda item: time.sleep(0.001) or item, items) == (items, True)
    busy = parallel._in_sequence(lambda item: sum(range(item * 10_000)), items)
    assert busy == ([sum(range(item * 10_000)) for item in items], False)
