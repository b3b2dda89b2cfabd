"""The `formats` section of bench_images.py: the `images` stage's marginal CPU per image for
every source format the four datasets ship, against its floor, the naive loop and MONAI.

Per format, seeded synthetic files at the datasets' sizes and entropy, measured in one run:
the floor (the fastest installed decoder's decode-only CPU per image, bytes in memory,
reduced resolutions where the format has them, plus the file's SHA-256 the table records; for
uncompressed DICOM also the bare floor, the pixels viewed in place); the stage's marginal CPU
per image with one worker, (CPU over N - CPU over N/16) / (N - N/16), the best of the repeats;
their ratio, the median of back-to-back pairs (target <= 1.5x: the host's speed drifts by tens
of percent between runs seconds apart, and a pair shares the drift); the work alone (the
stage's per-image calls in one process); the naive loop and MONAI per image. Then the ten
partitions projected at their documented counts, wall from the 1- and 2-worker marginal rates
plus each partition's fixed part (target < 30 min on 2 cores)."""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from baselines import (
    Format,
    monai_chain,
    run_monai,
    run_naive,
    sha256_of,
    source_formats,
    work_alone,
)
from common import Table, cpu_per_image, load_line, run_stage
from synthetic_inputs import write_atomically

from radharmony_pipeline.processing.imaging.decode import decode_grayscale
from radharmony_pipeline.processing.imaging.image_files import header_image_size
from radharmony_pipeline.sources import SOURCE_TYPES, partition_keys

TARGET_RATIO = 1.5
# The formats whose files the `masks` stage opens, and for which dataset: it reads only the
# header (the size the annotations must match), so its floor is opening the file and
# reading its first block.
MASK_HEADER_READERS = {"jpeg": "CheXlocalize", "png8-L": "ChestX-Det", "png8-RGBA": "ChestX-Det"}
HEADER_BLOCK = 4096
CORPUS_TARGET_MINUTES = 30


def prepare(folder: Path, source_format: Format, count: int) -> list[Path]:
    """The format's first `count` sources in `folder`, writing missing ones."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for index in range(count):
        path = folder / f"{source_format.key}_{index:04d}{source_format.suffix}"
        if not path.is_file():
            write_atomically(path, source_format.write(index))
        paths.append(path)
    return paths


def few_images(count: int) -> int:
    """The size of the baseline run whose cost a run over all `count` images is compared to."""
    # The baseline run holds a few images, so the difference spans most of them: each run's
    # noise is divided by nearly N, not N/2 (the fixed costs are in both runs either way).
    return max(2, count // 16)


@dataclass
class StageCost:
    cpu: float  # seconds per image, marginal, one worker
    wall: dict[int, float]  # workers -> wall seconds per image, marginal
    start: dict[int, float]  # workers -> wall seconds of a run's fixed part (pool, array, table)


def stage_cost(
    sources: Sequence[Path], scratch: Path, repeats: int, pools: tuple[int, ...] = (1, 2)
) -> StageCost:
    """Marginal CPU (1 worker) and wall (1 and 2 workers) per image: the difference between
    a run over every source and one over a few, divided by the images between them. A
    partition of 239k images pays the pool's start once, so the projection must not spread
    it over a benchmark's few dozen images."""
    few, every = few_images(len(sources)), len(sources)
    best_cpu = {few: math.inf, every: math.inf}
    best_wall: dict[tuple[int, int], float] = {}
    for workers in pools:
        for repeat in range(repeats):
            for count in (few, every):
                run = run_stage(sources[:count], scratch / f"{workers}-{repeat}-{count}", workers)
                key = (workers, count)
                best_wall[key] = min(best_wall.get(key, math.inf), run.seconds)
                if workers == 1:
                    best_cpu[count] = min(best_cpu[count], run.cpu_seconds)
    added = every - few
    wall = {w: max(0.0, best_wall[(w, every)] - best_wall[(w, few)]) / added for w in pools}
    return StageCost(
        cpu=(best_cpu[every] - best_cpu[few]) / added,
        wall=wall,
        start={w: max(0.0, best_wall[(w, few)] - few * wall[w]) for w in pools},
    )


