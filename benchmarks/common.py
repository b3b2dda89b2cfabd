"""What every benchmark needs, in one place: no benchmark imports another.

* the machine and load lines printed at the start of a run;
* `timed`: wall, CPU and peak RSS of a call (median of repeats, optionally page cache
  dropped first), and `pool_cpu_times` for the stage's worker processes;
* `drop_page_cache` (root only);
* synthetic sources: full-resolution CheXpert-like JPEGs, noisy radiographs, small PNGs and
  a ReXGradient partition or its metadata alone;
* the `images` stage's jobs as the asset builds them, and the two baselines the image
  benchmarks compare it to: the naive letterbox and the MONAI chain;
* `bare_json_load` (the floor of reading a metadata JSON) in a fresh process;
* `--smoke` and results JSON under benchmarks/results/<name>.json.

Pool workers re-import the main script (as __mp_main__), so this module's top level holds
only imports and definitions.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import multiprocessing.forkserver
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np
import psutil
from PIL import Image

from radharmony_pipeline.processing.jobs.image_jobs import (
    ImageJob,
    ImageRow,
    build_packed_images,
    image_job_stopped,
)
from radharmony_pipeline.processing.storage import output_layout as layout
from radharmony_pipeline.processing.storage.atomic import temporary_sibling
from radharmony_pipeline.synthetic import rexgradient
from radharmony_pipeline.synthetic.radiograph import render_radiograph, to_uint8
from radharmony_pipeline.synthetic.seeding import dataset_rng

BENCHMARKS = Path(__file__).resolve().parent
REPOSITORY = BENCHMARKS.parent
RESULTS = BENCHMARKS / "results"
SIZE = 224  # the output side every image benchmark resizes to

# --- the run's context ---------------------------------------------------------------------


def machine_line() -> str:
    processor = platform.processor() or "unknown processor"
    return (
        f"machine: os.cpu_count()={os.cpu_count()}, {processor} / {platform.machine()}, "
        f"Python {platform.python_version()} ({platform.system()} {platform.release()})"
    )


def load_line() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} {five:.2f} {fifteen:.2f}"


def add_smoke(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="tiny input, a few seconds: checks the benchmark runs, its figures mean nothing",
    )


def write_results(name: str, figures: dict, path: Path | None = None) -> Path:
    """The figures as JSON in `path` (default benchmarks/results/<name>.json)."""
    target = path or RESULTS / f"{name}.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps({"benchmark": name, **figures}, indent=2) + "\n")
    return target


# --- timing --------------------------------------------------------------------------------


@dataclass
class Timing:
    seconds: float  # wall, median of the repeats
    cpu: float  # CPU seconds of this process, median of the repeats
    peak_rss_mib: float  # this process's peak RSS so far
    result: object  # the last call's


def peak_rss_mib() -> float:
    """This process's peak resident set size (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def timed(function: Callable[[], object], repeats: int = 1, cold: bool = False) -> Timing:
    """Median wall and CPU seconds of `repeats` calls of function(), the page cache dropped
    before each when `cold` (root only)."""
    walls, cpus, result = [], [], None
    for _ in range(repeats):
        if cold:
            drop_page_cache()
        wall, cpu = time.perf_counter(), time.process_time()
        result = function()
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return Timing(statistics.median(walls), statistics.median(cpus), peak_rss_mib(), result)


def cpu_per_image(function: Callable[[object], object], items: Sequence, repeats: int) -> float:
    """The best over `repeats` of the CPU seconds per item of function over `items`."""
    best = math.inf
    for _ in range(repeats):
        start = time.process_time()
        for item in items:
            function(item)
        best = min(best, (time.process_time() - start) / len(items))
    return best


def pool_cpu_seconds() -> float:
    """CPU seconds of this process and of every worker process so far (pool_cpu_times)."""
    return sum(pool_cpu_times())


def pool_cpu_times() -> tuple[float, float]:
    """(user, system) CPU seconds of this process and of every worker process so far.

    Workers are forked by multiprocessing's fork server, not by us: their CPU time shows in
    the server's children times once it has reaped them (it has, when the pool has joined
    them). The server's pid is a private attribute of multiprocessing; 0 without a server.
    """
    own = psutil.Process().cpu_times()
    user, system = own.user, own.system
    server = getattr(multiprocessing.forkserver._forkserver, "_forkserver_pid", None)
    if server:
        times = psutil.Process(server).cpu_times()
        user += times.user + times.children_user
        system += times.system + times.children_system
    return user, system


# --- the page cache ------------------------------------------------------------------------

DROP_CACHES = Path("/proc/sys/vm/drop_caches")


def drop_page_cache() -> None:
    """Written data to disk, then every clean page, dentry and inode dropped (root only)."""
    os.sync()
    DROP_CACHES.write_text("3\n")


def can_drop_page_cache() -> bool:
    return os.access(DROP_CACHES, os.W_OK)


# --- the floor of reading a metadata JSON --------------------------------------------------

