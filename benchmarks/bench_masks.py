"""Benchmark: building masks, CheXlocalize's RLE unions (`union`) and ChestX-Det's masks on
one core and on all (`chestx_det`)."""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np
from common import Table, add_options, per_item, write_table
from pycocotools import mask as coco_mask

from radharmony_pipeline.processing.annotations.masks import decode_rle, union_rle_masks

# CheXlocalize images are full-resolution CheXpert JPEGs; 2828 x 2320 is a common size.
CHEXLOCALIZE_HEIGHT, CHEXLOCALIZE_WIDTH = 2828, 2320
PATHOLOGIES_PER_IMAGE = 10  # every gt_segmentations entry holds all ten
ABSENT_PROBABILITY = 0.3  # absent findings are all-zero RLEs
BLOB_AREA_RANGE = (0.02, 0.20)  # fraction of the image per blob
BLOBS_PER_FINDING = (1, 3)
UNION_TARGET_RATIO = 10.0
PARALLEL_TARGET_RATIO = 1.8
CHESTX_DET_REPEATS = 10
REPEATS = 3  # best of three, so one noisy pass does not decide the ratio


@dataclass(frozen=True)
class RleImage:
    """The ten RLEs of one CheXlocalize image, as they come out of the JSON."""

    height: int
    width: int
    rles: list[dict]


# --- synthetic CheXlocalize RLEs -----------------------------------------------------------


def draw_blob(mask: np.ndarray, rng: np.random.Generator, area_fraction: float) -> None:
    """Fill one rotated ellipse of about `area_fraction` of the image, inside the frame."""
    height, width = mask.shape
    area = area_fraction * height * width
    aspect = rng.uniform(0.5, 2.0)
    semi_x = math.sqrt(area * aspect / math.pi)
    semi_y = area / (math.pi * semi_x)
    margin = int(max(semi_x, semi_y) * 0.6)
    centre = (
        int(rng.integers(margin, max(margin + 1, width - margin))),
        int(rng.integers(margin, max(margin + 1, height - margin))),
    )
    axes = (round(semi_x), round(semi_y))
    cv2.ellipse(mask, centre, axes, float(rng.uniform(0, 180)), 0, 360, 1, thickness=-1)


