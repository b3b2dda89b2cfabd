"""`images`: every image decoded, resized to S×S with its geometry recorded, packed per
partition. Its checks run in the same step, on the table in memory (check_specs)."""

from collections.abc import Iterator
from typing import Literal

import dagster as dg
import pandas as pd
from pydantic import Field

from ...processing.execution.progress import ProgressLog
from ...processing.jobs.image_jobs import (
    IMAGE_CODE_VERSION,
    IMAGE_WORKING_FIELDS,
    ImageJob,
    image_job_stopped,
    image_table,
    update_packed_images,
)
from ...processing.storage.atomic import TEMP_MARKER, writer_is_gone
from ...processing.storage.output_layout import (
    packed_images,
    resized_image,
    resized_image_folder,
    resized_union_mask,
)
from ...processing.storage.source_store import is_remote, named_states
from ...processing.storage.store import (
    OutputPath,
    glob,
    lists_object_states,
    make_folder,
    object_states,
    remove,
    remove_orphaned_temporaries,
)
from ...processing.tables.table_schemas import IMAGES
from ...settings import MAX_IMAGE_SIZE, UNREADABLE_LIMIT_VARIABLE, image_size
from ...sources import parse_partition_key
from ...vocabulary import STATUS_OK, UNION_CLASS
from ..checks.images import CHECK_SPECS, check_results
from ..groups import PIXELS
from ..metadata import status_counts
from ..resources import DatasetsResource, OutputsResource
from ..row_errors import fail_if_mostly_unreadable, fail_if_strict
from ..run_settings import RunSettingsResource, from_environment
from ..stages import HEAVY_POOL, checked_stage, output_root_in_shards, selected_output


class ImagesConfig(dg.Config):
    size: int = Field(
        default_factory=from_environment(image_size),
        ge=1,
        le=MAX_IMAGE_SIZE,
        description="Output side S in pixels; default RADHARMONY_IMAGE_SIZE or 224.",
    )
    resize: Literal["letterbox", "squash"] = Field(
        default="letterbox",
        description="letterbox: long side to S, centred, zero-padded (aspect kept); "
        "squash: both sides stretched to S.",
    )


