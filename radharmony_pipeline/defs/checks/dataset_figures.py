"""Figures measured over a whole dataset's outputs: the ChestX-Det card's overlap table,
measured on the pipeline's own per-class masks, and the count of RGBA source images."""

from pathlib import Path

import dagster as dg
import pandas as pd

from ...processing.mask_overlap import (
    ImageOverlap,
    alpha_images,
    overlap_figures,
    overlap_of_files,
)
from ...processing.output_layout import table_file
from ...processing.parallel import map_in_chunks, worker_count
from ...sources.base import DatasetSource
from ...sources.counts import CountComparison, compare_counts, is_dataset_metric
from ..io_managers import read_table_file
from ..resources import DatasetsResource, OutputsResource
from .manifest import complete_datasets, figures_result

ALPHA_METRIC = "rgba_images"


@dg.asset_check(
    asset="unified_manifest",
    blocking=True,
    description="Dataset-wide figures equal the documentation once every split is in: "
    "ChestX-Det's overlap table measured on the per-class masks (2,006 multi-class images, "
    "1,357 with pixel overlap, mean pairwise IoU 0.272, Consolidation∩Effusion 770 of 1,028, "
    "Cardiomegaly∩Consolidation 148 of 158, 22.1 % of masks under 0.5 % of the frame, median "
    "2.5 %) and its 42 RGBA source PNGs (37 train / 5 test).",
)
def dataset_figures_match_documentation(
    unified_manifest: pd.DataFrame, datasets: DatasetsResource, outputs: OutputsResource
) -> dg.AssetCheckResult:
    complete, pending = complete_datasets(unified_manifest)
    comparisons, found_by_dataset = {}, {}
    for key, rows in complete.items():
        source = datasets.source(key)
        expected = source.expected_counts()
        wanted = {m: v for m, v in expected.total.items() if is_dataset_metric(m)}
        split_wanted = {
            f"{split}.{m}": v
            for split in source.splits
            for m, v in expected.for_split(split).items()
            if is_dataset_metric(m)
        }
        if not wanted and not split_wanted:
            continue
        found = measured_figures(source, rows, outputs.root(), {*wanted, *split_wanted})
        comparisons[key] = [
            CountComparison(f"{key}: {c.metric}", c.expected, c.found)
            for c in compare_counts({**wanted, **split_wanted}, found)
        ]
        found_by_dataset[key] = found
    return figures_result(comparisons, datasets, pending, found_by_dataset)


def measured_figures(
    source: DatasetSource, rows: pd.DataFrame, root: Path, metrics: set[str]
) -> dict[str, int]:
    """The dataset-wide figures that `metrics` asks for (each is costly: measured on demand)."""
    found: dict[str, int] = {}
    if any(m.startswith("overlap.") for m in metrics):
        found.update(_overlap(source, root))
    if any(m.endswith(ALPHA_METRIC) for m in metrics):
        for split, split_rows in rows.groupby("split"):
            base = source.image_dir(str(split))
            found[f"{split}.{ALPHA_METRIC}"] = alpha_images(
                base / path for path in split_rows["source_image_path"]
            )
        found[ALPHA_METRIC] = sum(v for k, v in found.items() if k.endswith(ALPHA_METRIC))
    return found


def _overlap(source: DatasetSource, root: Path) -> dict[str, int]:
    tables = [
        read_table_file(table_file(root, "masks", f"{source.key}.{split}"))
        for split in source.splits
    ]
    masks = pd.concat(tables, ignore_index=True)
    classes = masks[(masks["status"] == "ok") & (masks["mask_class"] != "any")]
    per_image = [
        dict(zip(group["mask_class"], (root / p for p in group["mask_path"]), strict=True))
        for _, group in classes.groupby("image_id")
    ]
    # Only images with two or more classes need their pixels read.
    several = [files for files in per_image if len(files) > 1]
    measured = map_in_chunks(overlap_of_files, several, worker_count())
    single = [ImageOverlap(tuple(files), ()) for files in per_image if len(files) == 1]
    return overlap_figures([*measured, *single], classes["area_fraction"].tolist())
