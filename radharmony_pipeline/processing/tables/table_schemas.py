"""The declared Arrow schema of every table: the one place that documents the contract.

Every partition of a table is written with exactly these columns, in this order, with these
types (`conform` enforces it), so a whole table folder reads as one table in any Parquet
reader. A column only some datasets have is an `extra`: null in the other datasets'
partitions. Adding a column is one line here (then bump SCHEMA_VERSION).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import pandas as pd
import pyarrow as pa

from radharmony_pipeline.vocabulary import REPORT_OBSERVATIONS, STATUS_OK, UNIFIED_LABELS

# Written into each file's key-value metadata; bumped whenever a declaration changes.
SCHEMA_VERSION = "7"  # 6: parent identity columns (issue 21); 7: report labels (issue 31)
SCHEMA_VERSION_KEY = b"radharmony.schema_version"
TABLE_NAME_KEY = b"radharmony.table"

STRING = pa.string()
INT8 = pa.int8()
INT32 = pa.int32()
INT64 = pa.int64()
FLOAT64 = pa.float64()
BOOL = pa.bool_()
TIMESTAMP = pa.timestamp("ms")
STRINGS = pa.list_(STRING)
BOXES = pa.list_(pa.list_(FLOAT64))


@dataclass(frozen=True)
class Column:
    name: str
    type: pa.DataType
    description: str
    # False for dataset-specific extras: a frame without them gets nulls.
    required: bool = True


def col(name: str, type_: pa.DataType, description: str) -> Column:
    return Column(name, type_, description)


def extra(name: str, type_: pa.DataType, description: str) -> Column:
    return Column(name, type_, description, required=False)


@dataclass(frozen=True)
class TableSchema:
    name: str
    columns: tuple[Column, ...]

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.columns]

    def column(self, name: str) -> Column:
        return next(c for c in self.columns if c.name == name)

    def arrow(self) -> pa.Schema:
        """The Arrow schema with the pandas and schema-version metadata every file carries."""
        return _arrow_schema(self)

    def with_extras(self, extras: Sequence[Column]) -> TableSchema:
        """This table with dataset-specific `extras` it does not declare yet, placed before
        `status` (so the columns every table ends with stay last)."""
        new = [c for c in dict((c.name, c) for c in extras).values() if c.name not in self.names]
        if not new:
            return self
        if any(c.required for c in new):
            raise ValueError(f"{self.name}: a dataset's own columns must be extras (nullable)")
        at = self.names.index("status") if "status" in self.names else len(self.columns)
        return TableSchema(self.name, (*self.columns[:at], *new, *self.columns[at:]))


_IMAGE_ID = col("image_id", STRING, "`<dataset>/<native id>`, unique across the corpus")
_DATASET = col("dataset", STRING, "Dataset key: one per registered dataset (sources.SOURCE_TYPES)")
_SPLIT = col("split", STRING, "Normalized split: train, val or test")
_STATUS = col("status", STRING, "`ok`, or `error` when this row could not be produced")
_ERROR = col("error", STRING, "Why the row is an error (file, cause); null when ok")
_PARTITION = (_IMAGE_ID, _DATASET, _SPLIT)


# Where the image came from in the larger dataset it was carved out of (see
# processing/corpus/parents.py for the parents and their split names); null where unknown,
# never guessed.
PARENT_COLUMNS: tuple[Column, ...] = (
    extra(
        "parent_dataset",
        STRING,
        "Parent dataset: chexpert, mimic_cxr, nih_chestxray14, rexgradient",
    ),
    extra(
        "parent_image_id",
        STRING,
        "The image's id in the parent (CheXpert path, MIMIC dicom_id, NIH Image Index)",
    ),
    extra("parent_patient_id", STRING, "The parent's patient id; null when unknown"),
    extra("parent_study_id", STRING, "The parent's study id; null when unknown"),
    extra(
        "parent_split", STRING, "The image's official split in the parent, as the parent names it"
    ),
    extra(
        "parent_patient_splits", STRINGS, "Parent splits holding any image of the parent patient"
    ),
)


def _label_columns() -> tuple[Column, ...]:
    return tuple(
        col(
            f"label_{name}",
            INT8,
            f"Unified tri-state label `{name}`: 1 positive, 0 negative, null not annotated",
        )
        for name in UNIFIED_LABELS
    )


# Where a row's report labels come from (`report_label_source`): the project's report labeler
# reading the report text, or MIMIC-CXR's own CheXpert-labeler file, per study.
REPORT_RULES = "report_rules"
MIMIC_CHEXPERT = "mimic_chexpert"
REPORT_LABEL_PREFIX = "report_label_"
REPORT_LABEL_COLUMNS: tuple[str, ...] = tuple(
    f"{REPORT_LABEL_PREFIX}{name}" for name in REPORT_OBSERVATIONS
)
# What decided a report label: the observation, its value and the sentence that decided it.
EVIDENCE = pa.list_(pa.struct([("observation", STRING), ("value", INT8), ("sentence", STRING)]))


def _report_label_columns() -> tuple[Column, ...]:
    return tuple(
        col(
            column,
            INT8,
            f"`{name}` as read from the report (derived, not annotated): 1 positive, "
            "0 negative, -1 uncertain, null not mentioned or no report labels",
        )
        for name, column in zip(REPORT_OBSERVATIONS, REPORT_LABEL_COLUMNS, strict=True)
    )


_REPORT_LABEL_SOURCE = col(
    "report_label_source",
    STRING,
    f"Where the report labels come from: `{REPORT_RULES}` (the report labeler read the text) "
    f"or `{MIMIC_CHEXPERT}` (MIMIC-CXR's CheXpert labels of the study); null without them",
)


def _native(name: str, datasets: str) -> Column:
    return extra(name, INT8, f"Native label of {datasets} (see the dataset's page for values)")


RAW_INDEX = TableSchema(
    "raw_index",
    (
        _IMAGE_ID,
        col("image_key", STRING, "Filesystem-safe form of image_id, used in file names"),
        _DATASET,
        _SPLIT,
        col("patient_id", STRING, "Patient identifier from the source; null when unknown"),
        col("study_id", STRING, "Study identifier from the source; null when unknown"),
        col("image_path", STRING, "Source image path, relative to the dataset's image folder"),
        col("image_format", STRING, "Source file format: jpg, png or dcm"),
        col("view_position", STRING, "Normalized view: PA, AP, LATERAL, LL, OTHER or UNKNOWN"),
        col("view_position_raw", STRING, "View position as the source states it"),
        col("source_height", INT64, "Source image height in pixels, when the metadata gives it"),
        col("source_width", INT64, "Source image width in pixels, when the metadata gives it"),
        extra("accession_number", STRING, "ReXGradient accession number"),
        extra("patient_sex", STRING, "M or F (CheXlocalize, ReXGradient)"),
        extra("patient_age", STRING, "Age as the source writes it, e.g. `014Y` (ReXGradient)"),
        extra("patient_age_years", FLOAT64, "Age in years (CheXlocalize, ReXGradient)"),
        extra("study_date", TIMESTAMP, "Study date (ReXGradient)"),
        *PARENT_COLUMNS,
        _STATUS,
        _ERROR,
    ),
)

_CHEXPERT = "CheXlocalize (CheXpert 1, 0, -1 uncertain, null blank)"
_MS_CXR = "MS-CXR (1 when a phrase box of the category exists, else 0)"
_CHESTX_DET = "ChestX-Det (1 present, 0 absent)"
_SHARED = "CheXlocalize (1, 0, -1 uncertain), MS-CXR (1 boxed) and ChestX-Det (1/0)"

LABELS = TableSchema(
    "labels",
    (
        *_PARTITION,
        _native("no_finding", _CHEXPERT),
        _native("enlarged_cardiomediastinum", _CHEXPERT),
        _native("cardiomegaly", _SHARED),
        _native("lung_opacity", f"{_CHEXPERT} and {_MS_CXR}"),
        _native("lung_lesion", _CHEXPERT),
        _native("edema", f"{_CHEXPERT} and {_MS_CXR}"),
        _native("consolidation", _SHARED),
        _native("pneumonia", f"{_CHEXPERT} and {_MS_CXR}"),
        _native("atelectasis", _SHARED),
        _native("pneumothorax", _SHARED),
        _native("pleural_effusion", f"{_CHEXPERT} and {_MS_CXR}"),
        _native("pleural_other", _CHEXPERT),
        _native("fracture", f"{_CHEXPERT} and {_CHESTX_DET}"),
        _native("support_devices", _CHEXPERT),
        extra("has_segmentation", BOOL, "CheXlocalize: the segmentation JSON has an entry"),
        extra("num_boxes", INT32, "MS-CXR: box rows of the image in the CSV"),
        _native("calcification", _CHESTX_DET),
        _native("diffuse_nodule", _CHESTX_DET),
        _native("effusion", _CHESTX_DET),
        _native("emphysema", _CHESTX_DET),
        _native("fibrosis", _CHESTX_DET),
        _native("mass", _CHESTX_DET),
        _native("nodule", _CHESTX_DET),
        _native("pleural_thickening", _CHESTX_DET),
        extra("syms", STRINGS, "ChestX-Det: class name of each instance, in JSON order"),
        extra("num_instances", INT32, "ChestX-Det: annotated instances on the image"),
        extra("num_classes_present", INT32, "ChestX-Det: distinct classes on the image"),
        extra("is_negative", BOOL, "ChestX-Det: the image has no finding"),
        col("report", STRING, "Report text (ReXGradient); null when none, never 'None'"),
        col(
            "label_text",
            STRINGS,
            "One entry per annotation, parallel to the image's boxes in box_index order: the "
            "MS-CXR phrase (duplicates kept), null for a ChestX-Det box; empty without boxes",
        ),
        # status/error before the 21 unified columns, which stay last in every label table.
        _STATUS,
        _ERROR,
        *_label_columns(),
    ),
)

MASKS = TableSchema(
    "masks",
    (
        *_PARTITION,
        col("mask_class", STRING, "Unified class name, or `any` for the union of the image"),
        col("mask_path", STRING, "0/255 PNG at native resolution, relative to the output root"),
        col("height", INT64, "Mask height in pixels (the source image's)"),
        col("width", INT64, "Mask width in pixels (the source image's)"),
        col("area_fraction", FLOAT64, "Share of the frame's pixels inside the mask"),
        col("source", STRING, "rle, polygon, or empty (an annotated image without findings)"),
        _STATUS,
        _ERROR,
    ),
)

BBOXES = TableSchema(
    "bboxes",
    (
        *_PARTITION,
        col("box_index", INT64, "Position of the box among the image's boxes (source order)"),
        col("label", STRING, "Unified class name of the box"),
        col("label_text", STRING, "The box's phrase (MS-CXR); null when the source has none"),
        col("y_min", FLOAT64, "Top edge, normalized to the source image height, in [0, 1]"),
        col("y_max", FLOAT64, "Bottom edge, normalized to the source image height, in [0, 1]"),
        col("x_min", FLOAT64, "Left edge, normalized to the source image width, in [0, 1]"),
        col("x_max", FLOAT64, "Right edge, normalized to the source image width, in [0, 1]"),
        col("x_px", FLOAT64, "Left edge in source pixels (after clipping)"),
        col("y_px", FLOAT64, "Top edge in source pixels (after clipping)"),
        col("w_px", FLOAT64, "Width in source pixels (after clipping)"),
        col("h_px", FLOAT64, "Height in source pixels (after clipping)"),
        _STATUS,
        _ERROR,
    ),
)

IMAGES = TableSchema(
    "images",
    (
        *_PARTITION,
        col("image_path", STRING, "Resized S×S PNG, relative to the output root"),
        col("mask_path", STRING, "Resized union mask PNG; null when no mask was annotated"),
        col("size", INT64, "Output side S in pixels"),
        col("orig_height", INT64, "Decoded source height in pixels"),
        col("orig_width", INT64, "Decoded source width in pixels"),
        col("scale", FLOAT64, "Resize factor from source to output pixels"),
        col("pad_top", INT64, "Letterbox padding above the image, output pixels"),
        col("pad_left", INT64, "Letterbox padding left of the image, output pixels"),
        col("tensor_index", INT64, "Row of the image in the partition's packed .npy array"),
        col("source_sha256", STRING, "SHA-256 of the source file"),
        col("resize", STRING, "letterbox or squash"),
        col(
            "perceptual_hash",
            STRING,
            "256-bit dHash of the resized image without padding (64 hex digits); finds "
            "re-encoded and near-identical copies",
        ),
        col("pixels_sha256", STRING, "SHA-256 of the resized S×S pixels"),
        _STATUS,
        _ERROR,
    ),
)

UNIFIED_MANIFEST = TableSchema(
    "unified_manifest",
    (
        *_PARTITION,
        col("patient_id", STRING, "Patient identifier; null when the source has none"),
        col("study_id", STRING, "Study identifier; null when the source has none"),
        col("view_position", STRING, "Normalized view: PA, AP, LATERAL, LL, OTHER or UNKNOWN"),
        col("source_image_path", STRING, "Source image, relative to the dataset's image folder"),
        col("image_path", STRING, "Resized S×S PNG, relative to the output root"),
        col("tensor_path", STRING, "Packed N×S×S uint8 array of the partition (.npy)"),
        col("tensor_index", INT64, "Row of the image in tensor_path"),
        col("orig_height", INT64, "Source height in pixels"),
        col("orig_width", INT64, "Source width in pixels"),
        col("mask_path", STRING, "Resized union mask PNG; null when has_mask is false"),
        col(
            "has_mask",
            BOOL,
            "A mask was annotated for this image (possibly empty); false means not annotated, "
            "not negative",
        ),
        col("mask_classes", STRINGS, "Classes with a non-empty mask"),
        col("bboxes", BOXES, "Boxes as [y_min, y_max, x_min, x_max], normalized source frame"),
        col("bboxes_resized", BOXES, "The same boxes in the resized frame (padding included)"),
        col("bbox_labels", STRINGS, "Unified class of each box, parallel to bboxes"),
        col("label_text", STRINGS, "Phrase of each box (null where none), parallel to bboxes"),
        col("report", STRING, "Report text; null when none"),
        *_label_columns(),
        *_report_label_columns(),
        _REPORT_LABEL_SOURCE,
        col("patient_sex", STRING, "M or F; null when unknown"),
        col("patient_age_years", FLOAT64, "Age in years; null when unknown"),
        col("study_date", TIMESTAMP, "Study date; null when unknown"),
        col(
            "duplicate_group",
            STRING,
            "The image's group in near_duplicates (same or nearly the same pixels as another "
            "image); null when it has none",
        ),
        *PARENT_COLUMNS,
    ),
)

NEAR_DUPLICATES = TableSchema(
    "near_duplicates",
    (
        _IMAGE_ID,
        _DATASET,
        _SPLIT,
        col("image_path", STRING, "Resized S×S PNG, relative to the output root"),
        col("group_id", STRING, "The group: `dup-` + a digest of its representative's id"),
        col("group_size", INT64, "Members of the group"),
        col("group_datasets", STRINGS, "Datasets the group's members come from"),
        col("group_splits", STRINGS, "Partitions (`<dataset>.<split>`) the group spans"),
        col("representative_id", STRING, "The group's smallest image_id"),
        col(
            "distance_to_representative",
            INT64,
            "Bits between this image's perceptual hash and the representative's",
        ),
        col(
            "kind",
            STRING,
            "identical_file (same source bytes as another member), identical_pixels (same "
            "resized pixels) or near (perceptual hashes within the radius)",
        ),
        col("source_sha256", STRING, "SHA-256 of the source file"),
        col("pixels_sha256", STRING, "SHA-256 of the resized S×S pixels"),
    ),
)

REPORT_LABELS = TableSchema(
    "report_labels",
    (
        *_PARTITION,
        col(
            "report_labeler_version",
            STRING,
            f"The report labeler's version that labelled the text (`{REPORT_RULES}`); "
            f"the file's name for `{MIMIC_CHEXPERT}`",
        ),
        col(
            "report_sha256",
            STRING,
            "SHA-256 of the report text (UTF-8) the labels were read from; with the labeler "
            "version the key a later run reuses the row by; null for labels read from a file",
        ),
        *_report_label_columns(),
        _REPORT_LABEL_SOURCE,
        col(
            "report_label_evidence",
            EVIDENCE,
            "Per positive and uncertain label, the sentence that decided it "
            "({observation, value, sentence}); empty for labels read from a file",
        ),
    ),
)

_PREVALENCE = (
    col("label", STRING, "Unified class name"),
    col("positive", INT64, "Images with the label 1"),
    col("negative", INT64, "Images with the label 0"),
    col("not_annotated", INT64, "Images with the label null (the dataset does not annotate it)"),
)

PARTITION_PROFILE = TableSchema("partition_profile", (_DATASET, _SPLIT, *_PREVALENCE))

CORPUS_PROFILE = TableSchema("corpus_profile", (_DATASET, *_PREVALENCE))

_PARENT_IMAGE = col("parent_image_id", STRING, "The parent's image id (NIH: the Image Index)")

NIH_FINGERPRINTS = TableSchema(
    "nih_fingerprints",
    (
        _PARENT_IMAGE,
        col("image_path", STRING, "The PNG, relative to the NIH ChestX-ray14 root"),
        col("input_key", STRING, "File state, decoder and settings the fingerprint is valid for"),
        col("size", INT64, "Side S the image was resized to (as in `images`)"),
        col("resize", STRING, "letterbox or squash (as in `images`)"),
        col("source_sha256", STRING, "SHA-256 of the file"),
        col("pixels_sha256", STRING, "SHA-256 of the resized S×S pixels"),
        col("perceptual_hash", STRING, "256-bit dHash of the resized content (as in `images`)"),
        _STATUS,
        _ERROR,
    ),
)

NIH_PARENT_LINKS = TableSchema(
    "nih_parent_links",
    (
        _IMAGE_ID,
        _SPLIT,
        col("parent_image_id", STRING, "The NIH Image Index found; null unless one was found"),
        col(
            "match",
            STRING,
            "identical_file, identical_pixels, near (perceptual hashes within the radius), "
            "ambiguous (several NIH images at the best tier) or unmatched",
        ),
        col("distance", INT64, "Bits between the perceptual hashes (0 for identical tiers)"),
        col("candidates", STRINGS, "The NIH images at the best tier (several when ambiguous)"),
        col("shared_parent", BOOL, "Another ChestX-Det image matched the same NIH image"),
        col("parent_patient_id", STRING, "NIH Patient ID of the image found"),
        col("parent_split", STRING, "train_val or test (NIH's official lists)"),
        col("parent_patient_splits", STRINGS, "NIH lists holding any image of the patient"),
    ),
)

# Manifest columns joined over the whole corpus once every partition's rows exist.
CORPUS_WIDE_COLUMNS: tuple[str, ...] = ("duplicate_group", *(c.name for c in PARENT_COLUMNS))
# The raw_index columns every dataset fills, in order (extras and status/error follow).
INDEX_COLUMNS: tuple[str, ...] = tuple(
    c.name for c in RAW_INDEX.columns if c.required and c.name not in ("status", "error")
)

PARENT_PROVENANCE = TableSchema("parent_provenance", (_IMAGE_ID, _DATASET, _SPLIT, *PARENT_COLUMNS))

TABLE_SCHEMAS: dict[str, TableSchema] = {
    schema.name: schema
    for schema in (
        RAW_INDEX,
        LABELS,
        MASKS,
        BBOXES,
        IMAGES,
        UNIFIED_MANIFEST,
        NEAR_DUPLICATES,
        NIH_FINGERPRINTS,
        NIH_PARENT_LINKS,
        PARENT_PROVENANCE,
        REPORT_LABELS,
        PARTITION_PROFILE,
        CORPUS_PROFILE,
    )
}
# The tables each partition's stages write, one file per partition: what its exports, its
# profile, the manifest and `radharmony verify` read of it.
PARTITION_TABLES: tuple[str, ...] = tuple(
    schema.name for schema in (RAW_INDEX, LABELS, MASKS, BBOXES, IMAGES)
)
# Partitioned tables carry the partition's dataset and split in every row.
PARTITION_COLUMNS = ("dataset", "split")
# The columns that say which image of which partition a row is about.
PARTITION_KEY_COLUMNS: tuple[str, ...] = tuple(c.name for c in _PARTITION)


class SchemaMismatchError(ValueError):
    """A frame that does not fit its table's declared schema."""