BARE_LOAD = (
    "import json, resource, sys, time\n"
    "start, cpu = time.perf_counter(), time.process_time()\n"
    "with open(sys.argv[1], 'rb') as handle:\n"
    "    data = json.load(handle)\n"
    "wall, cpu = time.perf_counter() - start, time.process_time() - cpu\n"
    "rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024\n"
    "print(wall, cpu, rss, len(data))\n"
)


def bare_json_load(path: Path) -> dict:
    """A bare json.load of `path` in a fresh process: the load's wall and CPU seconds, the
    process's peak RSS and the number of top-level entries."""
    completed = subprocess.run(
        [sys.executable, "-c", BARE_LOAD, str(path)], capture_output=True, text=True, check=True
    )
    wall, cpu, rss, entries = completed.stdout.split()
    return {
        "seconds": float(wall),
        "cpu": float(cpu),
        "peak_rss_mib": float(rss),
        "studies": int(entries),
    }


# --- synthetic sources ---------------------------------------------------------------------

JPEG_SEED = 0
JPEG_QUALITY = 90
WIDTH_RANGE = (2300, 2400)  # CheXpert full-resolution frontals are ~2320 x 2828
HEIGHT_RANGE = (2800, 2900)
LATERAL_FRACTION = 0.15  # a share of lateral views, as in CheXpert
# render_radiograph is smooth and compresses to ~0.2 MB; real full-resolution CheXpert JPEGs
# are ~2 MB (quantum mottle, fine texture). Entropy decoding, which no DCT scale skips, grows
# with the compressed size, so Gaussian noise of this standard deviation (in [0, 1] units,
# 0.02 ~ 5 grey levels) brings files to ~1.5 MB and decode cost close to the real thing.
DEFAULT_NOISE = 0.02


def jpeg_source_name(index: int) -> str:
    return f"patient{index:05d}_study1_view1.jpg"


def write_radiograph_jpeg(
    path: Path, index: int, noise: float, shape: tuple[int, int] | None = None
) -> None:
    """One seeded CheXpert-like radiograph (its own generator, so any subset regenerates
    identically); `shape` (height, width) replaces the full-resolution size (smoke runs)."""
    rng = np.random.default_rng([JPEG_SEED, index])
    width = int(rng.integers(WIDTH_RANGE[0], WIDTH_RANGE[1] + 1))
    height = int(rng.integers(HEIGHT_RANGE[0], HEIGHT_RANGE[1] + 1))
    if shape is not None:
        height, width = shape
    view = "lateral" if rng.random() < LATERAL_FRACTION else "frontal"
    pixels = render_radiograph(rng, height, width, view).pixels
    if noise > 0:
        pixels = pixels + np.float32(noise) * rng.standard_normal(pixels.shape, dtype=np.float32)
    temp = temporary_sibling(path)  # a killed run must not leave a truncated JPEG to reuse
    Image.fromarray(to_uint8(pixels)).save(temp, format="JPEG", quality=JPEG_QUALITY)
    os.replace(temp, path)


