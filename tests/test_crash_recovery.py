"""kill -9 / SIGTERM of a run during masks and images, started by the `radharmony` CLI, by
`dagster asset materialize`, by the webserver (GraphQL, as the UI's launchpad) or by the
daemon's run queue, then the same command or launch on the same DAGSTER_HOME: the dead run's
pool slot is freed by the next run itself and the outputs are byte-identical.

The per-image work is slowed down by a `sitecustomize` module on PYTHONPATH (loaded by the CLI
and by its worker processes alike), so that the kill lands while the stage is writing.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from unittest import mock

import dagster as dg
import psutil
import pytest
from dagster_graphql import DagsterGraphQLClient
from e2e_support import INSTANCE_YAML, REPOSITORY_NAME, DagsterDev, free_port
from fault_support import output_files

from radharmony_pipeline.defs.jobs import ALL_STAGES_JOB
from radharmony_pipeline.operations.recovery import WORKER_TAG, RunWorker
from radharmony_pipeline.processing.storage import output_layout as layout
from radharmony_pipeline.processing.storage.atomic import TEMP_MARKER

PARTITION = "chestx_det.test"  # has masks, boxes and images
REPO = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "radharmony_pipeline.cli"]
SLOW = """
import os, time
stage = os.environ.get("SLOW_STAGE")
if stage:
    from radharmony_pipeline.processing.jobs import image_jobs
    from radharmony_pipeline.processing.jobs import mask_jobs

    def slowed(method):
        def run(self, *args, **kwargs):
            time.sleep(0.4)
            return method(self, *args, **kwargs)
        return run

    if stage == "masks":
        mask_jobs.PolygonMaskJob.run = slowed(mask_jobs.PolygonMaskJob.run)
    else:
        image_jobs.ImageJob._process = slowed(image_jobs.ImageJob._process)
"""
STAGE_FOLDER = {"masks": layout.mask_folder, "images": layout.resized_image_folder}
# For a run launched by a server: every image waits while the file HOLD_IMAGES names exists
# (and says so once, beside it), so that the kill lands inside `images` whatever the load.
HOLD = """
import os, time
from pathlib import Path
hold = os.environ.get("HOLD_IMAGES")
if hold:
    from radharmony_pipeline.processing.jobs import image_jobs

    def held(method):
        def run(self, *args, **kwargs):
            Path(hold + ".reached").touch()
            deadline = time.monotonic() + 600
            while Path(hold).exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            return method(self, *args, **kwargs)
        return run

    image_jobs.ImageJob._process = held(image_jobs.ImageJob._process)
"""


def environment(tmp_path: Path, home: Path, output: Path, slow_stage: str | None) -> dict:
    slow = tmp_path / "slow"
    slow.mkdir(exist_ok=True)
    (slow / "sitecustomize.py").write_text(SLOW)
    environ = {
        **os.environ,
        "DAGSTER_HOME": str(home),
        "RADHARMONY_OUTPUT_ROOT": str(output),
        "RADHARMONY_WORKERS": "1",
        "PYTHONPATH": os.pathsep.join([str(slow), str(REPO)]),
    }
    environ.pop("SLOW_STAGE", None)
    if slow_stage:
        environ["SLOW_STAGE"] = slow_stage
    return environ


def new_home(path: Path) -> Path:
    path.mkdir()
    shutil.copy(REPO / "dagster_home" / "dagster.yaml", path / "dagster.yaml")
    return path


def command(data_root: Path) -> list[str]:
    return [*CLI, "demo", "--data-root", str(data_root), "--partition", PARTITION]


# The README's real-data command: no `radharmony` code runs before the run itself.
DAGSTER = str(Path(sys.executable).with_name("dagster"))
STAGES = "raw_index,labels,masks,bboxes,images"


def dagster_command(_data_root: Path) -> list[str]:
    return [
        *(DAGSTER, "asset", "materialize", "-m", "radharmony_pipeline.definitions"),
        *("--select", STAGES, "--partition", PARTITION),
    ]


def run_to_end(
    data_root: Path, environ: dict, timeout: float = 300, how=command
) -> subprocess.CompletedProcess:
    return subprocess.run(
        how(data_root), env=environ, capture_output=True, text=True, timeout=timeout
    )


def start_and_wait_for_stage(data_root: Path, environ: dict, output: Path, stage: str, how=command):
    """Start the command and return it once the stage has written its first file."""
    process = subprocess.Popen(
        how(data_root),
        env=environ,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    folder = output / STAGE_FOLDER[stage](PARTITION)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if folder.is_dir() and any(p.suffix == ".png" for p in folder.rglob("*")):
            return process
        if process.poll() is not None:
            pytest.fail(f"the CLI ended before {stage} started: {process.stderr.read()}")
        time.sleep(0.05)
    process.kill()
    pytest.fail(f"{stage} never started")


# Not stage outputs: contact sheets, and the source listings each observation keeps (they
# hold the observed files' mtimes, which differ between the two data copies).
NOT_COMPARED = (layout.PREVIEWS, layout.OBSERVATIONS)


def outputs_of(output: Path) -> dict[str, bytes]:
    """Every compared output's bytes (fault_support.output_files)."""
    return {
        name: content
        for name, content in output_files(output).items()
        if not set(NOT_COMPARED) & set(Path(name).parts)
    }


