"""The services failing under a run: a Dask worker killed while it holds chunks, the Dask
scheduler killed, and the PostgreSQL server of the Dagster instance restarted mid-run. Each
ends in outputs equal to a fault-free run's (after a re-run where the fault stops the step),
no visible temporaries, and a clear message on the failing path, within a bounded time.

Select with `pytest -m cluster`.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from cluster_services import Services, start_dask
from PIL import Image

from radharmony_pipeline.defs.assets.images import _remove_interrupted_writes
from radharmony_pipeline.processing import cluster
from radharmony_pipeline.processing.atomic import TEMP_MARKER, writer_is_gone
from radharmony_pipeline.processing.image_jobs import (
    ImageJob,
    build_packed_images,
    image_job_stopped,
)
from radharmony_pipeline.processing.supervised import TimeLimit
from radharmony_pipeline.synthetic.radiograph import render_radiograph, to_uint8

pytestmark = pytest.mark.cluster

SIZE = 64
IMAGES = 30
# Loaded by the Dask workers and their children (PYTHONPATH): every image takes 0.3 s more,
# so that a kill lands while chunks are being processed.
SLOW = """
import os, time
if os.environ.get("SLOW_IMAGES"):
    from radharmony_pipeline.processing import image_jobs

    def slowed(method):
        def run(self, *args, **kwargs):
            time.sleep(0.3)
            return method(self, *args, **kwargs)
        return run

    image_jobs.ImageJob._process = slowed(image_jobs.ImageJob._process)
"""


LIMIT = TimeLimit(120.0, image_job_stopped)


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> list[Path]:
    folder = tmp_path_factory.mktemp("sources")
    paths = []
    for index in range(IMAGES):
        rng = np.random.default_rng(index)
        pixels = to_uint8(render_radiograph(rng, 200 + 7 * index, 180, "frontal").pixels)
        path = folder / f"view{index}.jpg"
        Image.fromarray(pixels).save(path, quality=90)
        paths.append(path)
    (folder / "broken.jpg").write_bytes(paths[0].read_bytes()[:200])
    return [*paths[:5], folder / "broken.jpg", *paths[5:]]


def jobs_for(sources: list[Path], output: Path) -> list[ImageJob]:
    return [
        ImageJob(
            image_id=source.stem,
            source_file=source,
            union_mask_file=None,
            output_root=output,
            image_relative=f"images/p/{source.stem}.png",
            mask_relative=None,
            size=SIZE,
            resize="letterbox",
            row=row,
            source_root=source.parent,
        )
        for row, source in enumerate(sources)
    ]


def build(sources: list[Path], output: Path) -> tuple[list[tuple], np.ndarray, dict]:
    packed = output / "images" / "p.npy"
    rows = build_packed_images(jobs_for(sources, output), packed, SIZE, 2, time_limit=LIMIT)
    files = {
        p.relative_to(output).as_posix(): p.read_bytes()
        for p in sorted((output / "images" / "p").glob("*.png"))
    }
    return [(r.image_id, r.status, r.error, r.source_sha256) for r in rows], np.load(packed), files


@pytest.fixture(scope="module")
def reference(sources, tmp_path_factory):
    """The fault-free run on the local pool."""
    return build(sources, tmp_path_factory.mktemp("reference") / "out")


def temporaries(output: Path) -> list[Path]:
    return [p for p in output.rglob("*") if TEMP_MARKER in p.name or ".partial" in p.name]


def wait_without_temporaries(output: Path, seconds: float = 20) -> list[Path]:
    """A killed worker's child may finish (and rename) its current image after the kill."""
    deadline = time.monotonic() + seconds
    while temporaries(output) and time.monotonic() < deadline:
        time.sleep(0.1)
    return temporaries(output)


@pytest.fixture
def dask_services(tmp_path):
    slow = tmp_path / "slow"
    slow.mkdir()
    (slow / "sitecustomize.py").write_text(SLOW)
    services = Services()
    path = os.pathsep.join([str(slow), os.environ.get("PYTHONPATH", "")])
    try:
        start_dask(
            services,
            tmp_path,
            workers=2,
            extra_environment={"PYTHONPATH": path, "SLOW_IMAGES": "1"},
        )
        yield services
    finally:
        services.stop()


