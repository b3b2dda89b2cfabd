"""`unified_manifest`: every usable image of every materialized partition, training-ready."""

import dagster as dg
import pandas as pd

from ...processing.manifest import MANIFEST_COLUMNS, combine, partition_manifest
from ...processing.table_schemas import UNIFIED_MANIFEST
from ...processing.vocabulary import LABEL_COLUMNS
from ..automation import REBUILD_WHEN_CHANGED
from ..metadata import definition_metadata, table_code_version
from ..partitions import OWNERS

CODE_VERSION = "1"
UPSTREAM = ("raw_index", "labels", "masks", "bboxes", "images")

# Where each manifest column comes from (shown as column lineage in the UI).
_SOURCES = {
    "raw_index": (
        "image_id",
        "dataset",
        "split",
        "patient_id",
        "study_id",
        "view_position",
        "patient_sex",
        "patient_age_years",
        "study_date",
    ),
    "images": ("image_path", "tensor_index", "orig_height", "orig_width", "mask_path"),
    "labels": ("report", *LABEL_COLUMNS),
    "masks": ("mask_classes", "has_mask"),
    "bboxes": ("bboxes", "bbox_labels", "bboxes_resized", "label_text"),
}


@dg.asset(
    group_name="manifest",
    owners=OWNERS,
    ins={
        name: dg.AssetIn(
            name,
            partition_mapping=dg.AllPartitionMapping(),
            metadata={"allow_missing_partitions": True},
        )
        for name in UPSTREAM
    },
    description=(
        "One row per usable image of every materialized partition: ids, split, view, source "
        "and resized paths, packed-array row, masks, boxes in the source frame (`bboxes`) and "
        "in the resized frame (`bboxes_resized`, letterbox padding included), phrases, report "
        "and the 21 unified label columns. Images whose stage errored are left out and "
        "counted by reason."
    ),
    automation_condition=REBUILD_WHEN_CHANGED,
    code_version=table_code_version(CODE_VERSION),
    kinds={"parquet", "pandas"},
    metadata=definition_metadata(UNIFIED_MANIFEST),
)
def unified_manifest(
    context: dg.AssetExecutionContext,
    raw_index: dict[str, pd.DataFrame],
    labels: dict[str, pd.DataFrame],
    masks: dict[str, pd.DataFrame],
    bboxes: dict[str, pd.DataFrame],
    images: dict[str, pd.DataFrame],
) -> dg.Output[pd.DataFrame]:
    complete = sorted(set(raw_index) & set(labels) & set(masks) & set(bboxes) & set(images))
    parts, excluded = {}, {}
    for partition in complete:
        parts[partition], excluded[partition] = partition_manifest(
            partition,
            raw_index[partition],
            labels[partition],
            masks[partition],
            bboxes[partition],
            images[partition],
        )
    manifest = combine(parts)
    context.log.info(f"{len(manifest)} images from {len(complete)} partitions")
    return dg.Output(
        manifest,
        metadata={
            "partitions": dg.MetadataValue.json(complete),
            "images_per_partition": dg.MetadataValue.json({k: len(v) for k, v in parts.items()}),
            "excluded": dg.MetadataValue.json({k: v for k, v in excluded.items() if v}),
            "dagster/column_lineage": dg.TableColumnLineage(
                deps_by_column={
                    column: [dg.TableColumnDep(asset_key=dg.AssetKey(asset), column_name=column)]
                    for asset, columns in _SOURCES.items()
                    for column in columns
                    if column in MANIFEST_COLUMNS
                }
            ),
        },
    )
