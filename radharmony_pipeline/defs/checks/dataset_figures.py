"""Figures measured over a whole dataset's outputs: the ChestX-Det card's overlap table,
measured on the pipeline's own per-class masks, and the count of RGBA source images."""

from pathlib import Path

import dagster as dg
import pandas as pd

from ...processing.annotations.mask_overlap import (
    ImageOverlap,
    alpha_images,
    overlap_figures,
    overlap_of_files,
)
from ...processing.execution.parallel import map_in_chunks
from ...processing.storage.output_layout import table_file
from ...sources.base import DatasetSource
from ...sources.chestx_det import ChestXDetSource
from ...sources.counts import (
    CountComparison,
    ExpectedCounts,
    compare_counts,
    is_dataset_metric,
)
from ...vocabulary import STATUS_OK, UNION_CLASS
from ..io_managers import read_table_file
from ..resources import DatasetsResource, OutputsResource
from ..run_settings import RunSettingsResource
from .manifest import complete_datasets, figures_result

ALPHA_METRIC = "rgba_images"
PAIR_IMAGES = "overlap.pair_images."
PAIR_OVERLAP = "overlap.pair_overlap_images."


def card_figures(counts: ExpectedCounts) -> str:
    """The ChestX-Det card's figures as the check's description states them, from the one place
    they are written (the reader's documented counts)."""
    total = counts.total
    pair_names = [m.removeprefix(PAIR_IMAGES) for m in total if m.startswith(PAIR_IMAGES)]
    pairs = [
        f"{pair} {total[PAIR_OVERLAP + pair]:,} of {total[PAIR_IMAGES + pair]:,}"
        for pair in pair_names
    ]
    per_split = " / ".join(f"{counts.for_split(s)[ALPHA_METRIC]} {s}" for s in counts.splits)
    return (
        f"{total['overlap.multi_class_images']:,} multi-class images, "
        f"{total['overlap.pixel_overlap_images']:,} with pixel overlap, mean pairwise IoU "
        f"{total['overlap.mean_pair_iou_permille'] / 1000:.3f}, {', '.join(pairs)}, "
        f"{total['overlap.small_mask_permille'] / 10:.1f} % of masks under 0.5 % of the frame, "
        f"median {total['overlap.median_mask_area_permille'] / 10:.1f} %; "
        f"{total[ALPHA_METRIC]} RGBA source PNGs ({per_split})"
    )


@dg.asset_check(
    asset="unified_manifest",
    blocking=True,
    description="Dataset-wide figures equal the documentation once every split is in: "
    "ChestX-Det's overlap table measured on the per-class masks and its RGBA source PNGs ("
    + card_figures(ChestXDetSource.documented_counts)
    + ").",
)
def dataset_figures_match_documentation(
    unified_manifest: pd.DataFrame,
    datasets: DatasetsResource,
    outputs: OutputsResource,
    run_settings: RunSettingsResource,
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
        metrics = {*wanted, *split_wanted}
        found = measured_figures(source, rows, outputs.root(), metrics, run_settings.workers)
        comparisons[key] = [
            CountComparison(f"{key}: {c.metric}", c.expected, c.found)
            for c in compare_counts({**wanted, **split_wanted}, found)
        ]
        found_by_dataset[key] = found
    return figures_result(comparisons, datasets, pending, found_by_dataset)


def measured_figures(
    source: DatasetSource, rows: pd.DataFrame, root: Path, metrics: set[str], workers: int
) -> dict[str, int]:
    """The dataset-wide figures that `metrics` asks for (each is costly: measured on demand)."""
    found: dict[str, int] = {}
    if any(m.startswith("overlap.") for m in metrics):
        found.update(_overlap(source, root, workers))
    if any(m.endswith(ALPHA_METRIC) for m in metrics):
        for split, split_rows in rows.groupby("split"):
            base = source.image_dir(str(split))
            found[f"{split}.{ALPHA_METRIC}"] = alpha_images(
                base / path for path in split_rows["source_image_path"]
            )
        found[ALPHA_METRIC] = sum(v for k, v in found.items() if k.endswith(ALPHA_METRIC))
    return found


def _overlap(source: DatasetSource, root: Path, workers: int) -> dict[str, int]:
    tables = [
        read_table_file(table_file(root, "masks", f"{source.key}.{split}"))
        for split in source.splits
    ]
    masks = pd.concat(tables, ignore_index=True)
    classes = masks[(masks["status"] == STATUS_OK) & (masks["mask_class"] != UNION_CLASS)]
    per_image = [
        dict(zip(group["mask_class"], (root / p for p in group["mask_path"]), strict=True))
        for _, group in classes.groupby("image_id")
    ]
    # Only images with two or more classes need their pixels read.
    several = [files for files in per_image if len(files) > 1]
    measured = map_in_chunks(overlap_of_files, several, workers)
    single = [ImageOverlap(tuple(files), ()) for files in per_image if len(files) == 1]
    return overlap_figures([*measured, *single], classes["area_fraction"].tolist())
