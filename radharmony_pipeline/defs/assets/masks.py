"""`masks`: per-class and unioned binary masks at native resolution (PNG), and their table.
Its checks run in the same step, on the table in memory (check_specs)."""

from collections.abc import Iterator
from typing import Any

import dagster as dg
import pandas as pd

from ...processing.execution.cluster import map_per_image_with_time_limit
from ...processing.execution.progress import ProgressLog
from ...processing.jobs.mask_jobs import (
    MASK_CODE_VERSION,
    MaskTarget,
    carried_index_errors,
    mask_job_stopped,
    mask_table,
    run_mask_job,
)
from ...processing.storage.output_layout import image_mask_folder, mask_folder, table_file
from ...processing.storage.store import (
    OutputPath,
    listing,
    lists_object_states,
    object_states,
    remove_orphaned_temporaries,
)
from ...processing.tables.table_schemas import MASKS, RAW_INDEX
from ...sources import DatasetSource, parse_partition_key
from ...vocabulary import STATUS_OK
from ..checks.expectations import kept_validation
from ..checks.masks import CHECK_SPECS, check_results
from ..groups import ANNOTATIONS
from ..metadata import status_counts, table_code_version
from ..previews import SHEET_METADATA, mask_preview
from ..previous_outputs import StageOutput, reused_or_built, stage_fingerprint
from ..resources import DatasetsResource, OutputsResource, SuiteValidationResource
from ..row_errors import fail_if_strict
from ..run_settings import RunSettingsResource
from ..stages import HEAVY_POOL, checked_stage, output_root_in_shards, selected_output

OUTPUT = StageOutput(
    "masks", ("images", "masks_written", "masks_unchanged", "status", *SHEET_METADATA)
)


@checked_stage(
    "masks",
    ANNOTATIONS,
    MASKS,
    MASK_CODE_VERSION,
    check_specs=CHECK_SPECS,
    # labels: read only by the positives_without_masks check.
    ins={"raw_index": dg.AssetIn("raw_index"), "labels": dg.AssetIn("labels")},
    pool=HEAVY_POOL,
    description=(
        "Binary masks at the source image's native resolution, written as 0/255 PNGs under "
        "`masks/<partition>/<shard>/<image_key>/<class>.png`: one per class present (unified "
        "names, `Airspace Opacity` → `lung_opacity`) and the union `any` for every image the "
        "dataset segments (all-zero when nothing is found; none for laterals, MS-CXR, "
        "ReXGradient). CheXlocalize RLEs are unioned by merging before one decode; ChestX-Det "
        "polygons are filled per class, overlaps kept. Unchanged "
        "masks are not rewritten. Datasets without masks give an empty table."
    ),
    kinds={"png", "parquet"},
)
def masks(
    context: dg.AssetExecutionContext,
    raw_index: pd.DataFrame,
    labels: pd.DataFrame,
    datasets: DatasetsResource,
    outputs: OutputsResource,
    run_settings: RunSettingsResource,
    suite_validation: SuiteValidationResource,
) -> Iterator[dg.Output | dg.AssetCheckResult]:
    dataset, split = parse_partition_key(context.partition_key)
    source = datasets.source(dataset)
    root = output_root_in_shards(context, outputs.root(), "masks")
    folder = mask_folder(context.partition_key)
    # On S3 one listing of the partition's masks (a request per 1,000 objects) serves the
    # clean-up, the check that a re-used table's masks are there, and each job, which then
    # reads no mask the listing did not find (MaskTarget.listed).
    listed = set(object_states(root / folder)) if lists_object_states(root / folder) else None
    remove_orphaned_temporaries(root / folder, listed=listed)
    # Where the masks go is part of the table (mask_path): another layout, other rows.
    layout = image_mask_folder(context.partition_key, "<image_key>")
    fingerprint = stage_fingerprint(
        f"{table_code_version(MASK_CODE_VERSION)}|{layout}",
        context.partition_key,
        source,
        split,
        [table_file(root, RAW_INDEX.name, context.partition_key)],
    )
    # A root moved into another layout has another fingerprint: its tables are not re-used.
    # The same images from the same files: the masks and sheet of the last run, unless a mask
    # was removed by hand or by `radharmony verify` (damaged): the stage writes it again.
    table, metadata = reused_or_built(
        context,
        OUTPUT,
        fingerprint,
        root,
        lambda: _mask_table(context, source, split, raw_index, root, run_settings, listed),
        still_there=lambda table: _every_mask_present(root, folder, table, listed),
    )
    fail_if_strict(table, run_settings.strict, "masks")
    yield from selected_output(context, "masks", table, metadata)
    yield from check_results(
        context.selected_asset_check_keys,
        source,
        split,
        {"masks": table, "labels": labels, "raw_index": raw_index},
        root,
        run_settings.strict,
        kept_validation(suite_validation.validator(), root, context.partition_key),
    )