@checked_stage(
    "images",
    PIXELS,
    IMAGES,
    IMAGE_CODE_VERSION,
    check_specs=CHECK_SPECS,
    ins={"raw_index": dg.AssetIn("raw_index"), "masks": dg.AssetIn("masks")},
    pool=HEAVY_POOL,
    description=(
        "Every image of the partition decoded to 8-bit grayscale (JPEG at reduced DCT scale "
        "when much larger than S; PNG 8/16-bit; DICOM with modality and VOI LUTs, MONOCHROME1 "
        "inverted), resized to S×S (letterbox by default), written as PNG with its union mask "
        "resized by nearest neighbour through the same geometry, and packed into "
        "`images/<partition>.npy` (N×S×S uint8, row = tensor_index). Unchanged images are "
        "re-used after a cheap check (a stat of the source and of its PNGs, whose headers are "
        "read only when they changed since last seen); changed ones are decoded and "
        "their rows patched into the array in place under a journal that the next run "
        "replays after a crash; undecodable ones are rows with status `error`."
    ),
    kinds={"png", "numpy", "parquet"},
)
def images(
    context: dg.AssetExecutionContext,
    config: ImagesConfig,
    raw_index: pd.DataFrame,
    masks: pd.DataFrame,
    datasets: DatasetsResource,
    outputs: OutputsResource,
    run_settings: RunSettingsResource,
) -> Iterator[dg.Output | dg.AssetCheckResult]:
    dataset, split = parse_partition_key(context.partition_key)
    source = datasets.source(dataset)
    root = output_root_in_shards(context, outputs.root(), "images")
    folder = root / resized_image_folder(context.partition_key)
    packed = root / packed_images(context.partition_key)
    make_folder(folder)
    # On S3 one listing of the image folder (a request per 1,000 objects) says which output
    # PNGs are there, with their states: each job then neither reads a PNG that is not there
    # (a 404 per image and per mask on a first build) nor, on a re-run, a mask that holds
    # what it would write (ImageJob.listed_states).
    listed = object_states(folder) if lists_object_states(folder) else None
    # The array a killed build was assembling stays: the build resumes from its rows.
    remove_orphaned_temporaries(folder, listed=listed)
    unions = _union_masks(masks, root)
    base = source.image_dir(split)
    errors = raw_index["error"] if "error" in raw_index else pd.Series(pd.NA, index=raw_index.index)
    relatives = raw_index["image_path"].fillna("")
    # On an object store one listing of the image folder replaces a request per image.
    source_states = named_states(base, relatives) if is_remote(base) else {}
    partition = context.partition_key
    jobs = [
        ImageJob(
            image_id=image_id,
            source_file=base / relative,
            union_mask_file=unions.get(image_id),
            output_root=root,
            image_relative=resized_image(partition, image_key),
            mask_relative=resized_union_mask(partition, image_key) if image_id in unions else None,
            size=config.size,
            resize=config.resize,
            row=row,
            source_root=base,
            index_error=None if pd.isna(error) else f"raw_index: {error}",
            source_state=source_states.get(relative),
            listed_states=None
            if listed is None
            else _listed_states(listed, partition, image_key, image_id in unions),
        )
        for row, (image_id, image_key, relative, error) in enumerate(
            # Lists, not Series: iterating Arrow-backed columns costs a microsecond a value.
            zip(
                raw_index["image_id"].tolist(),
                raw_index["image_key"].tolist(),
                relatives.tolist(),
                errors.tolist(),
                strict=True,
            )
        )
    ]
    progress = ProgressLog(context.log, "images to decode", len(jobs))
    # Bounds every image, on the local pool and on a Dask cluster alike.
    limit = run_settings.time_limit(image_job_stopped)
    executor = run_settings.executor()
    update = update_packed_images(jobs, packed, config.size, executor, progress.update, limit)
    # A killed worker (time limit) leaves its temporary PNG behind, a killed run its arrays.
    _remove_interrupted_writes(folder, packed)
    table = image_table(update.rows)
    fail_if_strict(table, run_settings.strict, "images")
    fail_if_mostly_unreadable(
        table,
        run_settings.unreadable_limit,
        "images",
        f"Run `radharmony check-data` for the likely cause and the setting to change "
        f"({UNREADABLE_LIMIT_VARIABLE} sets the share of unreadable images that is tolerated).",
    )
    yield from selected_output(
        context,
        "images",
        table.drop(columns=[field.name for field in IMAGE_WORKING_FIELDS]),
        {
            "images": len(table),
            "decoded": int(table["decoded"].sum()),
            "reused": int((~table["decoded"] & (table["status"] == STATUS_OK)).sum()),
            "status": dg.MetadataValue.json(status_counts(table)),
            "packed_array": dg.MetadataValue.path(str(packed)),
            # All N rows when the array was assembled, the changed ones when patched in place.
            "packed_rows_written": update.rows_written,
            "packed_rows_replayed": update.rows_replayed,
            "size": config.size,
            "resize": config.resize,
        },
    )
    yield from check_results(context.selected_asset_check_keys, table, run_settings.strict)


def _listed_states(
    listed: dict[str, str], partition: str, image_key: str, masked: bool
) -> tuple[str | None, str | None]:
    """The listed states of an image's PNG and of its mask PNG (None: not listed, or no
    mask); `listed` is by path relative to the partition's image folder."""
    start = len(resized_image_folder(partition)) + 1
    mask = listed.get(resized_union_mask(partition, image_key)[start:]) if masked else None
    return listed.get(resized_image(partition, image_key)[start:]), mask


def _union_masks(masks: pd.DataFrame, root: OutputPath) -> dict[str, OutputPath]:
    ok = masks[(masks["mask_class"] == UNION_CLASS) & (masks["status"] == STATUS_OK)]
    return {
        image_id: root / path
        for image_id, path in zip(ok["image_id"], ok["mask_path"], strict=True)
    }


def _remove_interrupted_writes(folder: OutputPath, packed: OutputPath) -> None:
    """A killed run leaves temporary files and shards (never partial outputs); clear those
    whose writer is gone. A live writer's (another run of this partition) are left alone.
    Globs list the folder once, on object storage too."""
    remove_orphaned_temporaries(folder)
    for path in glob(packed.parent, f"{TEMP_MARKER}*{packed.name}*"):
        if writer_is_gone(path):
            remove(path)