def paired_ratios(
    floor_once: Callable[[], float], sources: Sequence[Path], scratch: Path, repeats: int
) -> list[float]:
    """Per repeat: the floor measured once, then the stage's marginal CPU per image (one
    worker) right after it, and their ratio. The host's speed drifts by tens of percent
    between runs seconds apart; a floor and a stage measured back to back share that drift."""
    few = few_images(len(sources))
    ratios = []
    for repeat in range(repeats):
        floor = floor_once()
        cpu = {
            count: run_stage(sources[:count], scratch / f"pair{repeat}-{count}", 1).cpu_seconds
            for count in (few, len(sources))
        }
        ratios.append((cpu[len(sources)] - cpu[few]) / (len(sources) - few) / floor)
    return ratios


def ms(seconds: float) -> str:
    return f"{1000 * seconds:.1f} ms"


def _over(value: float, stage: float) -> float:
    """value / stage; NaN when the stage's marginal CPU is not positive (a --smoke run's few
    images are within the clock's noise)."""
    return value / stage if stage > 0 else math.nan


@dataclass
class FormatResult:
    source_format: Format
    floor: float
    stage: StageCost
    paired: list[float]  # stage / floor, one per back-to-back pair
    work: float
    naive: float
    monai: float | None

    def ratio(self) -> float:
        """The verdict's ratio: the median of the paired ones."""
        return float(np.median(self.paired))

    def row(self) -> list[str]:
        verdict = "PASS" if self.ratio() <= TARGET_RATIO else "FAIL"
        monai = f"{_over(self.monai, self.stage.cpu):.2f}×" if self.monai else "not measured"
        return [
            self.source_format.key,
            ms(self.floor),
            ms(self.stage.cpu),
            f"{self.ratio():.2f}× {verdict}",
            f"{self.work / self.floor:.2f}×",
            f"{_over(self.naive, self.stage.cpu):.2f}×",
            monai,
        ]


