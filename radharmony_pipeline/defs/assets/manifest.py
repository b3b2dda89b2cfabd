"""`unified_manifest`: every usable image of every materialized partition, training-ready."""

import dagster as dg
import pandas as pd

from ...processing.annotations.boxes import NORMALIZED_COLUMNS
from ...processing.corpus.duplicates import with_duplicate_groups
from ...processing.corpus.parents import PARENT_IDENTITY, with_parent_columns
from ...processing.tables.manifest import (
    PARTITION_MANIFEST_COLUMNS,
    REPORT_MANIFEST_COLUMNS,
    combine,
    partition_manifest,
)
from ...processing.tables.table_schemas import (
    IMAGES,
    PARTITION_KEY_COLUMNS,
    PARTITION_TABLES,
    RAW_INDEX,
    UNIFIED_MANIFEST,
)
from ...vocabulary import LABEL_COLUMNS
from ..groups import CORPUS
from ..partitions import every_partition_of
from ..stages import corpus_table

CODE_VERSION = "4"  # 2: duplicate_group from near_duplicates; 3: parent identity; 4: reports
# Joined where materialized: a partition without them has null report labels.
REPORT_LABELS = "report_labels"

_BOX_EDGES = NORMALIZED_COLUMNS
# Manifest columns copied unchanged from `images` (the partition columns aside) and from
# `raw_index` (the rest it holds; parent identity is joined from parent_provenance).
_IMAGES_COLUMNS = tuple(
    c for c in PARTITION_MANIFEST_COLUMNS if c in IMAGES.names and c not in PARTITION_KEY_COLUMNS
)
_RAW_INDEX_COLUMNS = tuple(
    c for c in PARTITION_MANIFEST_COLUMNS if c in RAW_INDEX.names and c not in _IMAGES_COLUMNS
)

# Manifest column -> the upstream (asset, column) pairs it is computed from (column lineage).
# Derived columns name every input: `bboxes_resized` is the boxes through each image's geometry.
_COLUMN_SOURCES: dict[str, tuple[tuple[str, str], ...]] = {
    **{column: (("raw_index", column),) for column in _RAW_INDEX_COLUMNS},
    "source_image_path": (("raw_index", "image_path"),),
    **{column: (("images", column),) for column in _IMAGES_COLUMNS},
    "tensor_path": (("images", "tensor_index"),),
    **{column: (("labels", column),) for column in ("report", *LABEL_COLUMNS)},
    **{column: ((REPORT_LABELS, column),) for column in REPORT_MANIFEST_COLUMNS},
    "label_text": (("bboxes", "label_text"),),
    "mask_classes": (("masks", "mask_class"),),
    "has_mask": (("masks", "mask_class"),),
    "bboxes": tuple(("bboxes", edge) for edge in _BOX_EDGES),
    "bbox_labels": (("bboxes", "label"),),
    "bboxes_resized": (
        *(("bboxes", edge) for edge in _BOX_EDGES),
        *(("images", column) for column in ("orig_height", "orig_width", "size", "resize")),
    ),
    "duplicate_group": (("near_duplicates", "group_id"),),
    **{column: (("parent_provenance", column),) for column in PARENT_IDENTITY},
}


def column_lineage() -> dg.TableColumnLineage:
    return dg.TableColumnLineage(
        deps_by_column={
            column: [
                dg.TableColumnDep(asset_key=dg.AssetKey(asset), column_name=name)
                for asset, name in sources
            ]
            for column, sources in _COLUMN_SOURCES.items()
            if column in UNIFIED_MANIFEST.names
        }
    )


def column_lineage_markdown() -> str:
    """The lineage as a table: manifest column, upstream asset (linked) and its columns."""
    lines = ["| manifest column | from asset | column(s) |", "|---|---|---|"]
    for column, sources in _COLUMN_SOURCES.items():
        if column not in UNIFIED_MANIFEST.names:
            continue
        by_asset: dict[str, list[str]] = {}
        for asset, name in sources:
            by_asset.setdefault(asset, []).append(name)
        for asset, names in by_asset.items():
            used = ", ".join(f"`{name}`" for name in names)
            lines.append(f"| `{column}` | [{asset}](/assets/{asset}) | {used} |")
    return "\n".join(lines)


@corpus_table(
    UNIFIED_MANIFEST,
    CORPUS,
    CODE_VERSION,
    ins=every_partition_of(*PARTITION_TABLES, REPORT_LABELS)
    | {
        "near_duplicates": dg.AssetIn("near_duplicates"),
        "parent_provenance": dg.AssetIn("parent_provenance"),
    },
    description=(
        "One row per usable image of every materialized partition: ids, split, view, source "
        "and resized paths, packed-array row, masks, boxes in the source frame (`bboxes`) and "
        "in the resized frame (`bboxes_resized`, letterbox padding included), phrases, report "
        "and the 21 unified label columns, the labels read from its report "
        "(`report_label_*`, derived from reports, and `report_label_source`; null without "
        "them), `duplicate_group` (the image's group in "
        "`near_duplicates`, else null), and the parent identity columns (`parent_*`, from "
        "`parent_provenance`). Images whose stage errored are left out and "
        "counted by reason."
    ),
)
def unified_manifest(
    context: dg.AssetExecutionContext,
    raw_index: dict[str, pd.DataFrame],
    labels: dict[str, pd.DataFrame],
    masks: dict[str, pd.DataFrame],
    bboxes: dict[str, pd.DataFrame],
    images: dict[str, pd.DataFrame],
    report_labels: dict[str, pd.DataFrame],
    near_duplicates: pd.DataFrame,
    parent_provenance: pd.DataFrame,
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
            report_labels.get(partition),
        )
    manifest = with_duplicate_groups(combine(parts), near_duplicates)
    manifest = with_parent_columns(manifest, parent_provenance)
    context.log.info(f"{len(manifest)} images from {len(complete)} partitions")
    return dg.Output(
        manifest,
        metadata={
            "partitions": dg.MetadataValue.json(complete),
            "images_per_partition": dg.MetadataValue.json({k: len(v) for k, v in parts.items()}),
            "excluded": dg.MetadataValue.json({k: v for k, v in excluded.items() if v}),
            "dagster/column_lineage": column_lineage(),
            # The Dagster UI (1.13) hides `dagster/column_lineage` from every metadata table and
            # has no column-lineage page of its own: this is the copy people read.
            "column_lineage": dg.MetadataValue.md(column_lineage_markdown()),
        },
    )