def conform(
    frame: pd.DataFrame, schema: TableSchema, constants: Mapping[str, str] | None = None
) -> pa.Table:
    """The frame as an Arrow table of exactly the declared schema.

    Declared extras the frame lacks become nulls; `constants` fills columns the frame lacks
    with one value (a partition's dataset and split) and must agree with them where present.
    Raises SchemaMismatchError naming the column and both types when a column cannot be
    represented in its declared type without loss, or is missing or undeclared.
    """
    constants = dict(constants or {})
    undeclared = [str(c) for c in frame.columns if c not in schema.names]
    if undeclared:
        raise SchemaMismatchError(
            f"{schema.name}: column(s) {', '.join(undeclared)} are not declared; declare them "
            "in radharmony_pipeline/processing/tables/table_schemas.py (and bump SCHEMA_VERSION)"
        )
    arrays = []
    for column in schema.columns:
        if column.name in frame.columns:
            array = _column_array(frame[column.name], column, schema.name)
            if column.name in constants:
                _check_constant(array, column.name, constants[column.name], schema.name)
        elif column.name in constants:
            array = pa.array([constants[column.name]] * len(frame), type=column.type)
        elif not column.required:
            array = pa.nulls(len(frame), column.type)
        else:
            raise SchemaMismatchError(
                f"{schema.name}: required column {column.name} ({column.type}) is missing from "
                f"the frame (columns: {', '.join(map(str, frame.columns))})"
            )
        arrays.append(array)
    return pa.Table.from_arrays(arrays, schema=schema.arrow())