def temporaries(output: Path) -> list[Path]:
    return [p for p in output.rglob("*") if TEMP_MARKER in p.name]


def wait_for_orphans(output: Path, seconds: float = 10) -> None:
    """A killed CLI's worker may finish its current image (and rename its file) after the
    kill; such a writer is alive, so its temporary file is legitimately there until then."""
    deadline = time.monotonic() + seconds
    while temporaries(output) and time.monotonic() < deadline:
        time.sleep(0.1)


def runs_holding_the_pool(home: Path) -> list[str]:
    """Runs the instance lists as holding or waiting for a pool slot."""
    with (
        mock.patch.dict(os.environ, {"DAGSTER_HOME": str(home)}),
        dg.DagsterInstance.get() as instance,
    ):
        return sorted(instance.event_log_storage.get_concurrency_run_ids())


@pytest.fixture(scope="module")
def reference(tiny_root, tmp_path_factory):
    """An uninterrupted run of the same command."""
    tmp = tmp_path_factory.mktemp("reference")
    output = tmp / "out"
    done = run_to_end(tiny_root, environment(tmp, new_home(tmp / "home"), output, None))
    assert done.returncode == 0, done.stdout + done.stderr
    return outputs_of(output)


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("stage", ["masks", "images"])
def test_kill_9_then_same_command_on_same_instance_is_byte_identical(
    stage, tiny_root, tmp_path, reference
):
    home = new_home(tmp_path / "home")
    output = tmp_path / "out"
    process = start_and_wait_for_stage(
        tiny_root, environment(tmp_path, home, output, stage), output, stage
    )
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    # The scenario is real: the dead run still holds the heavy pool's slot.
    assert runs_holding_the_pool(home), "the killed run should still hold its pool slot"

    # The resumed run is bounded by run_to_end's timeout (it raises when the run outlives it).
    done = run_to_end(tiny_root, environment(tmp_path, home, output, None), timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    # Said by the first run of the command (observing the sources): its executor frees them.
    assert "freed the pool slots of run" in done.stdout + done.stderr
    wait_for_orphans(output)
    assert temporaries(output) == []
    resumed = outputs_of(output)
    assert resumed.keys() == reference.keys()
    different = [name for name in reference if resumed[name] != reference[name]]
    assert different == []
    assert runs_holding_the_pool(home) == []


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("stage", ["masks", "images"])
def test_kill_9_of_a_dagster_cli_run_then_the_same_command_frees_the_slot_itself(
    stage, tiny_root, tmp_path, reference
):
    """`dagster asset materialize`, as the README runs real data: nothing of the project's
    CLI runs, so the re-run's own executor must free the dead run's slot."""
    home = new_home(tmp_path / "home")
    output = tmp_path / "out"

    def environ(slow_stage: str | None) -> dict:
        return {
            **environment(tmp_path, home, output, slow_stage),
            "RADHARMONY_DATA_ROOT": str(tiny_root),
        }

    process = start_and_wait_for_stage(
        tiny_root, environ(stage), output, stage, how=dagster_command
    )
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    killed = runs_holding_the_pool(home)
    assert killed, "the killed run should still hold its pool slot"

    done = run_to_end(tiny_root, environ(None), timeout=300, how=dagster_command)
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-4000:]
    assert f"freed the pool slots of run {killed[0][:8]}" in log
    assert "Step blocked by limit" not in log or "freed the pool slots" in log
    wait_for_orphans(output)
    assert temporaries(output) == []
    resumed = outputs_of(output)
    # The five stages' files: the same bytes as the uninterrupted `radharmony demo` wrote.
    assert resumed and all(name in reference for name in resumed), sorted(resumed)
    assert [name for name in resumed if resumed[name] != reference[name]] == []
    stage_files = [
        n
        for n in reference
        if n.startswith((layout.mask_folder(PARTITION), layout.resized_image_folder(PARTITION)))
    ]
    assert stage_files and all(name in resumed for name in stage_files)
    assert runs_holding_the_pool(home) == []
    with (
        mock.patch.dict(os.environ, {"DAGSTER_HOME": str(home)}),
        dg.DagsterInstance.get() as instance,
    ):
        dead = instance.get_run_by_id(killed[0])
        assert dead.status == dg.DagsterRunStatus.FAILURE  # marked, not left STARTED


