"""Run the project's jobs against a Dagster instance and summarize the result.

Used by `radharmony demo`, which builds the whole product: the stages of every partition, the
manifest and the corpus joins, each partition's exports, and the dataset card. The runs are
recorded as runs of the project's code location (`radharmony_pipeline`, as in workspace.yaml),
like runs launched from the UI: the UI's Overview timeline and job pages list only runs that
name the code location they came from, which `execute_in_process` runs do not.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import dagster as dg

from ..defs.jobs import ALL_STAGES_JOB, CARD_JOB, EXPORTS_JOB, MANIFEST_JOB, OBSERVE_JOB
from ..internals import in_process_code_location, run_with_origin
from .recovery import free_slots_of_dead_runs

if TYPE_CHECKING:
    from ..internals import CodeLocation, ExecutionResult

# The code location and repository names `make ui` (workspace.yaml) shows the project under.
CODE_LOCATION = "radharmony_pipeline"
DEFINITIONS_MODULE = "radharmony_pipeline.definitions"
REPOSITORY = "__repository__"


@dataclass
class PartitionOutcome:
    partition: str
    success: bool
    rows: dict[str, int] = field(default_factory=dict)
    checks: dict[str, bool] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    error: str | None = None
    run_id: str | None = None


# The per-event debug log drowns the summary; warnings and errors still print. Steps run in
# the demo's process, one after the other (as `execute_in_process` did).
RUN_CONFIG = {
    "loggers": {"console": {"config": {"log_level": "WARNING"}}},
    "execution": {"config": {"in_process": {}}},
}


@contextmanager
def project_location(instance: dg.DagsterInstance) -> Iterator[CodeLocation]:
    """The project's code location, loaded in this process under the name the UI uses."""
    with in_process_code_location(instance, DEFINITIONS_MODULE, CODE_LOCATION) as location:
        yield location


def run_job(
    location: CodeLocation,
    instance: dg.DagsterInstance,
    job_name: str,
    partition_key: str | None = None,
    run_id: str | None = None,
) -> ExecutionResult:
    """Record a run of one of the project's jobs with its code-location origin, execute it here."""
    tags = {} if partition_key is None else {"dagster/partition": partition_key}
    return run_with_origin(location, instance, REPOSITORY, job_name, RUN_CONFIG, tags, run_id)


def observe_sources(location: CodeLocation, instance: dg.DagsterInstance) -> None:
    """Record a data version for every partition of `source_files` (what rebuilds compare)."""
    if not run_job(location, instance, OBSERVE_JOB).success:
        raise RuntimeError("observing source_files failed; see the log above")


def materialize_partitions(
    location: CodeLocation,
    instance: dg.DagsterInstance,
    partition_keys: Sequence[str],
    on_done: Callable[[PartitionOutcome], None] = lambda outcome: None,
    say: Callable[[str], None] = lambda text: None,
) -> list[PartitionOutcome]:
    """One `all_stages` run per partition; one failing partition does not stop the others.

    Slots of runs killed earlier on this instance are freed first (and `say` is told); while a
    run waits for a pool slot, its log says every few seconds which run holds it."""
    outcomes = []
    for key in partition_keys:
        # Said here too, not only in the run's log (recovery.freeing_dead_runs_slots).
        free_slots_of_dead_runs(instance, say)
        result = run_job(location, instance, ALL_STAGES_JOB, key)
        outcomes.append(_outcome(key, result))
        on_done(outcomes[-1])
    return outcomes


def materialize_manifest(location: CodeLocation, instance: dg.DagsterInstance) -> PartitionOutcome:
    """Join every materialized partition into the unified manifest (with its checks)."""
    return _outcome("unified_manifest", run_job(location, instance, MANIFEST_JOB))


def materialize_exports(
    location: CodeLocation,
    instance: dg.DagsterInstance,
    partition_keys: Sequence[str],
    on_done: Callable[[PartitionOutcome], None] = lambda outcome: None,
) -> list[PartitionOutcome]:
    """One `exports` run per partition (its Hugging Face and WebDataset shards); one failing
    partition does not stop the others."""
    outcomes = []
    for key in partition_keys:
        outcomes.append(_outcome(key, run_job(location, instance, EXPORTS_JOB, key)))
        on_done(outcomes[-1])
    return outcomes


def materialize_card(location: CodeLocation, instance: dg.DagsterInstance) -> PartitionOutcome:
    """Write the dataset card (DATASET_CARD.md, croissant.json) from the manifest and the
    latest result of every check."""
    return _outcome("corpus_card", run_job(location, instance, CARD_JOB))


def _outcome(key: str, result: ExecutionResult) -> PartitionOutcome:
    outcome = PartitionOutcome(partition=key, success=result.success, run_id=result.run_id)
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