def _column_array(series: pd.Series, column: Column, table: str) -> pa.Array:
    declared = column.type
    if series.empty:
        # No value to lose: an empty partition (an annotation file without entries) gets the
        # declared types whatever dtype pandas gave its empty columns.
        return pa.array([], type=declared)
    try:
        array = pa.array(series, from_pandas=True)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        # Mixed Python objects that Arrow cannot infer one type for: try the declared type.
        array = _as_declared(series, column, table, "values of mixed types")
    if array.type == declared:
        return array
    if not _same_kind(array.type, declared):
        raise _mismatch(series, column, table, array.type, "a different kind of value")
    try:
        return array.cast(declared, safe=True)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise _mismatch(series, column, table, array.type, str(exc)) from exc


def _as_declared(series: pd.Series, column: Column, table: str, why: str) -> pa.Array:
    try:
        return pa.array(series.tolist(), type=column.type, from_pandas=True)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise _mismatch(series, column, table, None, f"{why}: {exc}") from exc


def _mismatch(
    series: pd.Series, column: Column, table: str, actual: pa.DataType | None, detail: str
) -> SchemaMismatchError:
    found = f"{series.dtype}" + (f" (Arrow {actual})" if actual is not None else "")
    return SchemaMismatchError(
        f"{table}.{column.name}: declared type {column.type}, but the frame's column is "
        f"{found}; {detail}"
    )


