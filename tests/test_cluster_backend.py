"""The Dask backend against a real in-process scheduler: order, errors, progress, no hang."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
from PIL import Image

from radharmony_pipeline.processing import cluster
from radharmony_pipeline.processing.cluster import map_on_dask, map_per_image
from radharmony_pipeline.processing.image_jobs import (
    ImageJob,
    build_packed_images,
    image_job_stopped,
)
from radharmony_pipeline.processing.supervised import TimeLimit
from radharmony_pipeline.synthetic.radiograph import render_radiograph, to_uint8

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
    map_per_image(square, [1, 2], workers=1)
    assert calls and calls[0][2] == scheduler
    monkeypatch.delenv(cluster.SCHEDULER_VARIABLE)
    assert map_per_image(square, [1, 2, 3], workers=1) == [1, 4, 9]
    assert len(calls) == 1


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


def test_a_stuck_item_on_dask_becomes_its_timeout_result(scheduler):
    start = time.monotonic()
    result = map_on_dask(square_or_hang, list(range(20)), scheduler, chunk_size=4, time_limit=LIMIT)
    assert time.monotonic() - start < 60
    assert result[13].startswith(f"stopped 13: took longer than {LIMIT_SECONDS:g} s")
    assert result[:13] + result[14:] == [v * v for v in range(20) if v != 13]


def test_each_dask_thread_keeps_one_supervised_process_across_chunks(scheduler):
    first = map_on_dask(child_pid, list(range(12)), scheduler, chunk_size=1, time_limit=LIMIT)
    second = map_on_dask(child_pid, list(range(12)), scheduler, chunk_size=1, time_limit=LIMIT)
    pids = set(first) | set(second)
    # Two worker threads: at most two processes for 24 one-item chunks, none of them ours.
    assert 1 <= len(pids) <= 2 and os.getpid() not in pids
    assert all(psutil.pid_exists(pid) for pid in pids)
    cluster.close_thread_pools()
    assert not any(psutil.pid_exists(pid) for pid in pids)


def test_daemonic_dask_workers_are_refused_with_the_fix():
    import dask
    from distributed import LocalCluster

    with LocalCluster(n_workers=1, threads_per_worker=1, dashboard_address=":0") as daemonic:
        with pytest.raises(RuntimeError, match=cluster.DAEMON_SETTING):
            map_on_dask(square_or_hang, [1, 2], daemonic.scheduler_address, time_limit=LIMIT)
        # Without a time limit nothing needs a child process.
        assert map_on_dask(square_or_hang, [2, 3], daemonic.scheduler_address) == [4, 9]
    with (
        dask.config.set({"distributed.worker.daemon": False}),
        LocalCluster(n_workers=1, threads_per_worker=1, dashboard_address=":0") as allowed,
    ):
        result = map_on_dask(square_or_hang, [12, 13], allowed.scheduler_address, time_limit=LIMIT)
        assert result[0] == 144 and result[1].startswith("stopped 13")


def write_sources(folder: Path, count: int) -> list[Path]:
    folder.mkdir(parents=True)
    sources = []
    for index in range(count):
        rng = np.random.default_rng(index)
        pixels = to_uint8(render_radiograph(rng, 300 + 20 * index, 260, "frontal").pixels)
        path = folder / f"view{index}.jpg"
        Image.fromarray(pixels).save(path, quality=90)
        sources.append(path)
    # A FIFO named like an image: opening it waits for a writer that never comes.
    stuck = folder / "stuck.jpg"
    os.mkfifo(stuck)
    return [*sources[:2], stuck, *sources[2:]]


def image_jobs(sources: list[Path], output: Path) -> list[ImageJob]:
    return [
        ImageJob(
            image_id=source.stem,
            source_file=source,
            union_mask_file=None,
            output_root=output,
            image_relative=f"images/p/{source.stem}.png",
            mask_relative=None,
            size=64,
            resize="letterbox",
            row=row,
            source_root=source.parent,
        )
        for row, source in enumerate(sources)
    ]


def test_a_stuck_image_on_dask_is_an_error_row_like_on_the_local_pool(
    scheduler, tmp_path, monkeypatch
):
    sources = write_sources(tmp_path / "sources", 5)
    limit = TimeLimit(LIMIT_SECONDS, image_job_stopped)
    outputs = {}
    for place in ("local", "dask"):
        if place == "dask":
            monkeypatch.setenv(cluster.SCHEDULER_VARIABLE, scheduler)
        output = tmp_path / place
        packed = output / "images" / "p.npy"
        rows = build_packed_images(image_jobs(sources, output), packed, 64, 2, time_limit=limit)
        outputs[place] = rows, np.load(packed)

    (local_rows, local_pixels), (dask_rows, dask_pixels) = outputs["local"], outputs["dask"]
    stuck = [row for row in dask_rows if row.status == "error"]
    assert [row.image_id for row in stuck] == ["stuck"]
    assert f"took longer than {LIMIT_SECONDS:g} s" in stuck[0].error
    assert [(r.image_id, r.status, r.error, r.source_sha256) for r in dask_rows] == [
        (r.image_id, r.status, r.error, r.source_sha256) for r in local_rows
    ]
    np.testing.assert_array_equal(dask_pixels, local_pixels)
    assert not dask_pixels[2].any() and dask_pixels[3].any()
