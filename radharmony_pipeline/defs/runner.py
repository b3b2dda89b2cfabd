"""Materialize every partition in-process against a Dagster instance and summarize the result.

Used by `radharmony demo`: the runs land in DAGSTER_HOME, so `make ui` shows them.
"""

import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import dagster as dg

from .jobs import ALL_STAGES_JOB, MANIFEST_JOB, OBSERVE_JOB
from .recovery import free_slots_of_dead_runs, waiting_message

# How often a run blocked on a pool says what it waits for (and re-checks for dead holders).
WAIT_REPORT_SECONDS = 10.0


@dataclass
class PartitionOutcome:
    partition: str
    success: bool
    rows: dict[str, int] = field(default_factory=dict)
    checks: dict[str, bool] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    error: str | None = None


# The per-event debug log drowns the summary; warnings and errors still print.
QUIET = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}


def observe_sources(defs: dg.Definitions, instance: dg.DagsterInstance) -> None:
    """Record a data version for every partition of `source_files` (what rebuilds compare)."""
    job = defs.resolve_job_def(OBSERVE_JOB)
    result = job.execute_in_process(instance=instance, run_config=QUIET)
    if not result.success:
        raise RuntimeError("observing source_files failed; see the log above")


def materialize_partitions(
    defs: dg.Definitions,
    instance: dg.DagsterInstance,
    partition_keys: Sequence[str],
    on_done: Callable[[PartitionOutcome], None] = lambda outcome: None,
    say: Callable[[str], None] = lambda text: None,
) -> list[PartitionOutcome]:
    """Run the whole asset graph once per partition; one failing partition does not stop others.

    Slots of runs killed earlier on this instance are freed first, and while a run waits for
    a pool slot, `say` is told every few seconds which run holds it."""
    job = defs.resolve_job_def(ALL_STAGES_JOB)
    outcomes = []
    for key in partition_keys:
        run_id = str(uuid.uuid4())
        with reporting_waits(instance, run_id, say):
            result = job.execute_in_process(
                partition_key=key,
                instance=instance,
                raise_on_error=False,
                run_config=QUIET,
                run_id=run_id,
            )
        outcomes.append(_outcome(key, result))
        on_done(outcomes[-1])
    return outcomes


@contextmanager
def reporting_waits(
    instance: dg.DagsterInstance, run_id: str, say: Callable[[str], None]
) -> Iterator[None]:
    """While the block runs: free the slots of dead runs, and report what `run_id` waits for."""
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

    watcher = threading.Thread(target=watch, name="pool-wait-reporter", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        stop.set()
        watcher.join()


def materialize_manifest(defs: dg.Definitions, instance: dg.DagsterInstance) -> PartitionOutcome:
    """Join every materialized partition into the unified manifest (with its checks)."""
    job = defs.resolve_job_def(MANIFEST_JOB)
    result = job.execute_in_process(instance=instance, raise_on_error=False, run_config=QUIET)
    return _outcome("unified_manifest", result)


def _outcome(key: str, result: dg.ExecuteInProcessResult) -> PartitionOutcome:
    outcome = PartitionOutcome(partition=key, success=result.success)
    for event in result.get_asset_materialization_events():
        materialization = event.materialization
        row_count = materialization.metadata.get("dagster/row_count")
        if row_count is not None:
            outcome.rows[materialization.asset_key.to_user_string()] = int(row_count.value)
    for evaluation in result.get_asset_check_evaluations():
        name = f"{evaluation.asset_key.to_user_string()}:{evaluation.check_name}"
        if evaluation.severity == dg.AssetCheckSeverity.WARN and not evaluation.passed:
            outcome.warnings.append(f"{name} ({evaluation.description})")
        else:
            outcome.checks[name] = evaluation.passed
    failures = [e for e in result.all_events if e.is_step_failure]
    if failures:
        error = failures[0].step_failure_data.error
        outcome.error = error.message.strip() if error else "step failed"
    return outcome


def format_summary(outcomes: Sequence[PartitionOutcome]) -> str:
    lines = [
        f"{'partition':<20} {'status':<7} {'images':>7} {'checks':>9}  failed checks, "
        "warnings / error"
    ]
    for o in outcomes:
        passed = sum(o.checks.values())
        failed = [f"FAILED {name}" for name, ok in o.checks.items() if not ok]
        warned = [f"warning {text}" for text in o.warnings]
        detail = "; ".join(failed + warned) or (o.error.splitlines()[0] if o.error else "")
        lines.append(
            f"{o.partition:<20} {'ok' if o.success else 'FAILED':<7} "
            f"{o.rows.get('raw_index', o.rows.get('unified_manifest', 0)):>7} "
            f"{passed:>4}/{len(o.checks):<4}  {detail}"
        )
    return "\n".join(lines)
