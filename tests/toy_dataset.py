"""A fifth dataset that exists only in the test suite: a CSV of nodule boxes over a few PNGs.

`python tests/toy_dataset.py <data_root> <output_root>` registers it (the one registry line a
new dataset needs), then materializes every partitioned stage of each of its splits and the
manifest through the project's own definitions, and prints a JSON summary. The toy has no
synthetic generator: the synthetic data the demo and the fixtures write goes on without it.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

import dagster as dg
import numpy as np
import pandas as pd
from PIL import Image

from radharmony_pipeline.processing.jobs.mask_jobs import MaskTarget, PolygonMaskJob
from radharmony_pipeline.processing.tables.table_schemas import STRING, extra
from radharmony_pipeline.sources import SOURCE_TYPES, SourceLocation
from radharmony_pipeline.sources.base import (
    DatasetSource,
    SplitTables,
    empty_phrase_lists,
    index_frame,
    label_frame,
    read_csv,
)
from radharmony_pipeline.sources.counts import ExpectedCounts
from radharmony_pipeline.sources.views import normalize_view_positions

FOLDER = "toy-cxr"
CSV_NAME = "nodules.csv"
# (image name, split, height, width, nodule box x, y, w, h; w = 0 means no nodule)
IMAGES = (
    ("a1", "train", 300, 240, 40, 60, 50, 40),
    ("a2", "train", 260, 320, 100, 30, 60, 70),
    ("a3", "train", 280, 280, 0, 0, 0, 0),
    ("b1", "test", 320, 200, 20, 200, 80, 60),
    ("b2", "test", 240, 300, 150, 90, 40, 40),
)
# The dataset's own label column, which the shared labels declaration does not name.
NATIVE_COLUMN = "nodule_size"


def nodule_size(w: int, h: int) -> str | None:
    """The toy's native grading of a nodule box: `large` from 2500 px², null without one."""
    if w == 0:
        return None
    return "large" if w * h >= 2500 else "small"


def write_toy_dataset(data_root: Path) -> Path:
    """The toy download: PNG radiographs in `<split>/` and one CSV of boxes."""
    root = data_root / FOLDER
    rng = np.random.default_rng(5)
    rows = []
    for name, split, height, width, x, y, w, h in IMAGES:
        (root / split).mkdir(parents=True, exist_ok=True)
        pixels = rng.integers(30, 220, (height, width), dtype=np.uint8)
        Image.fromarray(pixels, "L").save(root / split / f"{name}.png")
        rows.append(
            {
                "image": f"{name}.png",
                "split": split,
                "height": height,
                "width": width,
                "x": x,
                "y": y,
                "w": w,
                "h": h,
                NATIVE_COLUMN: nodule_size(w, h),
            }
        )
    pd.DataFrame(rows).to_csv(root / CSV_NAME, index=False)
    return root


def _split_counts(split: str) -> dict[str, int]:
    mine = [row for row in IMAGES if row[1] == split]
    with_nodule = sum(1 for row in mine if row[6] > 0)
    return {"images": len(mine), "annotations": with_nodule, "images_with_masks": with_nodule}


