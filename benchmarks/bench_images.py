"""Benchmark: the `images` stage per source format against its floor, then on full-resolution
CheXpert-like JPEGs (throughput and re-run).

First (section `formats`) every source format the four datasets ship, one line each: floor,
the step's marginal CPU per image, ratio (PASS at <= 1.5x), naive-loop and MONAI ratios, then
the corpus projection; that section lives in image_formats.py (its docstring says how each figure
is measured). Then (section `jpeg`) it writes N synthetic radiographs once (default 120;
content from `render_radiograph` plus mild detector noise, portrait 2300-2400 x 2800-2900
pixels, baseline grayscale JPEG quality 90, seeded), then measures in the same run, on the
same files:

1. Stage throughput: jobs built as the `images` asset builds them (letterbox, S=224, fresh
   output folder, no union masks, packed temporary .npy then os.replace), run with
   build_packed_images(..., os.cpu_count(), time_limit=...) as the asset does, against a
   bare single-process loop doing the same job the naive way: full-resolution decode
   (Image.open(...).convert("L"), no draft), cv2.resize INTER_AREA of the long side to 224,
   zero padding to 224x224, PNG written with Pillow. Target: stage >= 2.5x the naive loop
   on 2 cores.
2. Re-run of the unchanged partition (same jobs and output folder, new packed temporary file)
   against the first run, and how many sources the re-run decoded. Targets: >= 20x faster,
   0 decoded.
3. If monai is importable (optional `bench` extra), a MONAI pipeline (LoadImage ->
   ScaleIntensityRangePercentiles(0.5, 99.5) -> Resize(224, size_mode="longest") ->
   SpatialPad(224x224)), single process, in memory, against the stage. Target: stage >= 10x.
   Without monai the section prints one line saying it was skipped (`make bench` installs
   the `bench` extra: MONAI with torch 2.13.0 CPU).

Each path gets one untimed warm-up pass over a few images first (see `warm_up`). Times are
wall-clock (time.perf_counter), one timed pass each. Wall-clock ratios suffer when other
programs share the machine, so every path also reports its CPU time per image (the stage's
summed over its worker processes), which load changes far less, and the load average is
printed at the start and the end. The last lines say which targets were met.

    .venv/bin/python benchmarks/bench_images.py [--images 120] [--keep DIR] [--noise 0.02]
        [--sections formats,jpeg] [--repeats 2] [--scale 1.0] [--only png16-rex,dicom] [--smoke]

--keep DIR reuses the JPEGs already in DIR (writing only missing ones, and leaving them there)
instead of generating them into a temporary folder that is deleted afterwards.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
from common import (
    DEFAULT_NOISE,
    JPEG_QUALITY,
    SIZE,
    WARMUP_IMAGES,
    StageRun,
    add_smoke,
    load_line,
    machine_line,
    monai_chain,
    naive_letterbox,
    prepare_jpeg_sources,
    run_stage,
)
from PIL import Image

from radharmony_pipeline.processing.execution.parallel import map_with_time_limit
from radharmony_pipeline.processing.execution.supervised import TimeLimit
from radharmony_pipeline.processing.jobs.image_jobs import (
    ImageRow,
    image_table,
)
from radharmony_pipeline.settings import job_timeout

# Every pool worker re-imports this module (as __mp_main__) before it runs a job, so its top
# level holds only imports and definitions; the benchmark itself runs under __main__.
# render_radiograph is smooth and compresses to ~0.2 MB; real full-resolution CheXpert JPEGs
# are ~2 MB (quantum mottle, fine texture). Entropy decoding, which no DCT scale skips, grows
# with the compressed size, so Gaussian noise of this standard deviation (in [0, 1] units,
# 0.02 ~ 5 grey levels) brings files to ~1.5 MB and decode cost close to the real thing.
SMOKE_SHAPE = (420, 340)  # --smoke: small JPEGs, figures meaningless

THROUGHPUT_TARGET = 2.5
RERUN_TARGET = 20.0
MONAI_TARGET = 10.0


# --- synthetic sources ---------------------------------------------------------------------


def describe_sources(paths: Sequence[Path]) -> str:
    sizes = []
    for path in paths:
        with Image.open(path) as image:
            sizes.append(image.size)
    widths, heights = zip(*sizes, strict=True)
    megabytes = [path.stat().st_size / 1e6 for path in paths]
    return (
        f"{len(paths)} grayscale JPEGs (quality {JPEG_QUALITY}), "
        f"{min(widths)}-{max(widths)} x {min(heights)}-{max(heights)} px, "
        f"{np.mean(megabytes):.2f} MB mean ({min(megabytes):.2f}-{max(megabytes):.2f})"
    )


# --- the images stage, as the asset runs it ------------------------------------------------


def decoded_count(rows: Sequence[ImageRow]) -> int:
    return int(image_table(rows)["decoded"].sum())


# --- the naive single-process loop ---------------------------------------------------------


def naive_letterbox_file(source: Path, output: Path) -> None:
    """Full decode, INTER_AREA of the long side to SIZE, centred zero padding, Pillow PNG."""
    with Image.open(source) as image:
        pixels = np.asarray(image.convert("L"))
    Image.fromarray(naive_letterbox(pixels)).save(output, format="PNG")


def run_naive(sources: Sequence[Path], folder: Path) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of the loop."""
    folder.mkdir(parents=True, exist_ok=True)
    start, cpu_start = time.perf_counter(), time.process_time()
    for source in sources:
        naive_letterbox_file(source, folder / f"{source.stem}.png")
    return time.perf_counter() - start, time.process_time() - cpu_start