@pytest.mark.slow
def test_sigterm_stops_the_cli_during_masks_and_a_rerun_completes(tiny_root, tmp_path, reference):
    home = new_home(tmp_path / "home")
    output = tmp_path / "out"
    environ = environment(tmp_path, home, output, "masks")
    process = start_and_wait_for_stage(tiny_root, environ, output, "masks")
    os.kill(process.pid, signal.SIGTERM)
    try:
        code = process.wait(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert code != 0
    wait_for_orphans(output)
    assert temporaries(output) == []
    done = run_to_end(tiny_root, environment(tmp_path, home, output, None), timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    assert outputs_of(output) == reference


@pytest.mark.slow
def test_free_slots_command_reports_when_nothing_is_held(tmp_path):
    home = new_home(tmp_path / "home")
    environ = {**os.environ, "DAGSTER_HOME": str(home)}
    done = subprocess.run(
        [*CLI, "free-slots"], env=environ, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "no run with a dead process holds a pool slot" in done.stdout


def test_a_waiting_run_is_told_who_holds_the_slot_and_dead_holders_are_freed():
    from radharmony_pipeline.operations.recovery import (
        HEAVY_POOL,
        free_slots_of_dead_runs,
        waiting_message,
    )

    overrides = {"concurrency": {"pools": {"default_limit": 1}}}
    with dg.instance_for_test(overrides=overrides) as instance:
        storage = instance.event_log_storage
        storage.initialize_concurrency_limit_to_default(HEAVY_POOL)
        assert storage.claim_concurrency_slot(HEAVY_POOL, "ghost-run", "masks").is_claimed
        assert not storage.claim_concurrency_slot(HEAVY_POOL, "waiting-run", "images").is_claimed
        message = waiting_message(instance, "waiting-run")
        assert message is not None and "heavy_image_work" in message and "ghost-ru" in message
        said = []
        # Neither run exists in the run storage (so no process of theirs can be alive).
        assert free_slots_of_dead_runs(instance, said.append) == ["ghost-run", "waiting-run"]
        assert "freed the pool slots of run ghost-ru" in said[0]
        assert storage.get_concurrency_info(HEAVY_POOL).claimed_slots == []
        assert storage.claim_concurrency_slot(HEAVY_POOL, "next-run", "images").is_claimed


def test_temporary_files_of_a_live_writer_are_never_removed(tmp_path):
    from radharmony_pipeline.processing.storage.atomic import temporary_sibling
    from radharmony_pipeline.processing.storage.store import remove_orphaned_temporaries

    live = temporary_sibling(tmp_path / "a.png")  # named after this (live) process
    live.write_bytes(b"x")
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        name = live.name.replace(f"{TEMP_MARKER}{os.getpid()}@", f"{TEMP_MARKER}{other.pid}@")
        (tmp_path / name.replace(".png", "-b.png")).write_bytes(b"x")
        dead = subprocess.run(
            [sys.executable, "-c", "import os; print(os.getpid())"],
            capture_output=True,
            text=True,
            check=True,
        )
        gone = live.name.replace("@", "@", 1).replace(
            f"{TEMP_MARKER}{os.getpid()}@", f"{TEMP_MARKER}{int(dead.stdout)}@"
        )
        (tmp_path / gone.replace(".png", "-c.png")).write_bytes(b"x")
        legacy = tmp_path / f"{TEMP_MARKER}0123456789abcdef0123456789abcdef-d.png"
        legacy.write_bytes(b"x")
        removed = remove_orphaned_temporaries(tmp_path)
        assert sorted(p.name for p in removed) == sorted(
            [gone.replace(".png", "-c.png"), legacy.name]
        )
        assert live.exists() and (tmp_path / name.replace(".png", "-b.png")).exists()
    finally:
        other.kill()
        other.wait()


def test_a_stopped_image_job_removes_only_its_dead_writers_temporaries(tmp_path):
    from radharmony_pipeline.processing.jobs.image_jobs import ImageJob, image_job_stopped
    from radharmony_pipeline.processing.storage.atomic import temporary_sibling

    image_relative = layout.resized_image("p", "x[1]")
    folder = (tmp_path / image_relative).parent
    folder.mkdir(parents=True)
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )

    def temporary(name: str, pid: int) -> Path:
        mine = temporary_sibling(folder / name)  # named after this (live) process
        owner = f"{TEMP_MARKER}{pid}@"
        path = mine.with_name(mine.name.replace(f"{TEMP_MARKER}{os.getpid()}@", owner))
        path.write_bytes(b"half")
        return path

    left_by_stopped = [
        temporary("x[1].png", int(dead.stdout)),
        temporary("x[1]-mask.png", int(dead.stdout)),
    ]
    kept = [temporary("x[1].png", os.getpid()), temporary("y.png", int(dead.stdout))]
    job = ImageJob(
        image_id="x[1]",
        source_file=tmp_path / "x[1].jpg",
        union_mask_file=None,
        output_root=tmp_path,
        image_relative=image_relative,
        mask_relative=image_relative.removesuffix(".png") + "-mask.png",
        size=32,
        resize="letterbox",
        row=0,
    )
    row, pixels = image_job_stopped(job, "took longer than 1 s (RADHARMONY_JOB_TIMEOUT); stopped")
    assert row.status == "error" and "took longer than 1 s" in row.error and pixels is None
    assert not any(path.exists() for path in left_by_stopped)
    assert all(path.exists() for path in kept)


@pytest.mark.timeout(120)
def test_only_runs_whose_worker_on_this_host_is_gone_are_freed_and_failed():
    from radharmony_pipeline.operations.recovery import (
        HEAVY_POOL,
        WORKER_TAG,
        RunWorker,
        free_slots_of_dead_runs,
    )

    here = RunWorker.this_process()
    ended = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    )
    gone = RunWorker(here.host, here.boot_time, int(ended.stdout), here.started)
    workers = {
        "alive-here": here,
        "dead-here": gone,
        # The same pid, but a process started long after the run: the id was reused.
        "pid-reused": RunWorker(here.host, here.boot_time, here.pid, here.started - 3600),
        "before-reboot": RunWorker(here.host, here.boot_time - 3600, here.pid, here.started),
        "other-host": RunWorker("elsewhere", here.boot_time, int(ended.stdout), here.started),
        "untagged": None,
    }
    overrides = {"concurrency": {"pools": {"default_limit": len(workers)}}}
    with dg.instance_for_test(overrides=overrides) as instance:
        storage = instance.event_log_storage
        storage.initialize_concurrency_limit_to_default(HEAVY_POOL)
        for run_id, worker in workers.items():
            tags = {WORKER_TAG: worker.tag()} if worker else {}
            instance.add_run(
                dg.DagsterRun(
                    job_name="all_stages",
                    run_id=run_id,
                    status=dg.DagsterRunStatus.STARTED,
                    tags=tags,
                )
            )
            assert storage.claim_concurrency_slot(HEAVY_POOL, run_id, "images").is_claimed
        said = []
        freed = free_slots_of_dead_runs(instance, said.append)
        assert sorted(freed) == ["before-reboot", "dead-here", "pid-reused"]
        assert all("process gone" in line for line in said)
        held = {slot.run_id for slot in storage.get_concurrency_info(HEAVY_POOL).claimed_slots}
        assert held == {"alive-here", "other-host", "untagged"}
        statuses = {run_id: instance.get_run_by_id(run_id).status for run_id in workers}
        assert {r for r, s in statuses.items() if s == dg.DagsterRunStatus.FAILURE} == set(freed)


def test_a_temporary_this_process_released_is_an_orphan_here_too(tmp_path):
    """A Dask shard is named after the step's process; once a failed step released it, a
    worker's late copy is removed by the next clean-up, also one in the same process."""
    from radharmony_pipeline.processing.storage.atomic import (
        release_temporaries,
        temporary_sibling,
    )
    from radharmony_pipeline.processing.storage.store import remove_orphaned_temporaries

    released = temporary_sibling(tmp_path / "shard0-p.npy")
    held = temporary_sibling(tmp_path / "shard1-p.npy")
    release_temporaries([released])
    released.write_bytes(b"late")
    held.write_bytes(b"in use")
    assert remove_orphaned_temporaries(tmp_path) == [released]
    assert not released.exists() and held.exists()


# --- kill -9 of a run launched from the UI, and of one the daemon launched --------------------

# The webserver alone launches a submitted run itself; the project's instance queues runs
# (`concurrency.runs`), so under `dagster dev` the daemon's run queue launches it.
WEBSERVER_ONLY_INSTANCE = (
    INSTANCE_YAML
    + """\
run_coordinator:
  module: dagster.core.run_coordinator
  class: DefaultRunCoordinator
"""
)
LAUNCHERS = {
    "webserver": (("dagster-webserver",), WEBSERVER_ONLY_INSTANCE),
    "daemon-run-queue": (("dagster", "dev"), None),
}


def run_worker_pid(home: Path, run_id: str) -> int | None:
    with (
        mock.patch.dict(os.environ, {"DAGSTER_HOME": str(home)}),
        dg.DagsterInstance.get() as instance,
    ):
        run = instance.get_run_by_id(run_id)
        worker = RunWorker.from_tag(run.tags.get(WORKER_TAG)) if run else None
        return worker.pid if worker else None


def kill_9_with_its_processes(pid: int) -> None:
    """SIGKILL the run worker and the step processes it started, as an OOM kill of the
    run's process group would."""
    worker = psutil.Process(pid)
    for process in [*worker.children(recursive=True), worker]:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("launcher", sorted(LAUNCHERS))
def test_kill_9_of_a_run_launched_by_a_server_then_the_same_launch_completes(
    launcher, tiny_root, tmp_path, reference
):
    program, instance_yaml = LAUNCHERS[launcher]
    home = new_home(tmp_path / "home")
    if instance_yaml is not None:
        (home / "dagster.yaml").write_text(instance_yaml)
    output = tmp_path / "out"
    hooks = tmp_path / "hold"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(HOLD)
    hold = tmp_path / "hold-images"
    hold.touch()
    environ = {
        **environment(tmp_path, home, output, None),
        "RADHARMONY_DATA_ROOT": str(tiny_root),
        "PYTHONPATH": os.pathsep.join([str(hooks), str(REPO)]),
        "HOLD_IMAGES": str(hold),
    }
    server = DagsterDev(REPO, environ, tmp_path / "server.log", free_port(), program)
    try:
        server.wait_until_loaded("radharmony_pipeline", timeout=180)
        client = DagsterGraphQLClient("127.0.0.1", port_number=server.port, timeout=60)

        def launch() -> str:
            return client.submit_job_execution(
                ALL_STAGES_JOB,
                repository_location_name="radharmony_pipeline",
                repository_name=REPOSITORY_NAME,
                tags={"dagster/partition": PARTITION},
            )

        killed = launch()
        reached = Path(f"{hold}.reached")
        deadline = time.monotonic() + 400
        while not reached.exists():
            server.check_alive()
            assert time.monotonic() < deadline, "images never started" + server.log_tail()
            time.sleep(0.05)
        pid = run_worker_pid(home, killed)
        assert pid is not None, "the run worker is not tagged on the run"
        kill_9_with_its_processes(pid)
        assert killed in runs_holding_the_pool(home), "the killed run should hold its slot"
        hold.unlink()

        # The same launch, nothing run by hand in between.
        rerun = launch()
        deadline = time.monotonic() + 400
        status = None
        while time.monotonic() < deadline:
            server.check_alive()
            status = client.get_run_status(rerun).value
            if status in ("SUCCESS", "FAILURE", "CANCELED"):
                break
            time.sleep(0.5)
        assert status == "SUCCESS", f"re-run {rerun}: {status}" + server.log_tail()
        assert runs_holding_the_pool(home) == []
        assert client.get_run_status(killed).value == "FAILURE"  # marked, not left STARTED
    finally:
        server.stop(grace=30)
    wait_for_orphans(output)
    assert temporaries(output) == []
    resumed = outputs_of(output)
    stage_files = [
        n
        for n in reference
        if n.startswith((layout.mask_folder(PARTITION), layout.resized_image_folder(PARTITION)))
    ]
    assert stage_files and [n for n in stage_files if resumed.get(n) != reference[n]] == []