def finding_mask(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    mask = np.zeros((height, width), dtype=np.uint8)
    if rng.random() < ABSENT_PROBABILITY:
        return mask
    for _ in range(int(rng.integers(BLOBS_PER_FINDING[0], BLOBS_PER_FINDING[1] + 1))):
        draw_blob(mask, rng, float(rng.uniform(*BLOB_AREA_RANGE)))
    return mask


def json_rle(mask: np.ndarray) -> dict:
    """As in gt_segmentations_*.json: pycocotools encoding, counts decoded to str."""
    rle = coco_mask.encode(np.asfortranarray(mask))
    return {"size": list(rle["size"]), "counts": rle["counts"].decode("ascii")}


def build_rle_images(count: int, seed: int) -> list[RleImage]:
    rng = np.random.default_rng(seed)
    height, width = CHEXLOCALIZE_HEIGHT, CHEXLOCALIZE_WIDTH
    return [
        RleImage(
            height,
            width,
            [json_rle(finding_mask(rng, height, width)) for _ in range(PATHOLOGIES_PER_IMAGE)],
        )
        for _ in range(count)
    ]


# --- timing --------------------------------------------------------------------------------


def decode_each_then_or(rles: Sequence[dict], height: int, width: int) -> np.ndarray:
    """The baseline: decode every mask at full resolution and OR them one by one."""
    union = np.zeros((height, width), dtype=np.uint8)
    for rle in rles:
        union |= decode_rle(rle)
    return union


UnionFunction = Callable[[Sequence[dict], int, int], np.ndarray]


def seconds_per_image(union: UnionFunction, images: Sequence[RleImage], repeats: int) -> float:
    """Best of `repeats` passes over all images, per image."""
    return per_item(lambda image: union(image.rles, image.height, image.width), images, repeats)


def check_unions_agree(images: Sequence[RleImage]) -> None:
    for index, image in enumerate(images):
        merged = union_rle_masks(image.rles, image.height, image.width)
        baseline = decode_each_then_or(image.rles, image.height, image.width)
        if not np.array_equal(merged, baseline):
            raise SystemExit(f"union: image {index}: merge-then-decode differs from baseline")


def describe_rle_images(images: Sequence[RleImage]) -> str:
    rles = [rle for image in images for rle in image.rles]
    areas = coco_mask.area([{"size": r["size"], "counts": r["counts"].encode()} for r in rles])
    present = areas[areas > 0] / (images[0].height * images[0].width)
    return (
        f"union: {len(images)} images of {images[0].height}x{images[0].width}, "
        f"{PATHOLOGIES_PER_IMAGE} RLEs each ({len(rles) - len(present)} of {len(rles)} empty), "
        f"positive findings cover {present.min():.1%}-{present.max():.1%} "
        f"(mean {present.mean():.1%})"
    )


def union_section(args: argparse.Namespace) -> list[object]:
    """CheXlocalize-sized RLEs built here (2828 x 2320, 10 pathologies per image: smooth
    elliptical blobs covering 2-20 % each, some findings absent as empty RLEs), then
    union_rle_masks (merge the RLEs, decode once) against decoding every mask and OR-ing
    them, on the same data, both checked equal. Target: at least 10x."""
    images = build_rle_images(args.images, args.seed)
    check_unions_agree(images)  # also warms both code paths up
    repeats = 1 if args.smoke else REPEATS
    merged = seconds_per_image(union_rle_masks, images, repeats)
    baseline = seconds_per_image(decode_each_then_or, images, repeats)
    print(describe_rle_images(images), flush=True)
    return [
        f"union of {PATHOLOGIES_PER_IMAGE} CheXlocalize-sized RLEs: merge-then-decode vs "
        "decode-then-OR",
        f"{merged:.3f} vs {baseline:.3f} s/image: {baseline / merged:.1f}×",
        f"≥ {UNION_TARGET_RATIO:g}×",
        {"merge_then_decode": merged, "decode_then_or": baseline, "images": len(images)},
    ]


# --- ChestX-Det masks throughput -----------------------------------------------------------


def chestx_det_section(args: argparse.Namespace) -> list[object]:
    """A small synthetic ChestX-Det train split's masks (read each 1024² PNG, fill every
    class's polygons, write class and union PNGs), into fresh folders, on one worker and on
    all cores, as the asset runs them. Target: at least 1.8x on 2 cores."""
    from radharmony_pipeline.processing.execution.parallel import map_with_time_limit
    from radharmony_pipeline.processing.execution.supervised import TimeLimit
    from radharmony_pipeline.processing.jobs.mask_jobs import (
        MaskTarget,
        mask_job_stopped,
        run_mask_job,
    )
    from radharmony_pipeline.settings import TIMEOUT_VARIABLE, job_timeout
    from radharmony_pipeline.sources import open_source
    from radharmony_pipeline.synthetic import generate_datasets

    cores = os.cpu_count() or 1
    repeats = 1 if args.smoke else CHESTX_DET_REPEATS
    with tempfile.TemporaryDirectory() as scratch:
        data = Path(scratch) / "data"
        scale = "tiny" if args.smoke else "small"
        generate_datasets(data, scale=scale, seed=args.seed, datasets=["chestx_det"])
        source = open_source("chestx_det", environ={"RADHARMONY_DATA_ROOT": str(data)})
        index = source.read_split("train").index

        def throughput(workers: int) -> float:
            output = Path(tempfile.mkdtemp(dir=scratch))  # fresh: every mask is written
            # A real split has thousands of images; repeat the small one (into separate
            # folders) so pool start-up weighs as little as it does on real data.
            jobs = [
                job
                for copy in range(repeats)
                for job in source.mask_jobs(
                    "train", index, lambda key, copy=copy: MaskTarget(output, f"{copy}/{key}")
                )
            ]
            start = time.perf_counter()
            # As the asset runs them: every image under the per-image time limit.
            limit = TimeLimit(job_timeout(os.environ), mask_job_stopped, TIMEOUT_VARIABLE)
            rows = map_with_time_limit(run_mask_job, jobs, workers, limit)
            elapsed = time.perf_counter() - start
            assert all(row.status == "ok" for image_rows in rows for row in image_rows)
            return len(jobs) / elapsed

        if not args.smoke:  # a smoke run's pool start is its cost either way
            throughput(cores)  # warm-up: worker start-up and page cache
        single = throughput(1)
        parallel = throughput(cores)
    return [
        f"ChestX-Det masks, {len(index) * repeats} images of 1024²: {cores} workers / 1",
        f"{parallel:.1f} vs {single:.1f} images/s: {parallel / single:.2f}×",
        f"≥ {PARALLEL_TARGET_RATIO:g}× on 2 cores",
        {"images": len(index) * repeats, "workers": cores, "rates": [single, parallel]},
    ]


# --- entry point ---------------------------------------------------------------------------

SECTIONS: dict[str, Callable[[argparse.Namespace], list[object]]] = {
    "union": union_section,
    "chestx_det": chestx_det_section,
}


def parse_arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--section",
        choices=sorted(SECTIONS),
        action="append",
        help="run only this section (repeatable); default: all",
    )
    parser.add_argument("--images", type=int, default=20, help="synthetic images per section")
    parser.add_argument("--seed", type=int, default=0)
    add_options(parser)
    args = parser.parse_args(argv)
    if args.smoke:
        args.images = 1
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_arguments(argv)
    rows, figures = [], {}
    for name in args.section or list(SECTIONS):
        *row, figures[name] = SECTIONS[name](args)
        print(" | ".join(row), flush=True)
        rows.append(row)
    title = "Masks: RLE union and ChestX-Det in parallel"
    sections = "".join(f" --section {name}" for name in args.section or [])
    table = Table(
        "masks", title, ["figure", "value", "target"], rows, figures, "", sections.strip()
    )
    write_table(args, table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
