"""The Dask backend against a real in-process scheduler: order, errors, progress, no hang."""

from __future__ import annotations

import multiprocessing
import os
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
from PIL import Image

from radharmony_pipeline.defs.run_settings import RunSettingsResource
from radharmony_pipeline.processing.execution import cluster
from radharmony_pipeline.processing.execution.cluster import (
    DaskCluster,
    LocalPool,
    map_on_dask,
    map_on_dask_with_time_limit,
    map_per_image,
)
from radharmony_pipeline.processing.execution.parallel import process_context
from radharmony_pipeline.processing.execution.supervised import (
    ChildProcessContext,
    SupervisedPool,
    TimeLimit,
    run_supervised,
)
from radharmony_pipeline.processing.jobs.image_jobs import (
    ImageJob,
    build_packed_images,
    image_job_stopped,
)
from radharmony_pipeline.processing.storage import output_layout as layout
from radharmony_pipeline.processing.storage.atomic import TEMP_MARKER
from radharmony_pipeline.synthetic.radiograph import render_radiograph, to_uint8

pytestmark = pytest.mark.cluster

LIMIT_SECONDS = 3.0


def square(value: int) -> int:
    if value == 13:
        raise ValueError("image 13: cannot decode")
    return value * value


@pytest.fixture(scope="module")
def scheduler():
    from distributed import LocalCluster

    try:
        with LocalCluster(
            n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0"
        ) as local:
            yield local.scheduler_address
    finally:
        # The worker threads ran here: stop the supervised children they kept.
        cluster.close_thread_pools()


def test_results_come_back_in_input_order_with_progress(scheduler):
    progress = []
    items = [value for value in range(40) if value != 13]
    result = map_on_dask(
        square, items, scheduler, chunk_size=3, on_progress=lambda d, t: progress.append((d, t))
    )
    assert result == [value * value for value in items]
    assert progress[-1] == (len(items), len(items))
    assert [done for done, _ in progress] == sorted(done for done, _ in progress)


def test_a_worker_error_is_raised_with_its_message(scheduler):
    with pytest.raises(ValueError, match="image 13: cannot decode"):
        map_on_dask(square, list(range(20)), scheduler, chunk_size=4)


def test_the_variable_selects_dask_and_its_absence_the_local_pool(scheduler, monkeypatch):
    calls = []
    monkeypatch.setattr(cluster, "map_on_dask", lambda *args: calls.append(args) or [])
    monkeypatch.setenv(cluster.SCHEDULER_VARIABLE, scheduler)
    monkeypatch.setenv("RADHARMONY_WORKERS", "1")
    executor = RunSettingsResource().executor()
    assert executor == DaskCluster(scheduler)
    map_per_image(square, [1, 2], executor)
    assert calls and calls[0][2] == scheduler
    monkeypatch.delenv(cluster.SCHEDULER_VARIABLE)
    executor = RunSettingsResource().executor()
    assert executor == LocalPool(1)
    assert map_per_image(square, [1, 2, 3], executor) == [1, 4, 9]
    assert len(calls) == 1
    # Run config wins over the variable.
    assert RunSettingsResource(dask_scheduler=scheduler).executor() == DaskCluster(scheduler)


def test_a_scheduler_without_workers_fails_clearly_instead_of_hanging(monkeypatch):
    from distributed import LocalCluster

    monkeypatch.setattr(cluster, "CONNECT_TIMEOUT_SECONDS", 2)
    with (
        LocalCluster(n_workers=0, processes=False, dashboard_address=":0") as empty,
        pytest.raises(RuntimeError, match="has no workers"),
    ):
        map_on_dask(square, [1, 2, 3], empty.scheduler_address)


def square_or_hang(value: int) -> int:
    if value == 13:
        time.sleep(3600)  # stands for a decoder stuck on a hostile file
    return value * value


def stopped(value: int, reason: str) -> str:
    return f"stopped {value}: {reason}"


def child_pid(_value: int) -> int:
    return os.getpid()


LIMIT = TimeLimit(LIMIT_SECONDS, stopped)


@pytest.mark.timeout(60, func_only=True)
def test_a_stuck_item_on_dask_becomes_its_timeout_result(scheduler):
    result = map_on_dask_with_time_limit(
        square_or_hang, list(range(20)), scheduler, LIMIT, chunk_size=4
    )
    assert result[13].startswith(f"stopped 13: took longer than {LIMIT_SECONDS:g} s")
    assert result[:13] + result[14:] == [v * v for v in range(20) if v != 13]


def test_each_dask_thread_keeps_one_supervised_process_across_chunks(scheduler):
    first = map_on_dask_with_time_limit(child_pid, list(range(12)), scheduler, LIMIT, 1)
    second = map_on_dask_with_time_limit(child_pid, list(range(12)), scheduler, LIMIT, 1)
    pids = set(first) | set(second)
    # Two worker threads: at most two processes for 24 one-item chunks, none of them ours.
    assert 1 <= len(pids) <= 2 and os.getpid() not in pids
    assert all(psutil.pid_exists(pid) for pid in pids)
    cluster.close_thread_pools()
    assert not any(psutil.pid_exists(pid) for pid in pids)


