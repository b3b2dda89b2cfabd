"""Benchmark: is the `images` stage near its floor? Per source format (`formats`), on
full-resolution JPEGs (`jpeg`), and as a Dagster step against its work alone (`step`)."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from common import (
    WARMUP_IMAGES,
    Table,
    add_options,
    load_line,
    machine_line,
    run_stage,
    write_table,
)
from PIL import Image
from synthetic_inputs import DEFAULT_NOISE, JPEG_QUALITY, prepare_jpeg_sources

from radharmony_pipeline.processing.jobs.image_jobs import ImageRow, image_table

# Every pool worker re-imports this module (as __mp_main__) before it runs a job, so its top
# level holds only imports and definitions, and the sections' modules are imported in main.
SMOKE_SHAPE = (420, 340)  # --smoke: small JPEGs, figures meaningless
SECTIONS = ("formats", "jpeg", "step")
TARGETS = {"stage / naive loop": 2.5, "first run / re-run": 20.0, "stage / MONAI": 10.0}


def describe_sources(paths: Sequence[Path]) -> tuple[str, str]:
    """The JPEGs described, and their median width × height."""
    sizes = []
    for path in paths:
        with Image.open(path) as image:
            sizes.append(image.size)
    widths, heights = zip(*sizes, strict=True)
    megabytes = [path.stat().st_size / 1e6 for path in paths]
    return (
        f"{len(paths)} grayscale JPEGs (quality {JPEG_QUALITY}), "
        f"{min(widths)}-{max(widths)} x {min(heights)}-{max(heights)} px, "
        f"{np.mean(megabytes):.2f} MB mean ({min(megabytes):.2f}-{max(megabytes):.2f})",
        f"{np.median(widths):.0f}×{np.median(heights):.0f}",
    )


def decoded_count(rows: Sequence[ImageRow]) -> int:
    return int(image_table(rows)["decoded"].sum())


def mean_difference(stage: np.ndarray, naive_folder: Path, sources: Sequence[Path]) -> float:
    """Mean |stage - naive| in grey levels over all pixels: both must do the same job."""
    naive = []
    for source in sources:
        with Image.open(naive_folder / f"{source.stem}.png") as image:
            naive.append(np.asarray(image))
    return float(np.abs(stage.astype(np.int16) - np.stack(naive).astype(np.int16)).mean())


def pool_start_seconds(count: int, workers: int) -> float:
    """The supervised pool (as the stage runs it) over `count` items doing nothing: the
    pool's own cost in a timed run. A run cannot keep a pool alive (map_with_time_limit
    starts and stops its workers per call) and the asset pays it once per partition."""
    from radharmony_pipeline.processing.execution.parallel import map_with_time_limit
    from radharmony_pipeline.processing.execution.supervised import TimeLimit
    from radharmony_pipeline.settings import job_timeout

    limit = TimeLimit(job_timeout(os.environ), lambda item, reason: reason)
    start = time.perf_counter()
    map_with_time_limit(abs, list(range(count)), workers, limit)
    return time.perf_counter() - start


def per_image_ms(seconds: float, count: int) -> str:
    return f"{1000 * seconds / count:.1f} ms"


def verdict(name: str, ratio: float | None) -> str:
    target = TARGETS[name]
    if ratio is None:
        return f"   {name}: not measured (target >= {target:g}x)"
    return (
        f"   {name}: {ratio:.2f}x, target >= {target:g}x: {'PASS' if ratio >= target else 'FAIL'}"
    )


def jpeg_section(args: argparse.Namespace, images: int) -> Table:
    """`images` JPEGs (CheXpert-like: ~2300 x 2800, quality 90, detector noise) on all cores:
    the stage's throughput against the naive single-process loop (full decode, INTER_AREA
    letterbox, Pillow PNG; target >= 2.5x on 2 cores), an unchanged re-run against the first
    run (>= 20x, 0 decoded, the same array) and MONAI when installed (>= 10x). Every path
    gets an untimed warm-up first; CPU per image is printed beside wall (load moves it less)."""
    from baselines import monai_chain, naive_pillow_pixels, run_monai, run_naive

    workers = os.cpu_count() or 1
    with tempfile.TemporaryDirectory(prefix="bench_images_") as scratch_name:
        scratch = Path(scratch_name)
        source_folder = args.keep or scratch / "sources"
        shape = SMOKE_SHAPE if args.smoke else None
        sources, written, seconds = prepare_jpeg_sources(source_folder, images, args.noise, shape)
        origin = f"wrote {written} in {seconds:.1f} s" if written else "all reused"
        described, median_size = describe_sources(sources)
        print(f"sources: {described}; {source_folder}: {origin}", flush=True)
        chain = None if args.smoke else monai_chain("PILReader")  # torch's import: seconds
        # Untimed: starts the fork server (once per process, as in a Dagster step), fills the
        # page cache, loads codec plugins and lazy imports on the single-process paths. A
        # smoke run's figures mean nothing: it has none.
        start, few = time.perf_counter(), sources[: 0 if args.smoke else WARMUP_IMAGES]
        if few:
            run_stage(few, scratch / "warmup-stage", workers)
            run_naive(naive_pillow_pixels, few, scratch / "warmup-naive", False)
        if chain is not None:
            run_monai(chain, few)
        print(f"warm-up: {time.perf_counter() - start:.2f} s over {len(few)} images (untimed)")
        print(f"start: {load_line()}", flush=True)
        naive_seconds, naive_cpu = run_naive(naive_pillow_pixels, sources, scratch / "naive", False)
        first = run_stage(sources, scratch / "stage", workers)  # fresh: nothing to reuse
        first_packed = np.load(first.packed)  # the re-run replaces this file
        rerun = run_stage(sources, scratch / "stage", workers)
        count = len(sources)
        stage_rate, naive_rate = count / first.seconds, count / naive_seconds
        ratios = {
            "stage / naive loop": stage_rate / naive_rate,
            "first run / re-run": first.seconds / rerun.seconds,
            "stage / MONAI": None,
        }
        difference = mean_difference(first_packed, scratch / "naive", sources)
        identical = np.array_equal(first_packed, np.load(rerun.packed))
        decoded = (decoded_count(first.rows), decoded_count(rerun.rows))
        pool = pool_start_seconds(count, workers)
        print(
            f"1. throughput: stage {stage_rate:.1f} images/s ({workers} workers), naive loop "
            f"{naive_rate:.1f} images/s: {ratios['stage / naive loop']:.2f}x; mean |stage - "
            f"naive| {difference:.2f} grey levels; CPU per image: stage "
            f"{per_image_ms(first.cpu_seconds, count)} (parent and workers), naive "
            f"{per_image_ms(naive_cpu, count)}\n2. unchanged re-run: {first.seconds:.3f} s "
            f"({decoded[0]} decoded) -> {rerun.seconds:.3f} s ({decoded[1]} decoded): "
            f"{ratios['first run / re-run']:.1f}x; packed array identical: "
            f"{'yes' if identical else 'NO'}; both include starting the pool: over {count} "
            f"no-op items it takes {pool:.3f} s",
            flush=True,
        )
        monai_text = "skipped (--smoke)" if args.smoke else "not installed (`make install-bench`)"
        if chain is not None:
            monai_seconds, monai_cpu = run_monai(chain, sources)
            ratios["stage / MONAI"] = stage_rate / (count / monai_seconds)
            monai_text = (
                f"{ratios['stage / MONAI']:.2f}×: MONAI {count / monai_seconds:.1f} images/s, "
                f"CPU per image {per_image_ms(monai_cpu, count)}"
            )
        print(f"3. stage / MONAI (1 process, in memory): {monai_text}")
    print(f"end: {load_line()}\ntargets:", *(verdict(n, r) for n, r in ratios.items()), sep="\n")
    rows = [
        [
            f"stage / naive single-process loop ({count} JPEGs ~{median_size})",
            f"{stage_rate:.1f} vs {naive_rate:.1f} images/s: {ratios['stage / naive loop']:.2f}×",
            "≥ 2.5×",
        ],
        [
            "CPU per image",
            f"stage {per_image_ms(first.cpu_seconds, count)}, naive "
            f"{per_image_ms(naive_cpu, count)}",
            "",
        ],
        [
            "re-run of the unchanged partition",
            f"{first.seconds:.3f} s → {rerun.seconds:.3f} s: {ratios['first run / re-run']:.0f}×, "
            f"{decoded[1]} decoded, array {'identical' if identical else 'DIFFERENT'}",
            "≥ 20×",
        ],
        ["stage / MONAI (bench extra)", monai_text, "≥ 10×"],
    ]
    figures = {
        "images": count,
        "workers": workers,
        "stage_seconds": first.seconds,
        "naive_seconds": naive_seconds,
        "rerun_seconds": rerun.seconds,
        "stage_cpu": first.cpu_seconds,
        "naive_cpu": naive_cpu,
        "pool_start": pool,
        "ratios": ratios,
        "decoded": decoded,
        "identical": identical,
    }
    note = f"{workers} workers; the pool's own start over {count} no-op items: {pool:.3f} s."
    return Table(
        "images_jpeg",
        "The `images` stage on full-resolution JPEGs",
        ["figure", "value", "target"],
        rows,
        figures,
        note,
        "--sections jpeg",
    )


def parse_arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--sections",
        help=f"comma-separated, of {', '.join(SECTIONS)} (default formats,jpeg)",
    )
    parser.add_argument("--images", type=int, help="jpeg: JPEGs (>= 100, 120); step: 6000")
    parser.add_argument("--keep", type=Path, metavar="DIR", help="reuse the sources kept here")
    parser.add_argument("--noise", type=float, default=DEFAULT_NOISE, help="jpeg: new files'")
    parser.add_argument("--repeats", type=int, help="formats: runs per figure (2); step: 3")
    parser.add_argument("--scale", type=float, default=1.0, help="formats: image counts times")
    parser.add_argument("--only", default="", help="formats: keys; step: 'small ~190²' or ...")
    add_options(parser)
    args = parser.parse_args(argv)
    # A smoke run leaves out `step` unless named: a Dagster run costs seconds before any work.
    args.sections = args.sections or "formats,jpeg"
    sections = args.sections.split(",")
    if set(sections) - set(SECTIONS):
        parser.error(f"unknown --sections {sorted(set(sections) - set(SECTIONS))}")
    if args.smoke:  # a few small images, once; one cheap format
        args.repeats, args.scale = 1, 8 / 48
        args.images, args.only = 8, "png8-rex"
    elif args.images is not None and args.images < 100 and "jpeg" in sections:
        parser.error("--images must be at least 100")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_arguments(argv)
    print(machine_line(), flush=True)
    sections, passed = args.sections.split(","), True
    if "formats" in sections:
        from images.formats import run_formats

        print("every source format:", flush=True)
        keep = args.keep / "formats" if args.keep else None
        write_table(args, run_formats(keep, args.repeats or 2, args.scale, args.only, args.smoke))
    if "jpeg" in sections:
        print("CheXpert-like JPEGs: throughput, re-run, MONAI:", flush=True)
        write_table(args, jpeg_section(args, args.images or 120))
    if "step" in sections:
        from images.step import IMAGE_SIZES, TARGET, run_step_section

        print("the images step against its work alone:", flush=True)
        only = "small ~190²" if args.smoke else (args.only if args.only in IMAGE_SIZES else None)
        os.environ["RADHARMONY_WORKERS"] = "2"
        step = run_step_section(args.images or 6000, args.repeats or 3, only, args.smoke)
        write_table(args, step)
        passed = args.smoke or all(size["ratio"] <= TARGET for size in step.figures.values())
    return 0 if passed else 1


if __name__ == "__main__":
    # Required: the pool's forkserver/spawn start methods re-import this module in other
    # processes, which must not run the benchmark again.
    sys.exit(main())
