"""The Dask backend against a real in-process scheduler: order, errors, progress, no hang."""

from __future__ import annotations

import pytest

from radharmony_pipeline.processing import cluster
from radharmony_pipeline.processing.cluster import map_on_dask, map_per_image


def square(value: int) -> int:
    if value == 13:
        raise ValueError("image 13: cannot decode")
    return value * value


@pytest.fixture(scope="module")
def scheduler():
    from distributed import LocalCluster

    with LocalCluster(
        n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None
    ) as local:
        yield local.scheduler_address


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
        LocalCluster(n_workers=0, processes=False, dashboard_address=None) as empty,
        pytest.raises(RuntimeError, match="has no workers"),
    ):
        map_on_dask(square, [1, 2, 3], empty.scheduler_address)
