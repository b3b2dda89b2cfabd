"""Free the pool slots of runs whose process is gone, and say what a waiting run waits for.

`masks` and `images` share the `heavy_image_work` pool. A run killed with `kill -9` never
releases its slot, and without the daemon's run monitoring nothing else does: every later
heavy step on that DAGSTER_HOME would wait forever. Dagster records the process id of the
run worker on each event, so a run whose worker process no longer exists (or is a newer
process that reused the id) is dead: it is marked failed and its slots are freed through the
instance's concurrency API.

Assumes the instance's runs were started on this machine, as with the SQLite DAGSTER_HOME
this project ships; a shared (Postgres) instance should rely on the daemon's run monitoring.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import dagster as dg
import psutil

HEAVY_POOL = "heavy_image_work"
# Process start times are recorded at a coarser resolution than event timestamps.
_START_TIME_SLACK_SECONDS = 2.0


@dataclass(frozen=True)
class SlotHolder:
    """A run that holds (or waits for) a pool slot, and whether its worker is alive."""

    run_id: str
    partition: str | None
    status: str
    worker_pid: int | None
    alive: bool

    def describe(self) -> str:
        where = f" partition {self.partition}" if self.partition else ""
        pid = f", worker pid {self.worker_pid}" if self.worker_pid else ""
        state = "alive" if self.alive else "process gone"
        return f"run {self.run_id[:8]}{where} ({self.status}{pid}, {state})"


def _worker_start(instance: dg.DagsterInstance, run_id: str) -> tuple[int, float] | None:
    """The pid and time of the run's RUN_START event (the run worker process)."""
    records = instance.get_records_for_run(
        run_id, of_type=dg.DagsterEventType.RUN_START, limit=1
    ).records
    if not records:
        return None
    entry = records[0].event_log_entry
    pid = entry.dagster_event.pid if entry.dagster_event else None
    return (pid, entry.timestamp) if pid else None


def _process_alive(pid: int, started_at: float) -> bool:
    """Whether `pid` is still the process that started the run (not a reused id)."""
    try:
        process = psutil.Process(pid)
        created = process.create_time()
        running = process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
    return running and created <= started_at + _START_TIME_SLACK_SECONDS


def slot_holders(instance: dg.DagsterInstance) -> list[SlotHolder]:
    """Every run the instance lists as holding or waiting for a pool slot."""
    storage = instance.event_log_storage
    if not storage.supports_global_concurrency_limits:
        return []
    holders = []
    for run_id in sorted(storage.get_concurrency_run_ids()):
        run = instance.get_run_by_id(run_id)
        if run is None:
            holders.append(SlotHolder(run_id, None, "deleted", None, False))
            continue
        start = _worker_start(instance, run_id)
        if run.is_finished:
            alive = False
        elif start is None:
            # Queued or starting: no worker yet, nothing to judge.
            alive = True
        else:
            alive = _process_alive(*start)
        holders.append(
            SlotHolder(
                run_id,
                run.tags.get("dagster/partition"),
                run.status.value,
                start[0] if start else None,
                alive,
            )
        )
    return holders


def free_slots_of_dead_runs(
    instance: dg.DagsterInstance, say: Callable[[str], None] = lambda text: None
) -> list[str]:
    """Mark runs whose worker process is gone as failed and free every slot of a finished or
    dead run; returns their run ids."""
    storage = instance.event_log_storage
    freed = []
    for holder in slot_holders(instance):
        if holder.alive:
            continue
        run = instance.get_run_by_id(holder.run_id)
        if run is not None and not run.is_finished:
            instance.report_run_failed(
                run,
                message=f"the run worker (pid {holder.worker_pid}) is gone, probably killed; "
                "its pool slots were freed so later runs can proceed",
            )
        storage.free_concurrency_slots_for_run(holder.run_id)
        say(f"freed the pool slots of {holder.describe()}")
        freed.append(holder.run_id)
    return freed


def waiting_message(
    instance: dg.DagsterInstance, run_id: str, pool: str = HEAVY_POOL
) -> str | None:
    """What run `run_id` waits for in `pool`, naming the runs that hold its slots; None if it
    is not waiting."""
    storage = instance.event_log_storage
    if not storage.supports_global_concurrency_limits:
        return None
    info = storage.get_concurrency_info(pool)
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
