"""The pipeline's data-quality suites, one list of Great Expectations expectations per table.

GX column-map expectations skip nulls: a null label or view means "not annotated". Where a
null is a violation, the suite says so with its own not-null expectation.
"""

from collections.abc import Callable, Sequence

import great_expectations.expectations as gxe

from radharmony_pipeline.processing.annotations.boxes import NORMALIZED_COLUMNS
from radharmony_pipeline.processing.tables.table_schemas import (
    BBOXES,
    INDEX_COLUMNS,
    MASKS,
    PARTITION_COLUMNS,
)
from radharmony_pipeline.vocabulary import (
    IMAGE_FORMATS,
    ROW_STATUSES,
    SPLITS,
    UNIFIED_LABELS,
    UNION_CLASS,
    VIEW_POSITIONS,
)

IMAGE_KEY_REGEX = r"^[A-Za-z0-9._-]+$"
MAX_IMAGE_SIDE = 100_000
# Textual spellings of "missing" that must have been normalised to a real null upstream.
NULL_LIKE_STRINGS = ["None", "nan", "NaN", ""]


def non_empty_text(column: str) -> list[gxe.Expectation]:
    """Every value is a string of at least one character; null is a violation too."""
    return [
        gxe.ExpectColumnValuesToNotBeNull(column=column),
        gxe.ExpectColumnValueLengthsToBeBetween(column=column, min_value=1),
    ]


def image_side(column: str) -> gxe.Expectation:
    return gxe.ExpectColumnValuesToBeBetween(column=column, min_value=1, max_value=MAX_IMAGE_SIDE)


def binary_labels(label_columns: Sequence[str]) -> list[gxe.Expectation]:
    """Unified labels are 1, 0 or null (not annotated)."""
    return [gxe.ExpectColumnValuesToBeInSet(column=c, value_set=[0, 1]) for c in label_columns]


def raw_index() -> list[gxe.Expectation]:
    """The per-dataset raw image index (extra dataset-specific columns allowed)."""
    return [
        gxe.ExpectTableColumnsToMatchSet(column_set=list(INDEX_COLUMNS), exact_match=False),
        gxe.ExpectColumnValuesToBeUnique(column="image_id"),
        gxe.ExpectColumnValuesToNotBeNull(column="image_id"),
        gxe.ExpectColumnValuesToBeUnique(column="image_key"),
        gxe.ExpectColumnValuesToNotBeNull(column="image_key"),
        gxe.ExpectColumnValuesToMatchRegex(column="image_key", regex=IMAGE_KEY_REGEX),
        *non_empty_text("dataset"),
        *non_empty_text("split"),
        *non_empty_text("image_path"),
        gxe.ExpectColumnValuesToBeInSet(column="image_format", value_set=list(IMAGE_FORMATS)),
        gxe.ExpectColumnValuesToBeInSet(column="split", value_set=list(SPLITS)),
        gxe.ExpectColumnValuesToBeInSet(column="view_position", value_set=list(VIEW_POSITIONS)),
        gxe.ExpectColumnValuesToNotBeNull(column="view_position"),
        image_side("source_height"),
        image_side("source_width"),
    ]


def labels(label_columns: Sequence[str]) -> list[gxe.Expectation]:
    """The labels table: one row per image, binary (nullable) label columns."""
    return [
        gxe.ExpectTableColumnsToMatchSet(
            column_set=["image_id", "report", *label_columns], exact_match=False
        ),
        gxe.ExpectColumnValuesToBeUnique(column="image_id"),
        gxe.ExpectColumnValuesToNotBeNull(column="image_id"),
        *binary_labels(label_columns),
        # A missing report must be a real null, not a stringified one.
        gxe.ExpectColumnValuesToNotBeInSet(column="report", value_set=NULL_LIKE_STRINGS),
    ]