def read_png(path: Path) -> np.ndarray:
    with Image.open(path) as image:
        return np.asarray(image)


def mean_difference(stage: np.ndarray, naive_folder: Path, sources: Sequence[Path]) -> float:
    """Mean |stage - naive| in grey levels over all pixels: both must do the same job."""
    naive = np.stack([read_png(naive_folder / f"{source.stem}.png") for source in sources])
    return float(np.abs(stage.astype(np.int16) - naive.astype(np.int16)).mean())


# --- MONAI (optional) ----------------------------------------------------------------------


def run_monai(pipeline: Callable[[str], object], sources: Sequence[Path]) -> tuple[float, float]:
    """(wall seconds, CPU seconds, torch's threads included) of the chain over `sources`."""
    start, cpu_start = time.perf_counter(), time.process_time()
    for source in sources:
        result = pipeline(str(source))
        if tuple(result.shape) != (1, SIZE, SIZE):
            raise SystemExit(f"monai: unexpected output shape {tuple(result.shape)}")
    return time.perf_counter() - start, time.process_time() - cpu_start


def monai_section(
    pipeline: Callable[[str], object] | None, sources: Sequence[Path], stage: StageRun
) -> tuple[list[str], float | None]:
    """The section's lines and the stage / MONAI throughput ratio (None when skipped)."""
    if pipeline is None:
        return [
            "3. monai: skipped, monai is not installed (`make bench` installs the `bench` "
            "extra; or: .venv/bin/pip install -e '.[bench]')"
        ], None
    import torch

    count = len(sources)
    seconds, cpu_seconds = run_monai(pipeline, sources)
    rate, stage_rate = count / seconds, count / stage.seconds
    ratio = stage_rate / rate
    return [
        f"3. monai (LoadImage -> ScaleIntensityRangePercentiles 0.5/99.5 -> Resize longest "
        f"{SIZE} -> SpatialPad {SIZE}x{SIZE}; 1 process, {torch.get_num_threads()} torch "
        f"threads, in memory): {rate:.1f} images/s; stage {stage_rate:.1f} images/s, "
        f"ratio {ratio:.2f}x (target >= {MONAI_TARGET:g}x); CPU per image: monai "
        f"{per_image_ms(cpu_seconds, count)}, stage {per_image_ms(stage.cpu_seconds, count)}",
    ], ratio