def measure(
    source_format: Format, sources: Sequence[Path], scratch: Path, repeats: int, smoke: bool
) -> FormatResult:
    contents = [source.read_bytes() for source in sources]
    decode = {
        name: cpu_per_image(decoder, contents, repeats)
        for name, decoder in source_format.decoders.items()
    }
    fastest = min(decode, key=decode.get)
    hashing = cpu_per_image(sha256_of, contents, repeats)
    if not smoke:  # untimed: starts the fork server (once per process, as a Dagster step)
        run_stage(sources[:2], scratch / f"{source_format.key}-warmup", 1)
    # A smoke run's pool starts are most of its seconds: one worker shows the code runs.
    stage = stage_cost(sources, scratch / source_format.key, repeats, (1,) if smoke else (1, 2))

    def floor_once() -> float:
        return cpu_per_image(source_format.decoders[fastest], contents, 1) + cpu_per_image(
            sha256_of, contents, 1
        )

    pairs = paired_ratios(floor_once, sources, scratch / f"{source_format.key}-pairs", repeats)
    work = cpu_per_image(work_alone(scratch / f"{source_format.key}-work"), sources, repeats)
    naive_sources = sources[: max(4, len(sources) // 4)]
    naive = run_naive(source_format.naive_pixels, naive_sources, scratch / "naive", True)[1]
    chain = None if smoke else monai_chain(source_format.monai_reader)
    monai = None
    if chain:
        chain(str(sources[0]))  # warm-up: imports, reader set-up
        monai_sources = sources[: max(3, len(sources) // 8)]
        monai = run_monai(chain, monai_sources)[1] / len(monai_sources)
    result = FormatResult(
        source_format,
        decode[fastest] + hashing,
        stage,
        pairs,
        work,
        naive / len(naive_sources),
        monai,
    )
    floor, ratio = result.floor, result.ratio()
    bare_text = ""
    if source_format.bare_read is not None:
        bare = cpu_per_image(source_format.bare_read, contents, repeats) + hashing
        bare_text = f" | bare floor {ms(bare)}: {stage.cpu / bare:.2f}x"
    megabytes = np.mean([len(content) for content in contents]) / 1e6
    others = ", ".join(f"{name} {ms(value)}" for name, value in decode.items())
    print(
        f"{source_format.key:13s} floor {ms(floor)} ({fastest} + SHA-256 {ms(hashing)}) | "
        f"stage {ms(stage.cpu)} | ratio {ratio:.2f}x "
        f"{'PASS' if ratio <= TARGET_RATIO else 'FAIL'} (median of {len(pairs)} back-to-back "
        f"pairs, {min(pairs):.2f}-{max(pairs):.2f}x; best stage / best floor "
        f"{stage.cpu / floor:.2f}x){bare_text} | work alone {ms(work)}: {work / floor:.2f}x "
        f"floor | naive {ms(result.naive)}: {_over(result.naive, stage.cpu):.2f}x | MONAI "
        + (f"{ms(monai)}: {_over(monai, stage.cpu):.2f}x" if monai else "not measured"),
        flush=True,
    )
    print(
        f"{'':13s} {source_format.description}; {len(sources)} files, {megabytes:.2f} MB mean; "
        f"decoders: {others}; stage wall per added image: 1 worker {ms(stage.wall[1])}, "
        f"2 workers {ms(stage.wall.get(2, math.nan))} (a run's fixed part: "
        f"{ms(stage.start[1])}, {ms(stage.start.get(2, math.nan))})",
        flush=True,
    )
    if source_format.key in MASK_HEADER_READERS:
        print(masks_line(source_format.key, sources, repeats), flush=True)
    return result


def masks_line(key: str, sources: Sequence[Path], repeats: int) -> str:
    """The `masks` stage's read of each image (its header size) against opening the file
    and reading its first block, and against decoding the pixels (what ChestX-Det's masks
    did before they read the header only)."""
    header = cpu_per_image(header_image_size, sources, repeats)
    first_block = cpu_per_image(read_first_block, sources, repeats)
    decode = cpu_per_image(decode_grayscale, sources, 1)
    return (
        f"{'':13s} masks ({MASK_HEADER_READERS[key]}): header size {1000 * header:.2f} ms | "
        f"open + {HEADER_BLOCK // 1024} KiB read {1000 * first_block:.2f} ms, ratio "
        f"{header / first_block:.1f}x | a full decode instead {ms(decode)}"
    )


def read_first_block(path: Path) -> bytes:
    with open(path, "rb") as handle:
        return handle.read(HEADER_BLOCK)


def documented_images(dataset: str) -> int:
    """The dataset's documented image count: its total, else the sum over its splits."""
    counts = SOURCE_TYPES[dataset].documented_counts
    by_split = sum(split.get("images", 0) for split in counts.splits.values())
    return counts.total.get("images", by_split)


def corpus_projection(results: dict[str, FormatResult]) -> dict[str, dict]:
    """The ten partitions at documented counts, per ReXGradient bit depth (undocumented, so
    both PNG depths; MS-CXR over a MIMIC DICOM tree): images, stage CPU and wall minutes on
    1 and 2 workers, and the images per second each added worker adds."""
    chestx_rgba = sum(
        split.get("rgba_images", 0)
        for split in SOURCE_TYPES["chestx_det"].documented_counts.splits.values()
    )
    projection = {}
    for rex_format in ("png8-rex", "png16-rex"):
        mix = {
            rex_format: documented_images("rexgradient"),
            "png8-L": documented_images("chestx_det") - chestx_rgba,
            "png8-RGBA": chestx_rgba,
            "jpeg": documented_images("chexlocalize"),
            "dicom": documented_images("ms_cxr"),
        }
        if any(key not in results for key in mix):
            continue
        total = sum(mix.values())
        # Per image at the marginal rate, plus each partition's fixed part once (charged at
        # the slowest format's, as a partition's format is not known here).
        wall = {
            workers: sum(count * results[key].stage.wall[workers] for key, count in mix.items())
            + len(partition_keys()) * max(results[key].stage.start[workers] for key in mix)
            for workers in (1, 2)
        }
        projection[rex_format] = {
            "images": total,
            "cpu_minutes": sum(count * results[key].stage.cpu for key, count in mix.items()) / 60,
            "wall_minutes": {workers: seconds / 60 for workers, seconds in wall.items()},
            "added_per_worker": total / wall[2] - total / wall[1],
        }
    return projection


def projection_line(rex_format: str, figures: dict) -> str:
    total, wall, added = figures["images"], figures["wall_minutes"], figures["added_per_worker"]
    rate = total / (wall[2] * 60)
    scaling = (
        f"each added worker adds {added:.1f} images/s to {rate:.1f} (4 workers: "
        f"{total / (rate + 2 * added) / 60:.1f} min, 8: {total / (rate + 6 * added) / 60:.1f} "
        "min, if the rate keeps growing so)"
        if added > 0
        else "the second worker added nothing measurable (a busy machine): no per-worker projection"
    )
    return (
        f"corpus ({total:,} images, ReXGradient as {rex_format}): stage CPU "
        f"{figures['cpu_minutes']:.1f} min (2 cores fully used: {figures['cpu_minutes'] / 2:.1f}"
        f" min); wall with 1 worker {wall[1]:.1f} min, 2 workers {wall[2]:.1f} min (target < "
        f"{CORPUS_TARGET_MINUTES} min on 2 cores: "
        f"{'PASS' if wall[2] < CORPUS_TARGET_MINUTES else 'FAIL'}); {scaling}"
    )


def run_formats(keep: Path | None, repeats: int, scale: float, only: str, smoke: bool) -> Table:
    """Measure every chosen format, print its lines, the corpus projection and the verdict;
    MONAI too when installed, but not in a smoke run (importing torch alone takes seconds)."""
    chosen = [f for f in source_formats() if not only or f.key in only.split(",")]
    print(f"start: {load_line()}", flush=True)
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench_formats_") as scratch_name:
        scratch = Path(scratch_name)
        for source_format in chosen:
            count = max(4, round(source_format.images * scale) // 2 * 2)
            folder = (keep or scratch / "sources") / source_format.key
            sources = prepare(folder, source_format, count)
            result = measure(source_format, sources, scratch, repeats, smoke)
            results[source_format.key] = result
    projection = corpus_projection(results)
    for rex_format, figures in projection.items():
        print(projection_line(rex_format, figures), flush=True)
    print(f"end: {load_line()}", flush=True)
    passed = sum(result.ratio() <= TARGET_RATIO for result in results.values())
    verdict = f"{passed} of {len(results)} formats within {TARGET_RATIO}× of their floor."
    print(verdict.replace("×", "x"))
    corpus = "".join(
        f" {figures['wall_minutes'][2]:.1f} min with ReXGradient as {rex_format}"
        for rex_format, figures in projection.items()
    )
    return Table(
        "images_formats",
        "The `images` stage per source format",
        [
            "format",
            "floor",
            "stage",
            f"stage / floor (target ≤ {TARGET_RATIO}×)",
            "work alone / floor",
            "naive / stage",
            "MONAI / stage",
        ],
        [result.row() for result in results.values()],
        {
            "cpu_per_image": {key: _figures(result) for key, result in results.items()},
            "corpus": projection,
            "workers": os.cpu_count(),
        },
        f"Ratio: median of {repeats} back-to-back pairs."
        + (f" Corpus on 2 workers:{corpus}." if corpus else "")
        + f" {verdict}",
        "--sections formats",
    )


def _figures(result: FormatResult) -> dict:
    return {
        "floor": result.floor,
        "stage": result.stage.cpu,
        "paired_ratios": result.paired,
        "work_alone": result.work,
        "naive": result.naive,
        "monai": result.monai,
        "stage_wall": result.stage.wall,
        "stage_fixed": result.stage.start,
    }
