"""Materializing the whole asset graph on a data root, for tests that need real outputs."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import dagster as dg
import pytest

from radharmony_pipeline.definitions import build_definitions
from radharmony_pipeline.defs.groups import CORPUS_JOINS, PARTITION_STAGES
from radharmony_pipeline.defs.jobs import ALL_STAGES_JOB, MANIFEST_JOB
from radharmony_pipeline.sources import partition_keys


def materialize_corpus(
    data_root: Path,
    output: Path,
    partitions: Sequence[str] | None = None,
    instance: dg.DagsterInstance | None = None,
) -> tuple[dict[str, dg.ExecuteInProcessResult], dg.ExecuteInProcessResult]:
    """Each partition's `all_stages` run (stages and checks), then the `manifest` job (the
    manifest, near duplicates, the corpus profile and their checks), in one instance (a new
    ephemeral one unless given), with a pool of two workers as on this machine."""
    definitions = build_definitions(data_root, output)
    instance = instance or dg.DagsterInstance.ephemeral()
    with pytest.MonkeyPatch.context() as env:
        env.setenv("RADHARMONY_WORKERS", "2")
        results = {
            key: definitions.resolve_job_def(ALL_STAGES_JOB).execute_in_process(
                partition_key=key, instance=instance, raise_on_error=False
            )
            for key in (partitions or partition_keys())
        }
        manifest = definitions.resolve_job_def(MANIFEST_JOB).execute_in_process(
            instance=instance, raise_on_error=False
        )
    return results, manifest


def materialize_stages_then_joins(
    data_root: Path, output: Path, partitions: Sequence[str] | None = None
) -> dg.ExecuteInProcessResult:
    """Each partition's stages (PARTITION_STAGES), then the joins over them (CORPUS_JOINS: the
    near duplicates, parent links, manifest and their checks) in one ephemeral instance.
    Returns the joins' result, which may have failed."""
    built = dg.Definitions.merge(
        build_definitions(data_root, output),
        dg.Definitions(
            jobs=[
                dg.define_asset_job("partitions", selection=PARTITION_STAGES),
                dg.define_asset_job("joined", selection=CORPUS_JOINS),
            ]
        ),
    )
    instance = dg.DagsterInstance.ephemeral()
    for key in partitions or partition_keys():
        built.resolve_job_def("partitions").execute_in_process(partition_key=key, instance=instance)
    return built.resolve_job_def("joined").execute_in_process(
        instance=instance, raise_on_error=False
    )


def check_evaluations(result: dg.ExecuteInProcessResult) -> dict[str, object]:
    return {e.check_name: e for e in result.get_asset_check_evaluations()}


def checks_of_a_success(result: dg.ExecuteInProcessResult) -> dict[str, object]:
    """The check evaluations of a run that must have succeeded, by check name."""
    failures = [event.message for event in result.all_events if event.is_failure]
    assert result.success, failures
    return check_evaluations(result)
