"""`huggingface_export` and `webdataset_export`: each partition's manifest rows as training
shards under `<output>/exports/` (docs/exports.md)."""

from collections.abc import Callable
from dataclasses import dataclass

import dagster as dg
import pandas as pd
from pydantic import Field

from ...processing.corpus.exports import (
    DEFAULT_MAX_SHARD_BYTES,
    EXPORT_CODE_VERSION,
    HUGGINGFACE_FOLDER,
    WEBDATASET,
    WEBDATASET_FOLDER,
    WEBDATASET_INDEX_NAME,
    ExportFormat,
    ExportResult,
    ExportSamples,
    ShardNames,
    export_partition,
    export_samples,
    huggingface_format,
    huggingface_index_name,
    huggingface_shards,
    webdataset_shards,
    write_huggingface_configs,
)
from ...processing.storage.store import OutputPath
from ...processing.tables.manifest import partition_manifest
from ...processing.tables.table_schemas import PARTITION_TABLES, REPORT_LABELS
from ...sources import SOURCE_TYPES, parse_partition_key
from ...vocabulary import UNIFIED_LABELS
from ..automation import REBUILD_WHEN_CHANGED
from ..groups import PUBLISHING
from ..partitions import OWNERS, dataset_split_partitions
from ..resources import OutputsResource
from ..run_settings import RunSettingsResource

STAGES = (*PARTITION_TABLES, REPORT_LABELS.name)
# Every class some dataset draws masks for, in vocabulary order: one mask column each.
MASK_CLASSES = tuple(
    name
    for name in UNIFIED_LABELS
    if any(name in source.mask_classes for source in SOURCE_TYPES.values())
)


class ExportConfig(dg.Config):
    max_shard_bytes: int = Field(
        default=DEFAULT_MAX_SHARD_BYTES,
        ge=1,
        description="Upper bound on the sample bytes of one shard (a larger sample is a shard "
        "of its own); 256 MiB by default.",
    )


@dataclass(frozen=True)
class ExportTarget:
    """Where a partition's shards of one format go and what they are named."""

    export: ExportFormat
    folder: OutputPath
    shard_names: ShardNames
    index_name: str


def _export_asset(
    name: str,
    description: str,
    kinds: set[str],
    target: Callable[[OutputPath, str], ExportTarget],
) -> dg.AssetsDefinition:
    """The export asset `name` of a format: the partition's manifest rows written as shards
    where `target(root, partition)` says (which also writes what the format keeps beside
    them)."""

    @dg.asset(
        name=name,
        partitions_def=dataset_split_partitions,
        group_name=PUBLISHING,
        owners=OWNERS,
        ins={stage: dg.AssetIn(stage) for stage in STAGES},
        description=description,
        automation_condition=REBUILD_WHEN_CHANGED,
        code_version=EXPORT_CODE_VERSION,
        kinds=kinds,
    )
    def export(
        context: dg.AssetExecutionContext,
        config: ExportConfig,
        raw_index: pd.DataFrame,
        labels: pd.DataFrame,
        masks: pd.DataFrame,
        bboxes: pd.DataFrame,
        images: pd.DataFrame,
        report_labels: pd.DataFrame,
        outputs: OutputsResource,
        run_settings: RunSettingsResource,
    ) -> dg.MaterializeResult:
        root, partition = outputs.root(), context.partition_key
        # The same rows the manifest holds for this partition, from the same function.
        rows, _excluded = partition_manifest(
            partition, raw_index, labels, masks, bboxes, images, report_labels
        )
        samples = export_samples(rows, images, masks, root)
        return _export(
            context,
            samples,
            target(root, partition),
            config.max_shard_bytes,
            run_settings.workers,
        )

    return export


def _huggingface_target(root: OutputPath, partition: str) -> ExportTarget:
    dataset, split = parse_partition_key(partition)
    # The same bytes from every partition's run: the configurations of every dataset.
    write_huggingface_configs(
        root / HUGGINGFACE_FOLDER, {key: source.splits for key, source in SOURCE_TYPES.items()}
    )
    return ExportTarget(
        huggingface_format(MASK_CLASSES),
        root / HUGGINGFACE_FOLDER / dataset,
        huggingface_shards(split),
        huggingface_index_name(split),
    )


def _webdataset_target(root: OutputPath, partition: str) -> ExportTarget:
    return ExportTarget(
        WEBDATASET,
        root / WEBDATASET_FOLDER / partition,
        webdataset_shards(partition),
        WEBDATASET_INDEX_NAME,
    )


huggingface_export = _export_asset(
    "huggingface_export",
    "The partition's manifest rows as Hugging Face `datasets` Parquet shards "
    "(`exports/huggingface/<dataset>/<split>-NNNNN.parquet`, one configuration per dataset, "
    "`val` named `validation`) with declared Features: the resized image and union mask as "
    "`Image` (PNG bytes embedded), each class mask as a nullable `Image` with "
    "`has_<class>_mask`, the 21 nullable labels, the labels derived from the report "
    "(`report_label_*`, `report_label_source`), boxes with labels and phrases, report and ids; "
    "a shard index `<split>.index.json` lists every sample.",
    {"parquet", "huggingface"},
    _huggingface_target,
)

webdataset_export = _export_asset(
    "webdataset_export",
    "The partition's manifest rows as WebDataset tar shards of bounded size "
    "(`exports/webdataset/<partition>/<partition>-NNNNNN.tar`): per sample `<key>.png`, "
    "`<key>.mask.png` when annotated and `<key>.json` (ids, labels, labels derived from the "
    "report, boxes, phrases, report); "
    "`index.json` lists every shard and sample.",
    {"webdataset", "tar"},
    _webdataset_target,
)


def _export(
    context: dg.AssetExecutionContext,
    samples: ExportSamples,
    target: ExportTarget,
    max_shard_bytes: int,
    workers: int,
) -> dg.MaterializeResult:
    dataset, split = parse_partition_key(context.partition_key)
    export, folder, index_name = target.export, target.folder, target.index_name
    result: ExportResult = export_partition(
        samples,
        export,
        folder,
        target.shard_names,
        index_name,
        max_shard_bytes,
        identity={"partition": context.partition_key, "dataset": dataset, "split": split},
        workers=workers,
    )
    shards = result.index["shards"]
    verb = "re-used" if result.reused else "wrote"
    context.log.info(f"{verb} {len(shards)} {export.name} shards of {len(samples)} samples")
    return dg.MaterializeResult(
        metadata={
            "samples": result.index["samples"],
            "shards": len(shards),
            "bytes": sum(shard["bytes"] for shard in shards),
            "reused": result.reused,
            "shard_index": dg.MetadataValue.path(str(folder / index_name)),
            "shard_names": dg.MetadataValue.json([shard["name"] for shard in shards]),
        }
    )
