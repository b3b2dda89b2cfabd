"""The services failing under a run: a Dask worker killed while it holds chunks, the Dask
scheduler killed, the PostgreSQL server of the Dagster instance restarted mid-run, and the
disk-backed S3 server of the output root killed and restarted mid-run. Each ends in outputs
equal to a fault-free run's (after a re-run where the fault stops the step), no visible
temporaries, and a clear message on the failing path, within a bounded time.

Select with `pytest -m cluster`.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd
import psutil
import pytest
from cluster_services import (
    AWS_ENVIRONMENT,
    BUCKET,
    Services,
    pg_connect,
    restart_postgres,
    restart_s3_server,
    s3,
    s3_requests,
    start_dask,
    start_postgres,
    start_s3_server,
)
from deadline import within
from fault_support import build as build_stages
from PIL import Image

from radharmony_pipeline.defs.assets.images import _remove_interrupted_writes
from radharmony_pipeline.defs.run_settings import RunSettingsResource
from radharmony_pipeline.processing.execution import cluster
from radharmony_pipeline.processing.execution.supervised import TimeLimit
from radharmony_pipeline.processing.jobs.image_jobs import (
    ImageJob,
    build_packed_images,
    image_job_stopped,
)
from radharmony_pipeline.processing.storage import output_layout as layout
from radharmony_pipeline.processing.storage.atomic import TEMP_MARKER, writer_is_gone
from radharmony_pipeline.synthetic.radiograph import render_radiograph, to_uint8

pytestmark = pytest.mark.cluster

SIZE = 64
IMAGES = 30
# Loaded by the Dask workers and their children (PYTHONPATH): every image takes 0.3 s more,
# so that a kill lands while chunks are being processed.
SLOW = """
import os, time
if os.environ.get("SLOW_IMAGES"):
    from radharmony_pipeline.processing.jobs import image_jobs

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
            image_relative=layout.resized_image("p", source.stem),
            mask_relative=None,
            size=SIZE,
            resize="letterbox",
            row=row,
            source_root=source.parent,
        )
        for row, source in enumerate(sources)
    ]