def _kind(type_: pa.DataType) -> str:
    if pa.types.is_integer(type_) or pa.types.is_floating(type_):
        return "number"
    if pa.types.is_string(type_) or pa.types.is_large_string(type_):
        return "string"
    if pa.types.is_list(type_) or pa.types.is_large_list(type_):
        return "list"
    if pa.types.is_timestamp(type_) or pa.types.is_date(type_):
        return "time"
    return str(type_)


def _same_kind(actual: pa.DataType, declared: pa.DataType) -> bool:
    """Whether a safe cast may turn `actual` into `declared` (all-null fits anything)."""
    if pa.types.is_null(actual):
        return True
    if _kind(actual) != _kind(declared):
        return False
    if _kind(declared) == "list":
        return _same_kind(actual.value_type, declared.value_type)
    return True


def _check_constant(array: pa.Array, name: str, value: str, table: str) -> None:
    other = [v for v in array.unique().to_pylist() if v != value]
    if other:
        raise SchemaMismatchError(
            f"{table}.{name}: every row must be {value!r} (the partition's), found {other[:3]}"
        )


_PANDAS_NULLABLE = {
    INT8: pd.Int8Dtype(),
    INT32: pd.Int32Dtype(),
    INT64: pd.Int64Dtype(),
    BOOL: pd.BooleanDtype(),
    STRING: pd.StringDtype(),
}


