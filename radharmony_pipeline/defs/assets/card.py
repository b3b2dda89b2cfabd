"""`corpus_card`: DATASET_CARD.md and croissant.json at the output root, written from the
manifest, the near-duplicate groups, the latest check results and the input data versions."""

import hashlib
import importlib.metadata
import json

import dagster as dg
import pandas as pd

from ...processing.corpus.card import (
    CARD_NAME,
    CROISSANT_NAME,
    MANIFEST_FILE,
    CardInputs,
    CheckOutcome,
    SourceFacts,
    card_figures,
    card_markdown,
    croissant_metadata,
)
from ...processing.storage.output_layout import source_snapshot
from ...processing.storage.source_snapshot import load_snapshot
from ...processing.storage.store import OutputPath, publish_bytes
from ...processing.tables.table_schemas import SCHEMA_VERSION
from ...sources import SOURCE_TYPES, parse_partition_key
from ..automation import REBUILD_WHEN_CHANGED
from ..groups import PUBLISHING
from ..partitions import OWNERS, every_partition_of
from ..resources import DatasetsResource, OutputsResource
from ..run_settings import RunSettingsResource
from .source_files import observe_partition

CODE_VERSION = "1"
# Runs whose check evaluations are read back, newest first: many rebuilds of every partition.
RUNS_READ = 2_000


@dg.asset(
    group_name=PUBLISHING,
    owners=OWNERS,
    ins={
        "unified_manifest": dg.AssetIn("unified_manifest"),
        "near_duplicates": dg.AssetIn("near_duplicates"),
        **every_partition_of("images"),
    },
    description=(
        "The corpus's dataset card, written from the data: sources with licences and "
        "citations, counts per dataset and split, label prevalence, mask and box availability, "
        "the latest result of every check with expected vs found, near-duplicate findings, "
        "known limits, pipeline version, settings and input data versions; as "
        "`DATASET_CARD.md` and a Croissant `croissant.json` (validated by mlcroissant) at the "
        "output root, and as this asset's Markdown metadata."
    ),
    automation_condition=REBUILD_WHEN_CHANGED,
    code_version=CODE_VERSION,
    kinds={"markdown", "json"},
)
def corpus_card(
    context: dg.AssetExecutionContext,
    unified_manifest: pd.DataFrame,
    near_duplicates: pd.DataFrame,
    images: dict[str, pd.DataFrame],
    datasets: DatasetsResource,
    outputs: OutputsResource,
    run_settings: RunSettingsResource,
) -> dg.MaterializeResult:
    root = outputs.root()
    present = sorted(unified_manifest["dataset"].unique()) if len(unified_manifest) else []
    inputs = CardInputs(
        manifest=unified_manifest,
        near_duplicates=near_duplicates,
        sources=[_source_facts(dataset) for dataset in present],
        checks=latest_check_outcomes(context.instance),
        settings={**_image_settings(images), "strict": run_settings.strict},
        data_versions=_data_versions(sorted(images), datasets, root),
        pipeline_version=pipeline_version(),
    )
    figures = card_figures(inputs)
    markdown = card_markdown(inputs, figures)
    with (root / MANIFEST_FILE).open("rb") as handle:
        manifest_sha256 = hashlib.file_digest(handle, "sha256").hexdigest()
    croissant = croissant_metadata(inputs, figures, manifest_sha256)
    publish_bytes(root / CARD_NAME, markdown.encode())
    document = json.dumps(croissant, indent=1, sort_keys=True, default=str) + "\n"
    publish_bytes(root / CROISSANT_NAME, document.encode())
    return dg.MaterializeResult(
        metadata={
            "card": dg.MetadataValue.md(markdown),
            "card_path": dg.MetadataValue.path(str(root / CARD_NAME)),
            "croissant_path": dg.MetadataValue.path(str(root / CROISSANT_NAME)),
            "images": figures["images"],
            "checks_failed": figures["checks"]["failed"],
        }
    )


def pipeline_version() -> str:
    return f"{importlib.metadata.version('radharmony-pipeline')}+schema{SCHEMA_VERSION}"


def _source_facts(dataset: str) -> SourceFacts:
    card = SOURCE_TYPES[dataset].card
    if card is None:
        return SourceFacts(dataset, dataset, "—", "not stated", "not stated")
    return SourceFacts(dataset, card.title, card.homepage, card.licence, card.citation)


def latest_check_outcomes(instance: dg.DagsterInstance) -> list[CheckOutcome]:
    """The newest evaluation of every (asset, check, partition) in the instance's recent runs
    (newest run first, and within a run its last evaluation)."""
    latest: dict[tuple[str, str, str | None], CheckOutcome] = {}
    for run in instance.get_runs(limit=RUNS_READ):
        entries = instance.all_logs(run.run_id, of_type=dg.DagsterEventType.ASSET_CHECK_EVALUATION)
        for entry in reversed(entries):
            evaluation = entry.dagster_event.event_specific_data
            key = (
                evaluation.asset_key.to_user_string(),
                evaluation.check_name,
                evaluation.partition,
            )
            if key not in latest:
                latest[key] = CheckOutcome(
                    asset=key[0],
                    check=key[1],
                    partition=key[2],
                    passed=bool(evaluation.passed),
                    severity=evaluation.severity.value,
                    description=_expected_and_found(evaluation),
                )
    return [latest[key] for key in sorted(latest, key=lambda k: (k[0], k[1], k[2] or ""))]


def _expected_and_found(evaluation: dg.AssetCheckEvaluation) -> str:
    """The check's own summary, plus the figures it compared when its metadata has them
    (the count checks record `mismatches` with expected and found, and every `found`)."""
    text = evaluation.description or ""
    for key in ("mismatches", "found"):
        value = evaluation.metadata.get(key)
        if value is not None:
            figures = json.dumps(value.value, sort_keys=True, default=str)
            return f"{text}; {key}: {figures}" if text else f"{key}: {figures}"
    return text


def _image_settings(images: dict[str, pd.DataFrame]) -> dict[str, str]:
    """Size and resize mode as the images tables record them (all partitions' values)."""
    frames = [table for table in images.values() if len(table)]
    if not frames:
        return {}
    both = pd.concat([frame[["size", "resize"]] for frame in frames], ignore_index=True)
    return {
        "image size": ", ".join(str(v) for v in sorted(both["size"].dropna().unique())),
        "resize": ", ".join(str(v) for v in sorted(both["resize"].dropna().unique())),
    }


def _data_versions(
    partitions: list[str], datasets: DatasetsResource, root: OutputPath
) -> dict[str, str]:
    """The last observation's data version of each partition's downloads, else one taken
    now (the card must name the data it describes)."""
    versions = {}
    for partition in partitions:
        snapshot = load_snapshot(root / source_snapshot(partition))
        if snapshot is None:
            dataset, split = parse_partition_key(partition)
            snapshot = observe_partition(datasets.source(dataset), split)
        versions[partition] = snapshot.data_version()
    return versions
