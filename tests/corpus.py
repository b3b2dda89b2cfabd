"""Materializing the whole asset graph on a data root, for tests that need real outputs."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import dagster as dg

from radharmony_pipeline.definitions import defs
from radharmony_pipeline.defs.assets.source_files import source_files
from radharmony_pipeline.defs.resources import pipeline_resources
from radharmony_pipeline.sources import partition_keys

DEFINITIONS = [d for d in [*defs.assets, *defs.asset_checks] if d is not source_files]
MANIFEST = dg.AssetSelection.assets("unified_manifest")


def materialize_corpus(
    data_root: Path, output: Path, partitions: Sequence[str] | None = None
) -> tuple[dict[str, dg.ExecuteInProcessResult], dg.ExecuteInProcessResult]:
    """Each partition's stages and checks, then the manifest and its checks (one instance)."""
    os.environ.setdefault("RADHARMONY_WORKERS", "2")
    instance = dg.DagsterInstance.ephemeral()
    stages = dg.AssetSelection.all() - MANIFEST
    results = {
        key: dg.materialize(
            DEFINITIONS,
            partition_key=key,
            resources=pipeline_resources(data_root, output),
            selection=stages,
            instance=instance,
            raise_on_error=False,
        )
        for key in (partitions or partition_keys())
    }
    manifest = dg.materialize(
        DEFINITIONS,
        resources=pipeline_resources(data_root, output),
        selection=MANIFEST,
        instance=instance,
        raise_on_error=False,
    )
    return results, manifest


def check_evaluations(result: dg.ExecuteInProcessResult) -> dict[str, object]:
    return {e.check_name: e for e in result.get_asset_check_evaluations()}
