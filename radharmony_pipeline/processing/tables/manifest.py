"""The unified manifest: every usable image of every partition joined into one table."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd

from radharmony_pipeline.processing.annotations.boxes import NORMALIZED_COLUMNS
from radharmony_pipeline.processing.imaging.geometry import GEOMETRIES, boxes_to_resized_frame
from radharmony_pipeline.processing.storage.output_layout import packed_images
from radharmony_pipeline.processing.tables.reasons import error_reasons
from radharmony_pipeline.processing.tables.table_schemas import (
    CORPUS_WIDE_COLUMNS,
    RAW_INDEX,
    REPORT_LABEL_COLUMNS,
    REPORT_LABELS,
    UNIFIED_MANIFEST,
    pandas_dtype,
)
from radharmony_pipeline.vocabulary import LABEL_COLUMNS, STATUS_OK, UNION_CLASS

# One partition's manifest rows: every declared column but those joined over the corpus.
PARTITION_MANIFEST_COLUMNS: tuple[str, ...] = tuple(
    name for name in UNIFIED_MANIFEST.names if name not in CORPUS_WIDE_COLUMNS
)
# The manifest's columns from report_labels (the evidence stays in report_labels).
REPORT_MANIFEST_COLUMNS: tuple[str, ...] = (*REPORT_LABEL_COLUMNS, "report_label_source")
# Columns only some datasets' raw_index has (demographics), typed as declared when absent.
_EXTRAS = {
    c.name: pandas_dtype(c.type)
    for c in RAW_INDEX.columns
    if not c.required and c.name in PARTITION_MANIFEST_COLUMNS
}


def partition_manifest(
    partition: str,
    raw_index: pd.DataFrame,
    labels: pd.DataFrame,
    masks: pd.DataFrame,
    bboxes: pd.DataFrame,
    images: pd.DataFrame,
    report_labels: pd.DataFrame | None,
) -> tuple[pd.DataFrame, dict[str, int]]:
    """Manifest rows of one partition, and the images left out, counted by reason.

    `report_labels` is None when the partition's report labels are not materialized: its
    report_label_* columns are then null, as for an image without a report.
    """
    # An index error reaches `images` as its error row, whose status decides below.
    rows = raw_index.drop(columns=["status", "error"], errors="ignore").rename(
        columns={"image_path": "source_image_path"}
    )
    for column, dtype in _EXTRAS.items():
        if column not in rows:
            rows[column] = pd.Series(None, index=rows.index, dtype=dtype)
        else:
            rows[column] = rows[column].astype(dtype)
    # dataset and split come from raw_index; every partitioned table repeats them.
    images = images.drop(columns=["dataset", "split"], errors="ignore")
    rows = rows.merge(images, on="image_id", how="left", validate="one_to_one")
    usable = rows["status"] == STATUS_OK
    excluded = error_reasons(rows.loc[~usable, "error"].fillna("image stage did not run"))
    rows = rows.loc[usable].copy()
    rows["tensor_path"] = packed_images(partition)
    rows = rows.merge(
        labels[["image_id", "report", *LABEL_COLUMNS]],
        on="image_id",
        how="left",
        validate="one_to_one",
    )
    rows = rows.merge(
        _report_columns(report_labels), on="image_id", how="left", validate="one_to_one"
    )
    rows = rows.merge(_mask_classes(masks), on="image_id", how="left")
    rows["mask_classes"] = [
        list(v) if isinstance(v, (list, np.ndarray)) else [] for v in rows["mask_classes"]
    ]
    # Annotated (an `any` mask exists, possibly empty), not "has a finding".
    rows["has_mask"] = rows["image_id"].isin(_annotated(masks)).astype(bool)
    rows = rows.merge(_box_lists(bboxes), on="image_id", how="left")
    for column in ("bboxes", "bbox_labels", "label_text"):
        rows[column] = [list(v) if isinstance(v, list) else [] for v in rows[column]]
    rows["bboxes_resized"] = [
        _resized_boxes(boxes, row)
        for boxes, row in zip(
            rows["bboxes"],
            rows[["orig_height", "orig_width", "size", "resize"]].itertuples(),
            strict=True,
        )
    ]
    return rows[list(PARTITION_MANIFEST_COLUMNS)].reset_index(drop=True), excluded


def _report_columns(report_labels: pd.DataFrame | None) -> pd.DataFrame:
    """image_id and the manifest's report-label columns, typed as declared."""
    columns = ("image_id", *REPORT_MANIFEST_COLUMNS)
    dtypes = {name: pandas_dtype(REPORT_LABELS.column(name).type) for name in columns}
    if report_labels is None:
        return pd.DataFrame({name: pd.Series(dtype=dtype) for name, dtype in dtypes.items()})
    return report_labels[list(columns)].astype(dtypes)


def _mask_classes(masks: pd.DataFrame) -> pd.DataFrame:
    ok = masks[(masks["status"] == STATUS_OK) & (masks["mask_class"] != UNION_CLASS)]
    grouped = ok.groupby("image_id")["mask_class"].apply(lambda s: sorted(s.astype(str)))
    return grouped.rename("mask_classes").reset_index()


def _annotated(masks: pd.DataFrame) -> set[str]:
    """Images with a usable union mask: the dataset segmented them."""
    union = (masks["status"] == STATUS_OK) & (masks["mask_class"] == UNION_CLASS)
    return set(masks.loc[union, "image_id"])


def _box_lists(bboxes: pd.DataFrame) -> pd.DataFrame:
    """Per image, parallel lists in box_index order: boxes, their classes, their phrases."""
    ok = bboxes[bboxes["status"] == STATUS_OK].sort_values(["image_id", "box_index"])
    if ok.empty:
        return pd.DataFrame(
            {
                "image_id": pd.Series(dtype="string"),
                "bboxes": [],
                "bbox_labels": [],
                "label_text": [],
            }
        )
    coordinates = ok[list(NORMALIZED_COLUMNS)].to_numpy(dtype=float).tolist()
    frame = pd.DataFrame(
        {
            "image_id": ok["image_id"].to_numpy(),
            "box": coordinates,
            "label": ok["label"].astype(str).to_numpy(),
            "phrase": [None if pd.isna(text) else str(text) for text in ok["label_text"]],
        }
    )
    grouped = frame.groupby("image_id", sort=False)
    return pd.DataFrame(
        {
            "image_id": list(grouped.groups),
            "bboxes": grouped["box"].apply(list).tolist(),
            "bbox_labels": grouped["label"].apply(list).tolist(),
            "label_text": grouped["phrase"].apply(list).tolist(),
        }
    )


def _resized_boxes(boxes: list, image: tuple) -> list[list[float]]:
    """Boxes in the resized S×S frame, through the image's own geometry (padding included)."""
    if not boxes:
        return []
    geometry = GEOMETRIES[image.resize](
        int(image.orig_height), int(image.orig_width), int(image.size)
    )
    array = np.asarray(boxes, dtype=float)
    resized = boxes_to_resized_frame(array[:, 0], array[:, 1], array[:, 2], array[:, 3], geometry)
    return np.column_stack(resized).tolist()


def combine(parts: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """All partitions' rows, in partition order."""
    frames = [parts[key] for key in sorted(parts)]
    if not frames:
        return pd.DataFrame(columns=list(PARTITION_MANIFEST_COLUMNS))
    return pd.concat(frames, ignore_index=True)