def _every_mask_present(
    root: OutputPath, folder: str, table: pd.DataFrame, listed: set[str] | None
) -> bool:
    """Whether every mask file `table` names exists (one listing of the partition's masks,
    the step's own when it took one)."""
    found = listing(root / folder) if listed is None else listed
    present = {f"{folder}/{relative}" for relative in found}
    named = table["mask_path"].dropna()
    return bool(named.isin(present).all())


def _names_by_folder(folder: str, listed: set[str] | None) -> dict[str, set[str]] | None:
    """The listed files' names by their folder's path relative to the root."""
    if listed is None:
        return None
    by_folder: dict[str, set[str]] = {}
    for relative in listed:
        parent, _, name = f"{folder}/{relative}".rpartition("/")
        by_folder.setdefault(parent, set()).add(name)
    return by_folder


def _mask_table(
    context: dg.AssetExecutionContext,
    source: DatasetSource,
    split: str,
    raw_index: pd.DataFrame,
    root: OutputPath,
    run_settings: RunSettingsResource,
    listed: set[str] | None,
) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Every segmented image's masks written (unchanged ones left alone), their table and
    the stage's metadata (counts and the contact sheet). `listed`: the partition's mask
    files (relative to its folder) when the step listed them."""
    partition = context.partition_key
    folder = mask_folder(partition)
    usable = raw_index["status"] == STATUS_OK
    # Only images the dataset segments get masks (and an `any` row): a lateral view or an
    # image of a dataset without masks is "not annotated", never an all-zero negative.
    segmented = raw_index[(usable & source.localizable_images(raw_index)).to_numpy()]
    by_image = _names_by_folder(folder, listed)

    def target(key: str) -> MaskTarget:
        image_folder = image_mask_folder(partition, key)
        names = None if by_image is None else frozenset(by_image.get(image_folder, ()))
        return MaskTarget(root, image_folder, names)

    jobs = source.mask_jobs(split, segmented, target)
    progress = ProgressLog(context.log, "images", len(jobs))
    # Bounds every image, on the local pool and on a Dask cluster alike.
    rows = map_per_image_with_time_limit(
        run_mask_job,
        jobs,
        run_settings.executor(),
        run_settings.time_limit(mask_job_stopped),
        progress.update,
    )
    # A killed worker (time limit) leaves its temporary PNG behind.
    remove_orphaned_temporaries(root / folder)
    carried = carried_index_errors(raw_index[~usable]) if source.mask_classes else []
    table = mask_table([*(row for image_rows in rows for row in image_rows), *carried])
    fail_if_strict(table, run_settings.strict, "masks")
    metadata = {
        "images": len(jobs),
        "masks_written": int(table["written"].sum()),
        "masks_unchanged": int((~table["written"] & table["mask_path"].notna()).sum()),
        "status": dg.MetadataValue.json(status_counts(table)),
    }
    # Every partition gets a sheet: without masks it shows the images themselves.
    metadata.update(mask_preview(source, split, raw_index, table, root, partition))
    return table.drop(columns="written"), metadata