def prepare_jpeg_sources(
    folder: Path, count: int, noise: float, shape: tuple[int, int] | None = None
) -> tuple[list[Path], int, float]:
    """The `count` JPEGs in `folder`, writing missing ones: (paths, written, seconds)."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / jpeg_source_name(index) for index in range(count)]
    start = time.perf_counter()
    missing = [(index, path) for index, path in enumerate(paths) if not path.is_file()]
    for index, path in missing:
        write_radiograph_jpeg(path, index, noise, shape)
    return paths, len(missing), time.perf_counter() - start


def noisy_radiograph(seed: int, index: int, height: int, width: int, noise: float) -> np.ndarray:
    """A frontal radiograph in [0, 1] plus Gaussian detector noise, seeded per image."""
    rng = np.random.default_rng([seed, index, height, width])
    pixels = render_radiograph(rng, height, width, "frontal").pixels
    noisy = pixels + np.float32(noise) * rng.standard_normal(pixels.shape, dtype=np.float32)
    return np.clip(noisy, 0, 1)


def write_radiograph_png(path: Path, rng: np.random.Generator, height: int, width: int) -> None:
    """An 8-bit PNG radiograph (an existing file replaced, a hard link's other names kept)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    cv2.imwrite(str(path), to_uint8(render_radiograph(rng, height, width, "frontal").pixels))


REXGRADIENT_PARTITION = "rexgradient.train"
SMALL_SIDES = (180, 200)


def write_rexgradient_partition(
    root: Path, images: int, seed: int = 0, sides: tuple[int, int] = SMALL_SIDES
) -> list[Path]:
    """ReXGradient metadata with `images` train images (tiny val and test), one rendered
    radiograph of `sides` per ImagePath under root/rexgradient; the train PNGs' paths."""
    sizes = {
        "train": rexgradient.SplitSize(images * 6 // 10, images, images * 4 // 10),
        "val": rexgradient.SplitSize(3, 5, 2),
        "test": rexgradient.SplitSize(3, 5, 2),
    }
    studies = rexgradient.write_metadata(root / "rexgradient", seed, sizes, sides)
    train = []
    for split_index, split in enumerate(rexgradient.SPLIT_FILES):
        index = 0
        for _, study in studies[split]:
            for path, (height, width) in zip(study["ImagePath"], study["ImageShape"], strict=True):
                rng = dataset_rng(seed, "rexgradient", 1, split_index, index)
                target = (
                    root / "rexgradient" / "deid_png" / path.removeprefix(rexgradient.IMAGE_PREFIX)
                )
                write_radiograph_png(target, rng, height, width)
                if split == "train":
                    train.append(target)
                index += 1
    return train


def write_rexgradient_metadata(base: Path, smoke: bool, seed: int = 0) -> Path:
    """ReXGradient metadata without images under base/rexgradient, at the release's size
    (or, for a smoke run, 40 train images); the rexgradient root."""
    if not smoke:
        from radharmony_pipeline.synthetic import write_full_scale_rexgradient_metadata

        return write_full_scale_rexgradient_metadata(base, seed)
    sizes = {
        "train": rexgradient.SplitSize(24, 40, 16),
        "val": rexgradient.SplitSize(3, 5, 2),
        "test": rexgradient.SplitSize(3, 5, 2),
    }
    rexgradient.write_metadata(base / "rexgradient", seed, sizes, SMALL_SIDES)
    return base / "rexgradient"


# --- the images stage's jobs and its two baselines -----------------------------------------


def stage_jobs(sources: Sequence[Path], output_root: Path, partition: str) -> list[ImageJob]:
    """The jobs the `images` asset builds for these sources (letterbox, SIZE, no union
    masks), their PNGs where the layout puts `partition`'s under `output_root`."""
    return [
        ImageJob(
            image_id=source.stem,
            source_file=source,
            union_mask_file=None,
            output_root=output_root,
            image_relative=layout.resized_image(partition, source.stem),
            mask_relative=None,
            size=SIZE,
            resize="letterbox",
            row=row,
        )
        for row, source in enumerate(sources)
    ]


def naive_letterbox(pixels: np.ndarray) -> np.ndarray:
    """The naive loop's resize: INTER_AREA of the long side to SIZE, centred zero padding."""
    height, width = pixels.shape
    scale = SIZE / max(height, width)
    # Half up like letterbox_geometry, so both place the content identically.
    new_height = max(1, math.floor(height * scale + 0.5))
    new_width = max(1, math.floor(width * scale + 0.5))
    content = cv2.resize(pixels, (new_width, new_height), interpolation=cv2.INTER_AREA)
    frame = np.zeros((SIZE, SIZE), dtype=np.uint8)
    top, left = (SIZE - new_height) // 2, (SIZE - new_width) // 2
    frame[top : top + new_height, left : left + new_width] = content
    return frame


def monai_chain(reader: str) -> Callable[[str], object] | None:
    """The kind of transform chain the seed library runs per image (LoadImage ->
    ScaleIntensityRangePercentiles 0.5/99.5 -> Resize longest SIZE -> SpatialPad); None
    without monai (the `bench` extra)."""
    if importlib.util.find_spec("monai") is None:
        return None
    from monai.transforms import (
        Compose,
        LoadImage,
        Resize,
        ScaleIntensityRangePercentiles,
        SpatialPad,
    )

    return Compose(
        [
            LoadImage(image_only=True, ensure_channel_first=True, reader=reader),
            ScaleIntensityRangePercentiles(lower=0.5, upper=99.5, b_min=0.0, b_max=1.0, clip=True),
            Resize(spatial_size=SIZE, size_mode="longest", mode="area"),
            SpatialPad(spatial_size=(SIZE, SIZE)),
        ]
    )


STAGE_PARTITION = "chexpert.train"
WARMUP_IMAGES = 6  # the untimed pass over a few images before timed stage runs


@dataclass
class StageRun:
    seconds: float
    cpu_seconds: float
    rows: list[ImageRow]
    packed: Path


def run_stage(
    sources: Sequence[Path], output_root: Path, workers: int, partition: str = STAGE_PARTITION
) -> StageRun:
    """What `images` does for one partition, minus Dagster: jobs built as the asset builds
    them, then build_packed_images (the asset's own call)."""
    folder = output_root / layout.resized_image_folder(partition)
    packed = output_root / layout.packed_images(partition)
    start, cpu_start = time.perf_counter(), pool_cpu_seconds()
    folder.mkdir(parents=True, exist_ok=True)
    jobs = stage_jobs(sources, output_root, partition)
    # As the asset runs them: executor and time limit from the run settings (imported here,
    # not at the top, so pool workers re-importing this module do not import dagster).
    from radharmony_pipeline.defs.run_settings import RunSettingsResource

    settings = RunSettingsResource(workers=workers)
    limit = settings.time_limit(image_job_stopped)
    rows = build_packed_images(jobs, packed, SIZE, settings.executor(), time_limit=limit)
    seconds, cpu_seconds = time.perf_counter() - start, pool_cpu_seconds() - cpu_start
    failed = [row for row in rows if row.status != "ok"]
    if failed:
        raise SystemExit(f"images stage: {len(failed)} rows failed, first: {failed[0].error}")
    return StageRun(seconds, cpu_seconds, rows, packed)