# --- entry point ---------------------------------------------------------------------------


def warm_up(
    sources: Sequence[Path], scratch: Path, workers: int, pipeline: Callable[[str], object] | None
) -> float:
    """One untimed pass of every path over a few images; returns its wall time.

    It starts the forkserver (once per process, as in a Dagster step), fills the page cache
    and loads codec plugins and lazy imports on the single-process paths, so none of that
    one-off cost lands in the timed runs. It cannot keep a pool alive: map_with_time_limit starts
    and stops its worker processes per call (forked from the fork server, which has
    imported the pipeline's modules already). The asset pays that once per partition, so
    the timed runs keep it; `pool_start_seconds` reports how much it is.
    """
    few = sources[:WARMUP_IMAGES]
    start = time.perf_counter()
    run_stage(few, scratch / "warmup-stage", workers)
    run_naive(few, scratch / "warmup-naive")
    if pipeline is not None:
        run_monai(pipeline, few)
    return time.perf_counter() - start


def identity(item: object) -> object:
    return item


def pool_start_seconds(count: int, workers: int) -> float:
    """The supervised pool (as the stage runs it) over `count` items doing nothing: the
    pool's own cost in a timed run."""
    limit = TimeLimit(job_timeout(os.environ), lambda item, reason: reason)
    start = time.perf_counter()
    map_with_time_limit(identity, list(range(count)), workers, limit)
    return time.perf_counter() - start


def per_image_ms(seconds: float, count: int) -> str:
    return f"{1000 * seconds / count:.1f} ms"


def verdict(name: str, ratio: float | None, target: float) -> str:
    if ratio is None:
        return f"   {name}: not measured (target >= {target:g}x)"
    outcome = "PASS" if ratio >= target else "FAIL"
    return f"   {name}: {ratio:.2f}x, target >= {target:g}x: {outcome}"


def parse_arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--images",
        type=int,
        default=120,
        help="synthetic full-resolution JPEGs (at least 100; default 120)",
    )
    parser.add_argument(
        "--keep",
        type=Path,
        default=None,
        metavar="DIR",
        help="reuse the JPEGs in DIR (writing missing ones there) instead of "
        "generating them into a temporary folder",
    )
    parser.add_argument(
        "--noise",
        type=float,
        default=DEFAULT_NOISE,
        help=f"detector noise of newly written JPEGs (default {DEFAULT_NOISE})",
    )
    parser.add_argument(
        "--sections",
        default="formats,jpeg",
        help="what to run, comma-separated: formats (every source format against its floor, "
        "with the corpus projection; formerly bench_formats.py), jpeg (the JPEG throughput, "
        "re-run and MONAI section below); default both",
    )
    parser.add_argument("--repeats", type=int, default=2, help="formats: runs per measurement")
    parser.add_argument("--scale", type=float, default=1.0, help="formats: multiply image counts")
    parser.add_argument("--only", default="", help="formats: comma-separated format keys")
    add_smoke(parser)
    args = parser.parse_args(argv)
    if args.smoke:  # a few small images, one repeat, one cheap format
        args.images, args.repeats, args.only = 8, 1, args.only or "png8-rex"
        args.scale = 8 / 48
    unknown = set(args.sections.split(",")) - {"formats", "jpeg"}
    if unknown:
        parser.error(f"unknown --sections {sorted(unknown)}: choose formats, jpeg")
    if args.images < 100 and not args.smoke:
        parser.error("--images must be at least 100")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_arguments(argv)
    print(machine_line(), flush=True)
    sections = args.sections.split(",")
    if "formats" in sections:
        # Imported here: pool workers re-importing this module need not import pydicom.
        from image_formats import run_formats

        print("every source format:", flush=True)
        keep = args.keep / "formats" if args.keep else None
        run_formats(keep, args.repeats, args.scale, args.only)
    if "jpeg" in sections:
        print("CheXpert-like JPEGs: throughput, re-run, MONAI:", flush=True)
        jpeg_section(args)
    return 0