def pandas_types(type_: pa.DataType) -> object:
    """The pandas dtype a declared column reads back as: nullable ints, booleans, strings."""
    return _PANDAS_NULLABLE.get(type_)


_ARROW_SCHEMAS: dict[TableSchema, pa.Schema] = {}


def _arrow_schema(schema: TableSchema) -> pa.Schema:
    if schema not in _ARROW_SCHEMAS:
        plain = pa.schema([pa.field(c.name, c.type, nullable=True) for c in schema.columns])
        # pandas metadata from an empty frame of the nullable dtypes, so pandas readers get
        # Int8/boolean/string columns back instead of float and object.
        empty = plain.empty_table().to_pandas(types_mapper=pandas_types)
        pandas_metadata = pa.Table.from_pandas(empty, schema=plain, preserve_index=False)
        metadata = {
            **(pandas_metadata.schema.metadata or {}),
            SCHEMA_VERSION_KEY: SCHEMA_VERSION.encode(),
            TABLE_NAME_KEY: schema.name.encode(),
        }
        _ARROW_SCHEMAS[schema] = plain.with_metadata(metadata)
    return _ARROW_SCHEMAS[schema]


@dataclass(frozen=True)
class WorkingField:
    """A value a stage's job reports beside its table row and drops before writing."""

    name: str
    type: type
    default: object