def masks() -> list[gxe.Expectation]:
    """The masks table plus the columns the check derives: `mask_file_exists` (bool, null for
    error rows), `class_area_fraction` (null on `any` rows) and `image_class`."""
    return [
        gxe.ExpectTableColumnsToMatchSet(
            column_set=[
                # The table as the step yields it, before the partition columns are added.
                *(column for column in MASKS.names if column not in PARTITION_COLUMNS),
                "mask_file_exists",
                "class_area_fraction",
                "image_class",
            ],
            exact_match=False,
        ),
        gxe.ExpectColumnValuesToBeInSet(
            column="mask_class", value_set=[*UNIFIED_LABELS, UNION_CLASS]
        ),
        gxe.ExpectColumnValuesToBeInSet(column="source", value_set=["rle", "polygon", "empty"]),
        gxe.ExpectColumnValuesToBeInSet(column="status", value_set=list(ROW_STATUSES)),
        gxe.ExpectColumnValuesToBeBetween(column="area_fraction", min_value=0, max_value=1),
        gxe.ExpectColumnValuesToBeInSet(column="mask_file_exists", value_set=[True]),
        image_side("height"),
        image_side("width"),
        # Class rows exist only where the class is present (never an empty class mask), and
        # one row per (image, class).
        gxe.ExpectColumnValuesToBeBetween(
            column="class_area_fraction", min_value=0, max_value=1, strict_min=True
        ),
        gxe.ExpectColumnValuesToBeUnique(column="image_class"),
    ]


_BOX_EDGES = NORMALIZED_COLUMNS


def bboxes() -> list[gxe.Expectation]:
    """Valid rows of the bboxes table."""
    return [
        gxe.ExpectTableColumnsToMatchSet(
            # The table's own columns (the partition's and the row status are added later).
            column_set=[
                c for c in BBOXES.names if c not in (*PARTITION_COLUMNS, "status", "error")
            ],
            exact_match=False,
        ),
        gxe.ExpectColumnValuesToNotBeNull(column="image_id"),
        gxe.ExpectColumnValuesToBeInSet(column="label", value_set=list(UNIFIED_LABELS)),
        *(
            gxe.ExpectColumnValuesToBeBetween(column=edge, min_value=0, max_value=1)
            for edge in _BOX_EDGES
        ),
        *(gxe.ExpectColumnValuesToNotBeNull(column=edge) for edge in _BOX_EDGES),
        # A box's first edge lies strictly before its second, on both axes.
        *(
            gxe.ExpectColumnPairValuesAToBeGreaterThanB(
                column_A=f"{axis}_max",
                column_B=f"{axis}_min",
                or_equal=False,
                ignore_row_if="either_value_is_missing",
            )
            for axis in ("y", "x")
        ),
        image_side("w_px"),
        image_side("h_px"),
    ]


def unified_manifest(label_columns: Sequence[str]) -> list[gxe.Expectation]:
    """The unified manifest."""
    return [
        gxe.ExpectColumnValuesToBeUnique(column="image_id"),
        gxe.ExpectColumnValuesToNotBeNull(column="image_id"),
        *non_empty_text("image_path"),
        *non_empty_text("tensor_path"),
        *non_empty_text("source_image_path"),
        gxe.ExpectColumnValuesToBeInSet(column="split", value_set=list(SPLITS)),
        gxe.ExpectColumnValuesToBeInSet(column="view_position", value_set=list(VIEW_POSITIONS)),
        gxe.ExpectColumnValuesToNotBeNull(column="tensor_index"),
        image_side("orig_height"),
        image_side("orig_width"),
        gxe.ExpectColumnValuesToNotBeNull(column="orig_height"),
        *binary_labels(label_columns),
        gxe.ExpectColumnValuesToNotBeInSet(column="report", value_set=NULL_LIKE_STRINGS),
    ]


SUITES: dict[str, Callable[..., list[gxe.Expectation]]] = {
    "raw_index": raw_index,
    "labels": labels,
    "masks": masks,
    "bboxes": bboxes,
    "unified_manifest": unified_manifest,
}
"""Each suite by the name of the table it validates (the name its check reports)."""
