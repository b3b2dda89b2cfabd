"""`bboxes`: one row per box, normalized `[y_min, y_max, x_min, x_max]` in the source frame."""

from collections.abc import Iterator
from typing import Any

import dagster as dg
import pandas as pd

from ...processing.annotations.boxes import normalize_xywh
from ...processing.storage.output_layout import table_file
from ...processing.tables.table_schemas import BBOXES, RAW_INDEX
from ...sources import DatasetSource, parse_partition_key
from ...vocabulary import STATUS_ERROR, STATUS_OK
from ..checks.bboxes import CHECK_SPECS, check_results
from ..checks.expectations import kept_validation
from ..groups import ANNOTATIONS
from ..metadata import status_counts, table_code_version
from ..previews import SHEET_METADATA, box_preview
from ..previous_outputs import StageOutput, input_table, reused_or_built, stage_fingerprint
from ..resources import DatasetsResource, OutputsResource, SuiteValidationResource
from ..row_errors import fail_if_strict
from ..run_settings import RunSettingsResource
from ..stages import checked_stage, selected_output

CODE_VERSION = "1"
BOX_COLUMNS = ("image_id", "box_index", "label", "label_text")
OUTPUT = StageOutput(
    "bboxes", ("boxes", "clipped", "degenerate", "malformed", "status", *SHEET_METADATA)
)


@checked_stage(
    "bboxes",
    ANNOTATIONS,
    BBOXES,
    CODE_VERSION,
    check_specs=CHECK_SPECS,
    # Read in the step when the boxes are computed, not as an input: re-used, it is not loaded.
    deps=[RAW_INDEX.name],
    description=(
        "One row per box: unified class `label`, phrase `label_text` (MS-CXR), the box "
        "normalized to the source image as `y_min, y_max, x_min, x_max` in [0, 1], and "
        "in source pixels as `x_px, y_px, w_px, h_px` (top-left + size). Boxes reaching "
        "outside the image are clipped and counted; a box with no area after clipping "
        "is kept as a row with status `error`, never dropped. Datasets without boxes "
        "give an empty table."
    ),
    kinds={"parquet", "png"},
)
def bboxes(
    context: dg.AssetExecutionContext,
    datasets: DatasetsResource,
    outputs: OutputsResource,
    run_settings: RunSettingsResource,
    suite_validation: SuiteValidationResource,
) -> Iterator[dg.Output | dg.AssetCheckResult]:
    dataset, split = parse_partition_key(context.partition_key)
    source = datasets.source(dataset)
    root = outputs.root()
    fingerprint = stage_fingerprint(
        table_code_version(CODE_VERSION),
        context.partition_key,
        source,
        split,
        [table_file(root, RAW_INDEX.name, context.partition_key)],
    )

    def build() -> tuple[pd.DataFrame, dict[str, Any]]:
        raw_index = input_table(root, RAW_INDEX.name, context.partition_key)
        return _box_table(source, split, raw_index, root, context.partition_key)

    # The same boxes from the same files: the table and sheet of the last run.
    table, metadata = reused_or_built(context, OUTPUT, fingerprint, root, build)
    fail_if_strict(table, run_settings.strict, "bboxes")
    yield from selected_output(context, "bboxes", table, metadata)
    yield from check_results(
        context.selected_asset_check_keys,
        source,
        split,
        table,
        run_settings.strict,
        kept_validation(suite_validation.validator(), root, context.partition_key),
    )


def _box_table(
    source: DatasetSource, split: str, raw_index: pd.DataFrame, root: Any, partition: str
) -> tuple[pd.DataFrame, dict[str, Any]]:
    """The boxes read from the dataset's files and normalized, and the stage's metadata
    (counts and the contact sheet)."""
    native = source.read_boxes(split)
    converted = normalize_xywh(
        native["x"],
        native["y"],
        native["w"],
        native["h"],
        native["frame_width"],
        native["frame_height"],
    )
    table = pd.concat(
        [native[list(BOX_COLUMNS)].reset_index(drop=True), converted.table.reset_index(drop=True)],
        axis=1,
    )
    # A box the reader could not use (not four numbers) carries its reason in `error`.
    malformed = (
        native["error"].reset_index(drop=True).astype("string")
        if "error" in native
        else pd.Series(pd.NA, index=table.index, dtype="string")
    )
    degenerate = pd.Series(converted.degenerate, index=table.index) & malformed.isna()
    failed = degenerate | malformed.notna()
    table["status"] = pd.Series(STATUS_OK, index=table.index, dtype="string").mask(
        failed, STATUS_ERROR
    )
    table["error"] = malformed.fillna(
        _degenerate_messages(native.reset_index(drop=True)).where(degenerate)
    )
    metadata = {
        "boxes": len(table),
        "clipped": int(converted.clipped.sum()),
        "degenerate": int(degenerate.sum()),
        "malformed": int(malformed.notna().sum()),
        "status": dg.MetadataValue.json(status_counts(table)),
    }
    # Every partition gets a sheet: without boxes it shows the images themselves.
    metadata.update(box_preview(source, split, raw_index, table, root, partition))
    return table, metadata


def _degenerate_messages(native: pd.DataFrame) -> pd.Series:
    """Per box, why it has no area: its image's frame and the box as the dataset gives it."""
    fields = ["box_index", "image_id", "frame_width", "frame_height", "x", "y", "w", "h"]
    messages = [
        f"box {box} of {image}: no area inside the {width}x{height} image after clipping "
        f"(x={x}, y={y}, w={w}, h={h})"
        for box, image, width, height, x, y, w, h in native[fields].itertuples(index=False)
    ]
    return pd.Series(messages, index=native.index, dtype="string")