def build(sources: list[Path], output: Path) -> tuple[list[tuple], np.ndarray, dict]:
    packed = output / layout.packed_images("p")
    # Where the asset would run it: the scheduler variable (set per test) or 2 local workers.
    executor = RunSettingsResource(workers=2).executor()
    rows = build_packed_images(jobs_for(sources, output), packed, SIZE, executor, time_limit=LIMIT)
    files = {
        p.relative_to(output).as_posix(): p.read_bytes()
        for p in sorted(output.glob(layout.resized_png_glob("p")))
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
        written = [p for p in output.glob(layout.resized_png_glob("p")) if p.name[:4] == "view"]
        if len(written) >= count:
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
    with within(300, "the build that loses a worker"):
        thread, outcome = run_in_thread(lambda: build(sources, output))
        wait_for_written_images(output, 4)
        # Lose the first worker for good: its nanny first (so nothing restarts it), then it.
        victim_address = sorted(pids)[0]
        nanny = dask_services.processes[1]
        os.kill(nanny.pid, signal.SIGKILL)
        os.kill(pids[victim_address], signal.SIGKILL)
        thread.join()
    assert "error" not in outcome, outcome.get("error")
    rows, pixels, files = outcome["result"]
    reference_rows, reference_pixels, reference_files = reference
    ids = [row[0] for row in rows]
    assert len(ids) == len(set(ids)) == len(reference_rows)  # no duplicate, none missing
    assert rows == reference_rows
    np.testing.assert_array_equal(pixels, reference_pixels)
    assert files == reference_files
    assert wait_without_temporaries(output) == []


@pytest.mark.timeout(600)
def test_killing_the_scheduler_fails_the_step_clearly_and_a_rerun_converges(
    dask_services, sources, reference, tmp_path, monkeypatch
):
    monkeypatch.setenv(cluster.SCHEDULER_VARIABLE, dask_services.scheduler)
    output = tmp_path / "out"
    workers = list(worker_pids(dask_services).values())
    thread, outcome = run_in_thread(lambda: build(sources, output))
    wait_for_written_images(output, 2)
    os.kill(dask_services.processes[0].pid, signal.SIGKILL)
    with within(120, "the step after its scheduler was killed"):
        thread.join()
    error = outcome.get("error")
    assert isinstance(error, RuntimeError), outcome
    assert "lost the Dask scheduler" in str(error)
    assert dask_services.scheduler in str(error) and "re-run" in str(error)
    assert not (output / layout.packed_images("p")).exists()  # nothing published half-built

    # As the message says: the cluster is restarted (here: stopped), then the step re-run,
    # here in the same process as the failed one. Workers finish the chunk they held when
    # the scheduler died, so a shard (named after this process) may appear after the
    # failure; the failed step released those names, so the re-run's clean-up removes it.
    dask_services.stop()
    # A worker process exits after its nanny once its current chunk is done: on a busy
    # machine (the suite runs on two processes) that chunk can take a minute or more.
    deadline = time.monotonic() + 240
    while any(psutil.pid_exists(pid) for pid in workers):
        assert time.monotonic() < deadline, f"Dask worker processes {workers} still running"
        time.sleep(0.2)
    assert all(writer_is_gone(p) for p in temporaries(output)), temporaries(output)
    monkeypatch.delenv(cluster.SCHEDULER_VARIABLE)
    _remove_interrupted_writes(
        output / layout.resized_image_folder("p"), output / layout.packed_images("p")
    )
    rows, pixels, files = build(sources, output)
    assert rows == reference[0]
    np.testing.assert_array_equal(pixels, reference[1])
    assert files == reference[2]
    assert temporaries(output) == []


# --- the instance's PostgreSQL restarted during a run --------------------------------------

PARTITION = "chestx_det.test"
STAGES = "raw_index,labels,masks,bboxes,images"
REPO = Path(__file__).resolve().parents[1]
DAGSTER = str(Path(sys.executable).with_name("dagster"))


@pytest.fixture
def postgres(tmp_path):
    services = Services()
    try:
        start_postgres(services, tmp_path)
        yield services
    finally:
        services.stop()


def materialize_command() -> list[str]:
    return [
        *(DAGSTER, "asset", "materialize", "-m", "radharmony_pipeline.definitions"),
        *("--select", STAGES, "--partition", PARTITION),
    ]


def run_statuses(services: Services) -> dict[str, str]:
    connection = pg_connect(services)
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT run_id, status FROM runs")
            return dict(cursor.fetchall())
    finally:
        connection.close()


def slot_holders(services: Services) -> list[str]:
    connection = pg_connect(services)
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT DISTINCT run_id FROM concurrency_slots WHERE run_id IS NOT NULL")
            held = [row[0] for row in cursor.fetchall()]
            cursor.execute("SELECT DISTINCT run_id FROM pending_steps")
            return held + [row[0] for row in cursor.fetchall()]
    finally:
        connection.close()


def stage_outputs(output: Path) -> dict[str, object]:
    """Every file the five stages wrote for the partition, tables as frames (previews and
    observations, such as the checks' kept suite reports, are not the stages' outputs)."""
    found = {}
    for path in sorted(output.rglob("*")):
        name = path.relative_to(output).as_posix()
        if not path.is_file() or PARTITION not in name:
            continue
        if name.startswith((f"{layout.PREVIEWS}/", f"{layout.OBSERVATIONS}/")):
            continue
        if path.suffix == ".parquet" and name.split("/")[1] in STAGES.split(","):
            found[name] = pd.read_parquet(path)
        elif path.suffix in (".png", ".npy", ".json"):
            found[name] = path.read_bytes()
    return found


def assert_same_stage_outputs(found: dict, expected: dict) -> None:
    assert sorted(found) == sorted(expected)
    for name, value in expected.items():
        if isinstance(value, pd.DataFrame):
            pd.testing.assert_frame_equal(found[name], value, obj=name)
        else:
            assert found[name] == value, name


@pytest.mark.timeout(900)
@pytest.mark.parametrize("down_seconds", [1.0, 75.0], ids=["brief", "beyond-retries"])
def test_a_postgres_restart_during_a_run_leaves_the_instance_consistent(
    postgres, down_seconds, tiny_root, tmp_path
):
    reference = tmp_path / "reference"
    assert build_stages(tiny_root, reference, PARTITION).success
    home = tmp_path / "home"
    home.mkdir()
    shutil.copy(REPO / "deploy" / "dagster.postgres.yaml", home / "dagster.yaml")
    slow = tmp_path / "slow"
    slow.mkdir()
    (slow / "sitecustomize.py").write_text(SLOW)
    output = tmp_path / "out"
    environment = {
        **os.environ,
        **postgres.environment(),
        "RADHARMONY_DASK_SCHEDULER": "",
        "DAGSTER_HOME": str(home),
        "RADHARMONY_DATA_ROOT": str(tiny_root),
        "RADHARMONY_OUTPUT_ROOT": str(output),
        "RADHARMONY_WORKERS": "1",
        "PYTHONPATH": os.pathsep.join([str(slow), str(REPO)]),
    }
    log = tmp_path / "first.log"
    with open(log, "wb") as handle:
        first = subprocess.Popen(
            materialize_command(),
            env={**environment, "SLOW_IMAGES": "1"},
            stdout=handle,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 300
        while not list(output.glob(layout.resized_png_glob(PARTITION))):
            assert first.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "images never started"
            time.sleep(0.05)
        restart_postgres(postgres, tmp_path, down_seconds)
        first.wait(timeout=300)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    # Finished, or failed with the database named; a worker that could not even record its
    # failure (the database gone for good) ended, and the next run marks it failed.
    ((first_run, status),) = run_statuses(postgres).items()
    assert (first.returncode == 0) == (status == "SUCCESS"), (status, log.read_text()[-3000:])
    if first.returncode != 0:
        assert "OperationalError" in log.read_text()

    second = subprocess.run(
        materialize_command(),
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert second.returncode == 0, (second.stdout + second.stderr)[-4000:]
    statuses = run_statuses(postgres)
    assert statuses[first_run] in ("SUCCESS", "FAILURE")
    assert "STARTED" not in statuses.values()
    assert list(statuses.values()).count("SUCCESS") >= 1
    assert slot_holders(postgres) == []
    assert temporaries(output) == []
    assert_same_stage_outputs(stage_outputs(output), stage_outputs(reference))


# --- the output root's S3 server killed and restarted during a run -------------------------


@pytest.mark.timeout(900)
@pytest.mark.usefixtures("fresh_s3_clients")
def test_an_s3_server_restarted_during_a_run_is_retried_and_nothing_half_written_shows(
    tiny_root, tmp_path
):
    """The run's `images` step is writing PNGs to the bucket when the server is killed (an
    upload in flight is cut) and comes back 2 s later on the same port and disk: the requests
    that failed are retried, the run succeeds, and the bucket holds exactly a local run's
    files, none of them half written and no temporary key."""
    reference = tmp_path / "reference"
    assert build_stages(tiny_root, reference, PARTITION).success
    services = Services()
    slow = tmp_path / "slow"
    slow.mkdir()
    (slow / "sitecustomize.py").write_text(SLOW)
    home = tmp_path / "home"
    home.mkdir()
    log = tmp_path / "run.log"
    try:
        start_s3_server(services, tmp_path)
        environment = {
            **os.environ,
            **AWS_ENVIRONMENT,
            "AWS_ENDPOINT_URL": services.s3_endpoint,
            "RADHARMONY_DASK_SCHEDULER": "",
            "DAGSTER_HOME": str(home),
            "RADHARMONY_DATA_ROOT": str(tiny_root),
            "RADHARMONY_OUTPUT_ROOT": f"s3://{BUCKET}/restarted",
            "RADHARMONY_WORKERS": "1",
            "PYTHONPATH": os.pathsep.join([str(slow), str(REPO)]),
            "SLOW_IMAGES": "1",
        }
        images = f"{BUCKET}/restarted/{layout.resized_image_folder(PARTITION)}"
        with open(log, "wb") as handle:
            run = subprocess.Popen(
                materialize_command(), env=environment, stdout=handle, stderr=subprocess.STDOUT
            )
        try:
            deadline = time.monotonic() + 300
            while not s3(services).find(images):
                assert run.poll() is None, log.read_text()[-3000:]
                assert time.monotonic() < deadline, "images never started"
                time.sleep(0.05)
            assert run.poll() is None, "the run ended before the server was killed"
            restart_s3_server(services, tmp_path, down_seconds=2.0)
            run.wait(timeout=300)
        finally:
            if run.poll() is None:
                run.kill()
                run.wait()
        assert run.returncode == 0, log.read_text()[-4000:]
        # The restarted server counts from zero: the run went on writing images to it.
        assert s3_requests(services)["requests"].get("PUT", 0) > 0
        downloaded = tmp_path / "downloaded"
        s3(services).get(f"{BUCKET}/restarted/", f"{downloaded}/", recursive=True)
    finally:
        services.stop()
    assert temporaries(downloaded) == []
    assert_same_stage_outputs(stage_outputs(downloaded), stage_outputs(reference))