class ToySource(DatasetSource):
    """Toy CXR: one optional nodule per image, given as a box (also drawn as its mask)."""

    key = "toy_cxr"
    splits = ("train", "test")
    env_vars = {"root": "RADHARMONY_TOY_CXR_ROOT"}
    layout = f"{FOLDER}/\n  {CSV_NAME}\n  train/<image>.png\n  test/<image>.png"
    documented_counts = ExpectedCounts(
        origin="the toy dataset's own table",
        splits={split: _split_counts(split) for split in ("train", "test")},
        total={
            "images": len(IMAGES),
            "annotations": sum(1 for row in IMAGES if row[6] > 0),
            "class_images.nodule": sum(1 for row in IMAGES if row[6] > 0),
        },
    )
    mask_classes = ("nodule",)
    has_boxes = True
    label_extras = (extra(NATIVE_COLUMN, STRING, "Toy CXR: the nodule's size grade, as given"),)

    def __init__(self, location: SourceLocation, data_root: Path):
        self._root = location.root or data_root / FOLDER

    @property
    def root(self) -> Path:
        return self._root

    def annotation_files(self, split: str) -> list[Path]:
        return [self._root / CSV_NAME]

    def image_dir(self, split: str) -> Path:
        self.check_split(split)
        return self._root / split

    def _rows(self, split: str) -> pd.DataFrame:
        self.check_split(split)
        table = read_csv(self.require(self._root / CSV_NAME, "toy CSV"))
        return table[table["split"] == split].reset_index(drop=True)

    def read_split(self, split: str) -> SplitTables:
        rows = self._rows(split)
        unknown = pd.Series(pd.NA, index=rows.index, dtype="string")
        index = index_frame(
            self.key,
            split,
            {
                "native_id": rows["image"].str.removesuffix(".png"),
                "patient_id": unknown,
                "study_id": unknown,
                "image_path": rows["image"],
                "view_position": normalize_view_positions(unknown),
                "view_position_raw": unknown,
                "source_height": rows["height"],
                "source_width": rows["width"],
            },
        )
        labels = label_frame(
            index["image_id"],
            {
                "report": pd.array([None] * len(rows), dtype="string"),
                "label_text": empty_phrase_lists(len(rows)),
                NATIVE_COLUMN: rows[NATIVE_COLUMN].astype("string"),
                "label_nodule": (rows["w"] > 0).astype(int).to_numpy(),
            },
        )
        return SplitTables(index=index, labels=labels)

    def count_metrics(self, tables: SplitTables) -> dict[str, int]:
        return {
            "images": len(tables.index),
            "annotations": int(tables.labels["label_nodule"].sum()),
        }

    def mask_jobs(
        self, split: str, index: pd.DataFrame, target_for: Callable[[str], MaskTarget]
    ) -> list[PolygonMaskJob]:
        rows = self._rows(split).set_index(index["image_id"].to_numpy())
        jobs = []
        for image_id, image_key, relative in index[
            ["image_id", "image_key", "image_path"]
        ].itertuples(index=False):
            row = rows.loc[image_id]
            x, y, w, h = (int(row[c]) for c in ("x", "y", "w", "h"))
            corners = [[x, y], [x + w, y], [x + w, y + h], [x, y + h]]
            polygons = {"nodule": [corners]} if w > 0 else {}
            frame = (int(row["height"]), int(row["width"]))
            jobs.append(
                PolygonMaskJob(
                    image_id,
                    self.image_dir(split) / relative,
                    target_for(image_key),
                    frame,
                    polygons,
                )
            )
        return jobs

    def read_boxes(self, split: str) -> pd.DataFrame:
        rows = self._rows(split)
        rows = rows[rows["w"] > 0]
        return pd.DataFrame(
            {
                "image_id": (f"{self.key}/" + rows["image"].str.removesuffix(".png")).astype(
                    "string"
                ),
                "box_index": 0,
                "label": pd.Series("nodule", index=rows.index, dtype="string"),
                "label_text": pd.Series(pd.NA, index=rows.index, dtype="string"),
                **{axis: rows[axis].astype(float) for axis in ("x", "y", "w", "h")},
                "frame_height": rows["height"].astype(float),
                "frame_width": rows["width"].astype(float),
            }
        ).reset_index(drop=True)


def main(data_root: str, output_root: str) -> int:
    SOURCE_TYPES[ToySource.key] = ToySource  # the registry line a new dataset adds

    from radharmony_pipeline.definitions import build_definitions
    from radharmony_pipeline.defs.resources import DatasetsResource

    defs = build_definitions(data_root, output_root)
    graph = defs.resolve_asset_graph()
    summary: dict[str, object] = {
        "partitions": graph.get(dg.AssetKey("images")).partitions_def.get_partition_keys(),
        "datasets_config": sorted(DatasetsResource.model_fields),
    }
    for split in ToySource.splits:
        partition = f"{ToySource.key}.{split}"
        result = defs.resolve_job_def("all_stages").execute_in_process(
            partition_key=partition, raise_on_error=False
        )
        summary[partition] = _outcome(result)
    summary["unified_manifest"] = _outcome(
        defs.resolve_job_def("manifest").execute_in_process(raise_on_error=False)
    )
    summary.update(_synthetic_data_without_the_toy(Path(output_root) / "synthetic"))
    print(json.dumps(summary))
    return 0


def _synthetic_data_without_the_toy(out: Path) -> dict[str, object]:
    """What the demo and the fixtures generate with the toy registered: the datasets that
    have a generator, and the partitions the demo then builds."""
    from radharmony_pipeline.synthetic import generate_datasets, generated_partitions

    refusal = "the toy was generated"
    try:
        generate_datasets(out, datasets=[ToySource.key])
    except ValueError as exc:
        refusal = str(exc)
    roots = generate_datasets(out, scale="tiny", seed=0)
    return {
        "synthetic": {dataset: str(root) for dataset, root in roots.items()},
        "demo_partitions": generated_partitions(),
        "toy_generation_refused": refusal,
    }


def _outcome(result) -> dict:
    return {
        "success": result.success,
        "materialized": sorted(
            e.materialization.asset_key.to_user_string()
            for e in result.get_asset_materialization_events()
        ),
        "checks": {e.check_name: e.passed for e in result.get_asset_check_evaluations()},
        # Checks against parent datasets the toy data has none of: warnings, not passes.
        "parent_not_configured": sorted(
            e.check_name
            for e in result.get_asset_check_evaluations()
            if "parent not configured" in (e.description or "")
        ),
    }


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
