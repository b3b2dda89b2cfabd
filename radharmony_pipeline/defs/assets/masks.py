"""`masks`: per-class and unioned binary masks at native resolution (PNG), and their table."""

import dagster as dg
import pandas as pd

from ...processing.cluster import map_per_image, worker_slots
from ...processing.mask_jobs import MASK_CODE_VERSION, MaskTarget, mask_table, run_mask_job
from ...processing.progress import ProgressLog
from ...sources import parse_partition_key
from ..automation import REBUILD_WHEN_CHANGED
from ..metadata import status_counts
from ..partitions import OWNERS, dataset_split_partitions
from ..resources import DatasetsResource, OutputsResource
from .previews import mask_preview


@dg.asset(
    partitions_def=dataset_split_partitions,
    owners=OWNERS,
    group_name="masks",
    description=(
        "Binary masks at the source image's native resolution, written as 0/255 PNGs under "
        "`masks/<partition>/<image_key>/<class>.png`: one per class present (unified names, "
        "`Airspace Opacity` → `lung_opacity`) and the union `any` for every image of a dataset "
        "with masks (all-zero when nothing is found). CheXlocalize RLEs are unioned by merging "
        "before one decode; ChestX-Det polygons are filled per class, overlaps kept. Unchanged "
        "masks are not rewritten. Datasets without masks give an empty table."
    ),
    automation_condition=REBUILD_WHEN_CHANGED,
    code_version=MASK_CODE_VERSION,
    kinds={"png", "parquet"},
    pool="heavy_image_work",
)
def masks(
    context: dg.AssetExecutionContext,
    raw_index: pd.DataFrame,
    datasets: DatasetsResource,
    outputs: OutputsResource,
) -> dg.Output[pd.DataFrame]:
    dataset, split = parse_partition_key(context.partition_key)
    source = datasets.source(dataset)
    root = outputs.root()
    folder = f"masks/{context.partition_key}"
    jobs = source.mask_jobs(split, raw_index, lambda key: MaskTarget(root, f"{folder}/{key}"))
    progress = ProgressLog(context.log, "images", len(jobs))
    rows = map_per_image(run_mask_job, jobs, worker_slots(), progress.update)
    table = mask_table([row for image_rows in rows for row in image_rows])
    metadata = {
        "images": len(jobs),
        "masks_written": int(table["written"].sum()),
        "masks_unchanged": int((~table["written"] & table["mask_path"].notna()).sum()),
        "status": dg.MetadataValue.json(status_counts(table)),
    }
    if len(table):
        metadata.update(mask_preview(source, split, raw_index, table, root, context.partition_key))
    return dg.Output(table.drop(columns="written"), metadata=metadata)