def dies_on_7(value: int) -> int:
    if value == 7:
        os._exit(3)  # stands for a decoder crashing the process
    return value * value


@pytest.mark.timeout(120)
def test_supervised_subprocess_children_bound_items_like_multiprocessing_ones():
    """ChildProcessContext (what a daemonic Dask worker uses) against the fork server: the
    same results, the same stopped and dead items, and no child left behind."""
    items = list(range(16))
    results = {}
    for name, context in (
        ("fork server", process_context()),
        ("subprocess", ChildProcessContext()),
    ):
        limit = TimeLimit(2.0, stopped)
        with SupervisedPool(square_or_hang, 2, limit, context) as pool:
            results[name] = pool.map(items)
            children = [worker.process for worker in pool._active]
        assert not any(child.is_alive() for child in children)
        died = run_supervised(dies_on_7, list(range(10)), 2, limit, context)
        assert died[7].startswith("stopped 7: worker process died (exit code 3)")
        assert died[:7] + died[8:] == [v * v for v in range(10) if v != 7]
    assert results["subprocess"] == results["fork server"]
    assert results["subprocess"][13].startswith("stopped 13: took longer than 2 s")


@pytest.mark.timeout(180)
def test_stock_daemonic_dask_workers_bound_each_item_in_a_subprocess_child():
    """LocalCluster's worker processes are daemonic, as `dask worker` starts them."""
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=1, threads_per_worker=1, dashboard_address=":0") as daemonic:
        with Client(daemonic.scheduler_address) as client:
            assert all(client.run(lambda: multiprocessing.current_process().daemon).values())
        # The hanging item is stopped by the limit (its reason says so), not by the test's
        # timeout, which bounds the whole test.
        result = map_on_dask_with_time_limit(
            square_or_hang, [12, 13, 14], daemonic.scheduler_address, LIMIT
        )
        assert result[0] == 144 and result[2] == 196
        assert result[1].startswith(f"stopped 13: took longer than {LIMIT_SECONDS:g} s")
        # Without a time limit nothing needs a child process.
        assert map_on_dask(square_or_hang, [2, 3], daemonic.scheduler_address) == [4, 9]


def write_sources(folder: Path, count: int) -> list[Path]:
    folder.mkdir(parents=True)
    sources = []
    for index in range(count):
        rng = np.random.default_rng(index)
        pixels = to_uint8(render_radiograph(rng, 300 + 20 * index, 260, "frontal").pixels)
        path = folder / f"view{index}.jpg"
        Image.fromarray(pixels).save(path, quality=90)
        sources.append(path)
    # A FIFO named like an image (opening it would wait for a writer) and a corrupt file.
    fifo = folder / "fifo.jpg"
    os.mkfifo(fifo)
    corrupt = folder / "corrupt.jpg"
    corrupt.write_bytes(sources[0].read_bytes()[:300])
    return [*sources[:2], fifo, *sources[2:4], corrupt, *sources[4:]]


def image_jobs(sources: list[Path], output: Path) -> list[ImageJob]:
    return [
        ImageJob(
            image_id=source.stem,
            source_file=source,
            union_mask_file=None,
            output_root=output,
            image_relative=layout.resized_image("p", source.stem),
            mask_relative=None,
            size=64,
            resize="letterbox",
            row=row,
            source_root=source.parent,
        )
        for row, source in enumerate(sources)
    ]


@pytest.mark.timeout(300)
def test_images_on_dask_equal_the_local_pool_on_daemonic_and_threaded_workers(
    scheduler, tmp_path, monkeypatch
):
    """Rows (error rows included) and packed bytes as on the local pool, on in-process
    worker threads and on stock daemonic worker processes alike."""
    from distributed import LocalCluster

    sources = write_sources(tmp_path / "sources", 6)
    limit = TimeLimit(60.0, image_job_stopped)

    def build(place: str, executor: cluster.Executor) -> tuple[list, np.ndarray]:
        output = tmp_path / place
        packed = output / layout.packed_images("p")
        jobs = image_jobs(sources, output)
        rows = build_packed_images(jobs, packed, 64, executor, time_limit=limit)
        assert not [p for p in output.rglob("*") if TEMP_MARKER in p.name]
        return [(r.image_id, r.status, r.error, r.source_sha256) for r in rows], np.load(packed)

    local_rows, local_pixels = build("local", LocalPool(2))
    errors = {image_id: error for image_id, status, error, _ in local_rows if status == "error"}
    assert set(errors) == {"fifo", "corrupt"}
    assert "named pipe (FIFO), not a regular file; it was not opened" in errors["fifo"]
    with LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=":0") as daemonic:
        for place, address in (("threads", scheduler), ("daemonic", daemonic.scheduler_address)):
            rows, pixels = build(place, DaskCluster(address))
            assert rows == local_rows, place
            np.testing.assert_array_equal(pixels, local_pixels, err_msg=place)
    assert not local_pixels[2].any() and local_pixels[3].any()