_PYTHON_TYPES = {"number": float, "string": str, "list": list, "time": object}


def row_type(
    schema: TableSchema, name: str, module: str, working: Sequence[WorkingField] = ()
) -> type:
    """A dataclass with one field per column of `schema` a job fills, plus `working` fields.

    Every field defaults to null (status to `ok`), so an error row names only what it knows.
    The partition's dataset and split are left out: `conform` fills them. `module` is the
    module the class is bound in, so rows pickle to and from worker processes.
    """
    fields = [
        (c.name, _python_type(c.type) | None, dataclasses.field(default=_default(c)))
        for c in schema.columns
        if c.name not in PARTITION_COLUMNS
    ]
    fields += [(w.name, w.type, dataclasses.field(default=w.default)) for w in working]
    cls = dataclasses.make_dataclass(name, fields)
    cls.__module__ = module
    cls.__doc__ = f"One row of `{schema.name}` as a job produces it (see table_schemas.py)."
    return cls


def rows_frame(rows: Iterable[object], row_class: type, schema: TableSchema) -> pd.DataFrame:
    """Rows of a `row_type` class as a frame typed like the declared columns, even when empty."""
    fields = dataclasses.fields(row_class)
    names = [f.name for f in fields]
    frame = pd.DataFrame([[getattr(row, n) for n in names] for row in rows], columns=names)
    dtypes = {
        f.name: pandas_dtype(schema.column(f.name).type) if f.name in schema.names else f.type
        for f in fields
    }
    return frame.astype(dtypes)


def pandas_dtype(type_: pa.DataType) -> object:
    """The pandas dtype a declared column is held in before writing (nullable where Arrow is)."""
    nullable = pandas_types(type_)
    return nullable if nullable is not None else type_.to_pandas_dtype()


def _python_type(type_: pa.DataType) -> type:
    if pa.types.is_integer(type_):
        return int
    if pa.types.is_boolean(type_):
        return bool
    return _PYTHON_TYPES.get(_kind(type_), object)


def _default(column: Column) -> object:
    return STATUS_OK if column.name == "status" else None