def worker_pids(services: Services) -> dict[str, int]:
    """Worker address -> pid of its worker process (the nanny's child)."""
    from distributed import Client

    with Client(services.scheduler, timeout=30) as client:
        return client.run(os.getpid)


def run_in_thread(target) -> tuple[threading.Thread, dict]:
    outcome: dict = {}

    def body() -> None:
        try:
            outcome["result"] = target()
        except BaseException as error:
            outcome["error"] = error

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    return thread, outcome


def wait_for_written_images(output: Path, count: int, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if len(list((output / "images" / "p").glob("view*.png"))) >= count:
            return
        time.sleep(0.05)
    pytest.fail(f"fewer than {count} images written after {seconds} s")


@pytest.mark.timeout(400)
def test_a_worker_killed_while_holding_chunks_changes_nothing(
    dask_services, sources, reference, tmp_path, monkeypatch
):
    monkeypatch.setenv(cluster.SCHEDULER_VARIABLE, dask_services.scheduler)
    output = tmp_path / "out"
    pids = worker_pids(dask_services)
    assert len(pids) == 2
    started = time.monotonic()
    thread, outcome = run_in_thread(lambda: build(sources, output))
    wait_for_written_images(output, 4)
    # Lose the first worker for good: its nanny first (so nothing restarts it), then it.
    victim_address = sorted(pids)[0]
    nanny = dask_services.processes[1]
    os.kill(nanny.pid, signal.SIGKILL)
    os.kill(pids[victim_address], signal.SIGKILL)
    thread.join(timeout=300)
    assert not thread.is_alive(), "the build did not finish after a worker was lost"
    assert time.monotonic() - started < 300
    assert "error" not in outcome, outcome.get("error")
    rows, pixels, files = outcome["result"]
    reference_rows, reference_pixels, reference_files = reference
    ids = [row[0] for row in rows]
    assert len(ids) == len(set(ids)) == len(reference_rows)  # no duplicate, none missing
    assert rows == reference_rows
    np.testing.assert_array_equal(pixels, reference_pixels)
    assert files == reference_files
    assert wait_without_temporaries(output) == []


@pytest.mark.timeout(300)
def test_killing_the_scheduler_fails_the_step_clearly_and_a_rerun_converges(
    dask_services, sources, reference, tmp_path, monkeypatch
):
    monkeypatch.setenv(cluster.SCHEDULER_VARIABLE, dask_services.scheduler)
    output = tmp_path / "out"
    thread, outcome = run_in_thread(lambda: build(sources, output))
    wait_for_written_images(output, 2)
    killed_at = time.monotonic()
    os.kill(dask_services.processes[0].pid, signal.SIGKILL)
    thread.join(timeout=120)
    assert not thread.is_alive(), "the step hangs after the scheduler was killed"
    assert time.monotonic() - killed_at < 120
    error = outcome.get("error")
    assert isinstance(error, RuntimeError), outcome
    assert "lost the Dask scheduler" in str(error)
    assert dask_services.scheduler in str(error) and "re-run" in str(error)
    assert not (output / "images" / "p.npy").exists()  # nothing published half-built

    # As the message says: the cluster is restarted (here: stopped), then the step re-run.
    # Workers finish the chunk they held when the scheduler died, so a shard may appear
    # after the failure; its writer is gone now, and the re-run's clean-up removes it.
    dask_services.stop()
    deadline = time.monotonic() + 60  # a worker process exits shortly after its nanny
    while not all(writer_is_gone(p) for p in temporaries(output)):
        assert time.monotonic() < deadline, temporaries(output)
        time.sleep(0.2)
    monkeypatch.delenv(cluster.SCHEDULER_VARIABLE)
    _remove_interrupted_writes(output / "images" / "p", output / "images" / "p.npy")
    rows, pixels, files = build(sources, output)
    assert rows == reference[0]
    np.testing.assert_array_equal(pixels, reference[1])
    assert files == reference[2]
    assert temporaries(output) == []
