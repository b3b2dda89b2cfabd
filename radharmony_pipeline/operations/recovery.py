"""Free the pool slots of runs whose process is gone, and say what a waiting run waits for.

`masks` and `images` share the `heavy_image_work` pool. A run killed with `kill -9` never
releases its slot, and Dagster's run monitoring cannot tell that a default-launched run's
worker died: every later heavy step on that instance would wait forever. So every run of
these definitions, whatever launched it (CLI, UI, daemon, schedule, sensor), starts through
`freeing_dead_runs_slots`: it tags the run with its worker's host and process, frees the
slots of runs whose worker on this host is gone (marking them failed), and keeps doing so,
reporting what it waits for, while its own steps wait for a slot.

A run whose worker is on another host (a shared Postgres instance) is never judged here:
its process cannot be seen from this one.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import dagster as dg
import psutil

from ..defs.stages import HEAVY_POOL
from ..internals import (
    concurrency_run_ids,
    free_concurrency_slots,
    mark_run_failed,
    pool_slots,
    supports_pool_slots,
)

# The run tag naming the run worker: host, boot time, pid and process start time.
WORKER_TAG = "radharmony/run_worker"
# How often a run blocked on a pool says what it waits for (and re-checks for dead holders).
WAIT_REPORT_SECONDS = 10.0
# Process start times are recorded at a coarser resolution than event timestamps.
_START_TIME_SLACK_SECONDS = 2.0


@dataclass(frozen=True)
class RunWorker:
    """The process that runs a run's steps, as recorded in the run's WORKER_TAG."""

    host: str
    boot_time: float
    pid: int
    started: float

    @classmethod
    def this_process(cls) -> RunWorker:
        process = psutil.Process()
        return cls(socket.gethostname(), psutil.boot_time(), process.pid, process.create_time())

    def tag(self) -> str:
        return json.dumps(
            {
                "host": self.host,
                "boot_time": self.boot_time,
                "pid": self.pid,
                "started": self.started,
            }
        )

    @classmethod
    def from_tag(cls, text: str | None) -> RunWorker | None:
        try:
            fields = json.loads(text or "")
            return cls(
                str(fields["host"]),
                float(fields["boot_time"]),
                int(fields["pid"]),
                float(fields["started"]),
            )
        except (ValueError, TypeError, KeyError):
            return None

    def on_this_host(self) -> bool:
        return self.host == socket.gethostname()

    def alive(self) -> bool:
        """Whether this host still runs the worker: not rebooted since, and its pid not ended
        nor reused by a newer process. Only meaningful on_this_host()."""
        if abs(self.boot_time - psutil.boot_time()) > _START_TIME_SLACK_SECONDS:
            return False
        try:
            process = psutil.Process(self.pid)
            created = process.create_time()
            running = process.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False
        return running and abs(created - self.started) <= _START_TIME_SLACK_SECONDS


@dataclass(frozen=True)
class SlotHolder:
    """A run that holds (or waits for) a pool slot, and whether its worker is alive."""

    run_id: str
    partition: str | None
    status: str
    worker: RunWorker | None
    alive: bool

    def describe(self) -> str:
        where = f" partition {self.partition}" if self.partition else ""
        worker = ""
        if self.worker is not None:
            worker = f", worker pid {self.worker.pid}"
            if not self.worker.on_this_host():
                worker += f" on {self.worker.host}"
        state = "alive" if self.alive else "process gone"
        return f"run {self.run_id[:8]}{where} ({self.status}{worker}, {state})"


def _holder(instance: dg.DagsterInstance, run_id: str) -> SlotHolder:
    run = instance.get_run_by_id(run_id)
    if run is None:
        return SlotHolder(run_id, None, "deleted", None, False)
    worker = RunWorker.from_tag(run.tags.get(WORKER_TAG))
    if run.is_finished:
        alive = False
    elif worker is None or not worker.on_this_host():
        # Queued, starting, or its worker is elsewhere: nothing this process can judge.
        alive = True
    else:
        alive = worker.alive()
    return SlotHolder(run_id, run.tags.get("dagster/partition"), run.status.value, worker, alive)


def slot_holders(instance: dg.DagsterInstance) -> list[SlotHolder]:
    """Every run the instance lists as holding or waiting for a pool slot."""
    if not supports_pool_slots(instance):
        return []
    return [_holder(instance, run_id) for run_id in sorted(concurrency_run_ids(instance))]


def free_slots_of_dead_runs(
    instance: dg.DagsterInstance, say: Callable[[str], None] = lambda text: None
) -> list[str]:
    """Mark runs whose worker process is gone as failed and free every slot of a finished or
    dead run; returns their run ids."""
    freed = []
    for holder in slot_holders(instance):
        if holder.alive:
            continue
        run = instance.get_run_by_id(holder.run_id)
        if run is not None and not run.is_finished:
            mark_run_failed(
                instance,
                run,
                f"the run worker (pid {holder.worker.pid if holder.worker else '?'}) "
                "is gone, probably killed; its pool slots were freed so later runs can proceed",
            )
        free_concurrency_slots(instance, holder.run_id)
        say(f"freed the pool slots of {holder.describe()}")
        freed.append(holder.run_id)
    return freed


def waiting_message(
    instance: dg.DagsterInstance, run_id: str, pool: str = HEAVY_POOL
) -> str | None:
    """What run `run_id` waits for in `pool`, naming the runs that hold its slots; None if it
    is not waiting."""
    if not supports_pool_slots(instance):
        return None
    info = pool_slots(instance, pool)
    if run_id not in info.pending_run_ids:
        return None
    holders = {h.run_id: h for h in slot_holders(instance)}
    held_by = [
        holders[slot.run_id].describe() if slot.run_id in holders else f"run {slot.run_id[:8]}"
        for slot in info.claimed_slots
        if slot.run_id != run_id
    ]
    return f"waiting for a slot of pool {pool!r} (limit {info.slot_count}), held by " + (
        "; ".join(held_by) or "nobody yet"
    )


@contextmanager
def freeing_dead_runs_slots(
    instance: dg.DagsterInstance, run_id: str, say: Callable[[str], None]
) -> Iterator[None]:
    """While run `run_id` executes here: its worker is recorded on the run, the slots of dead
    runs are freed, and every WAIT_REPORT_SECONDS those of runs that died since are freed
    and `say` is told what the run still waits for."""
    instance.add_run_tags(run_id, {WORKER_TAG: RunWorker.this_process().tag()})
    free_slots_of_dead_runs(instance, say)
    stop = threading.Event()

    def watch() -> None:
        while not stop.wait(WAIT_REPORT_SECONDS):
            try:
                free_slots_of_dead_runs(instance, say)
                message = waiting_message(instance, run_id)
            except Exception as error:  # a report must never break the run it watches
                message = f"could not read the pool state: {error!r}"
            if message:
                say(f"run {run_id[:8]} is {message}")

    watcher = threading.Thread(target=watch, name="pool-slot-watch", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        stop.set()
        watcher.join()


class FreeingDeadRunsSlots(dg.Executor):
    """Another executor's steps, run inside `freeing_dead_runs_slots`: the one place every
    run passes through before its steps claim pool slots, whoever launched it."""

    def __init__(self, executor: dg.Executor) -> None:
        self.executor = executor

    # Dagster's RetryMode and StepDependencyConfig are not public names: left unannotated.
    @property
    def retries(self):
        return self.executor.retries

    @property
    def step_dependency_config(self):
        return self.executor.step_dependency_config

    def get_step_event_or_retry_event(self, *args, **kwargs):
        return self.executor.get_step_event_or_retry_event(*args, **kwargs)

    def execute(self, plan_context, execution_plan) -> Iterator[dg.DagsterEvent]:
        say = plan_context.log.warning
        with freeing_dead_runs_slots(plan_context.instance, plan_context.run_id, say):
            yield from self.executor.execute(plan_context, execution_plan)


def executor_freeing_dead_runs_slots(
    create: Callable[[dg.InitExecutorContext], dg.Executor],
) -> Callable[[dg.InitExecutorContext], dg.Executor]:
    """An executor_creation_fn: the executor `create` makes, wrapped in FreeingDeadRunsSlots."""

    def creation(context: dg.InitExecutorContext) -> dg.Executor:
        return FreeingDeadRunsSlots(create(context))

    return creation
