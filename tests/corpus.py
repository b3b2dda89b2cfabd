"""Materializing the whole asset graph on a data root, for tests that need real outputs."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import dagster as dg
import pytest

from radharmony_pipeline.definitions import build_definitions
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


def check_evaluations(result: dg.ExecuteInProcessResult) -> dict[str, object]:
    return {e.check_name: e for e in result.get_asset_check_evaluations()}