def jpeg_section(args: argparse.Namespace) -> None:
    workers = os.cpu_count() or 1
    with tempfile.TemporaryDirectory(prefix="bench_images_") as scratch_name:
        scratch = Path(scratch_name)
        source_folder = args.keep or scratch / "sources"
        sources, written, seconds = prepare_jpeg_sources(
            source_folder, args.images, args.noise, SMOKE_SHAPE if args.smoke else None
        )
        origin = (
            f"wrote {written} in {seconds:.1f} s (noise {args.noise:g})"
            if written
            else "all reused"
        )
        print(f"sources: {describe_sources(sources)}; {source_folder}: {origin}", flush=True)

        pipeline = monai_chain("PILReader")
        warmup_seconds = warm_up(sources, scratch, workers, pipeline)
        print(
            f"warm-up: {warmup_seconds:.2f} s over {WARMUP_IMAGES} images (forkserver start, "
            "imports, codecs; untimed)",
            flush=True,
        )

        print(f"start: {load_line()}", flush=True)
        naive_seconds, naive_cpu = run_naive(sources, scratch / "naive")
        stage_root = scratch / "stage"  # fresh: nothing to reuse on the first run
        first = run_stage(sources, stage_root, workers)
        first_packed = np.load(first.packed)  # the re-run replaces this file
        rerun = run_stage(sources, stage_root, workers)

        count = len(sources)
        stage_rate, naive_rate = count / first.seconds, count / naive_seconds
        throughput_ratio = stage_rate / naive_rate
        rerun_ratio = first.seconds / rerun.seconds
        difference = mean_difference(first_packed, scratch / "naive", sources)
        identical = np.array_equal(first_packed, np.load(rerun.packed))
        lines = [
            f"1. throughput: images stage {stage_rate:.1f} images/s (supervised pool, "
            f"workers={workers}), naive single-process loop {naive_rate:.1f} images/s, ratio "
            f"{throughput_ratio:.2f}x (target >= {THROUGHPUT_TARGET:g}x on 2 cores); "
            f"mean |stage - naive| {difference:.2f} grey levels",
            f"   CPU per image: stage {per_image_ms(first.cpu_seconds, count)} (parent and "
            f"workers), naive {per_image_ms(naive_cpu, count)}: naive / stage "
            f"{naive_cpu / first.cpu_seconds:.2f}x per core",
            f"2. re-run of the unchanged partition: first run {first.seconds:.3f} s "
            f"({decoded_count(first.rows)} decoded), re-run {rerun.seconds:.3f} s, ratio "
            f"{rerun_ratio:.1f}x (target >= {RERUN_TARGET:g}x); sources "
            f"decoded on the re-run: {decoded_count(rerun.rows)} (expected 0); packed array "
            f"identical to the first run: {'yes' if identical else 'NO'}",
        ]
        for line in lines:
            print(line, flush=True)
        print(
            f"   both stage runs include starting a {workers}-worker pool: the supervised "
            f"pool over {count} no-op items takes {pool_start_seconds(count, workers):.3f} s",
            flush=True,
        )
        monai_lines, monai_ratio = monai_section(pipeline, sources, first)
        for line in monai_lines:
            print(line, flush=True)
        print(f"end: {load_line()}", flush=True)
        print("targets:", flush=True)
        for line in (
            verdict("stage / naive loop", throughput_ratio, THROUGHPUT_TARGET),
            verdict("stage / MONAI", monai_ratio, MONAI_TARGET),
            verdict("first run / re-run", rerun_ratio, RERUN_TARGET),
        ):
            print(line, flush=True)


if __name__ == "__main__":
    # Required: the pool's forkserver/spawn start methods re-import this module in other
    # processes, which must not run the benchmark again.
    sys.exit(main())
