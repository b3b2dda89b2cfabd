"""Benchmark: the `images` step's marginal CPU per image against the work alone (issue 30
item 3), on small radiographs (about 190² pixels, where per-row bookkeeping shows) and on
ReXGradient-sized 8-bit PNGs (730 × 742).

For each image size it writes two synthetic ReXGradient train partitions (`--images` and a
sixteenth of it; the project's renderer) and builds every stage once on each (the warm-up:
the pool's fork server started, the upstream tables written). Then each repeat measures,
back to back, user and system CPU of:

* step: the `images` asset materialized alone on each partition, its outputs set aside first
  so every image is decoded, in this process through the `all_stages` job (its checks
  included, two workers, as on this machine): jobs built from `raw_index`, the pool, rows,
  table, checks, Parquet and metadata; this process, the fork server and the workers it
  reaped;
* pool: `build_packed_images` alone on the same sources (`stage` in image_formats.py);
* work alone: the per-image calls in sequence in one process, over the larger partition's
  sources (its `work alone`), into a new folder as the step's are;
* with rows: the same, each image's pixels also written into its row of a packed array
  allocated as the step's (the step's output the work alone leaves out: 49 KB of new pages
  per image at S = 224, whose cost on this machine swings between about 0.01 and 0.3 ms);

step and pool as marginal CPU per image between the two partitions. It prints every
repeat and the median ratio step / work alone (target ≤ 1.3×), of user + system CPU, of
user CPU alone, and against the work alone with rows: system time (creating files, pages
touched for the first time) moves by tens of percent from run to run on this machine, user
time much less. The difference between step and pool is the asset's per-row bookkeeping,
between pool and work alone the jobs', pool's and packed array's.

    .venv/bin/python benchmarks/bench_image_step.py [--images 6000] [--repeats 3] [--smoke]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path

import dagster as dg
from common import (
    REXGRADIENT_PARTITION,
    SIZE,
    add_smoke,
    load_line,
    machine_line,
    pool_cpu_times,
    write_rexgradient_partition,
)
from image_formats import stage_run, work_alone

from radharmony_pipeline.definitions import build_definitions
from radharmony_pipeline.defs.jobs import ALL_STAGES_JOB
from radharmony_pipeline.processing.storage import output_layout as layout
from radharmony_pipeline.processing.storage.packed_rows import PackedRowWriter
from radharmony_pipeline.processing.storage.store import allocate_array

PARTITION = REXGRADIENT_PARTITION
# (name, (shortest, longest) side): count-driven and ReXGradient-sized 8-bit PNGs.
IMAGE_SIZES = {"small ~190²": (180, 200), "rex-sized 730x742": (730, 742)}
TARGET = 1.3


# (user, system) CPU seconds.
Cpu = tuple[float, float]


def cpu_of(run: Callable[..., object], *arguments: object) -> Cpu:
    """(user, system) CPU seconds of `run(*arguments)`: this process, the fork server and
    its workers."""
    start = pool_cpu_times()
    run(*arguments)
    end = pool_cpu_times()
    return end[0] - start[0], end[1] - start[1]


def set_aside(path: Path, trash: Path) -> None:
    """Move `path` into `trash` (deleted with the benchmark's folder at the end).

    Not deleted now: on a file system without a journal (this machine's), ext4 skips every
    inode freed in the last minutes when it allocates one, so creating files just after
    deleting thousands costs a scan past them per file, and the run would measure that."""
    trash.mkdir(exist_ok=True)
    path.rename(trash / f"{len(list(trash.iterdir()))}-{path.name}")


def images_step(data: Path, output: Path, instance: dg.DagsterInstance, trash: Path) -> None:
    """One materialization of `images` for the partition, every image decoded (its outputs
    set aside first)."""
    for path in output.glob(f"{layout.packed_images(PARTITION)}*"):
        set_aside(path, trash)
    set_aside(output / layout.resized_image_folder(PARTITION), trash)
    job = build_definitions(data, output).resolve_job_def(ALL_STAGES_JOB)
    result = job.execute_in_process(
        partition_key=PARTITION, instance=instance, asset_selection=[dg.AssetKey("images")]
    )
    materialized = result.asset_materializations_for_node("images")
    decoded = materialized[0].metadata["decoded"].value
    if not result.success or decoded == 0:
        raise SystemExit(f"images step failed or decoded nothing ({decoded}) on {data}")


def work_alone_in_sequence(sources: list[Path], folder: Path) -> None:
    work = work_alone(folder)
    for source in sources:
        work(source)


def work_alone_with_rows(sources: list[Path], folder: Path) -> None:
    """The work alone, each image's pixels also written into its row of a packed array
    allocated and written as the step's workers do."""
    work = work_alone(folder)
    scratch = folder / "packed.npy"
    allocate_array(scratch, scratch, (len(sources), SIZE, SIZE))
    with PackedRowWriter(scratch) as rows:
        for position, source in enumerate(sources):
            rows.write(position, work(source))


def marginal(few: Cpu, all_: Cpu, added: int) -> Cpu:
    return (all_[0] - few[0]) / added, (all_[1] - few[1]) / added


def measure(work: Path, sides: tuple[int, int], images: int, repeats: int) -> list[dict[str, Cpu]]:
    """Per repeat, per image (user, system) CPU of step, pool, work alone and with rows."""
    counts = {"few": max(2, images // 16), "all": images}
    added = counts["all"] - counts["few"]
    sources = {}
    repeat_results = []
    trash = work / "set-aside"
    with dg.DagsterInstance.ephemeral() as instance:
        for name, count in counts.items():
            data, output = work / name / "data", work / name / "output"
            sources[name] = write_rexgradient_partition(data, count, sides=sides)
            job = build_definitions(data, output).resolve_job_def(ALL_STAGES_JOB)
            if not job.execute_in_process(partition_key=PARTITION, instance=instance).success:
                raise SystemExit(f"all_stages failed on {data}")
        for repeat in range(repeats):
            step, pool = {}, {}
            for name in counts:
                data, output = work / name / "data", work / name / "output"
                step[name] = cpu_of(images_step, data, output, instance, trash)
                pool[name] = cpu_of(stage_run, sources[name], work / f"pool-{name}-{repeat}", 2)
            alone = cpu_of(work_alone_in_sequence, sources["all"], work / f"alone-{repeat}")
            with_rows = cpu_of(work_alone_with_rows, sources["all"], work / f"rows-{repeat}")
            repeat_results.append(
                {
                    "step": marginal(step["few"], step["all"], added),
                    "pool": marginal(pool["few"], pool["all"], added),
                    "work alone": (alone[0] / counts["all"], alone[1] / counts["all"]),
                    "with rows": (with_rows[0] / counts["all"], with_rows[1] / counts["all"]),
                }
            )
    return repeat_results


def describe(cpu: Cpu) -> str:
    return f"{sum(cpu) * 1e3:6.3f} ms ({cpu[0] * 1e3:5.3f} user)"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=6000, help="images of the larger partition")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", choices=sorted(IMAGE_SIZES), help="one image size only")
    add_smoke(parser)
    args = parser.parse_args()
    if args.smoke:  # the small size only, 80 and 5 images, once; no verdict
        args.images, args.repeats, args.only = 80, 1, "small ~190²"
    os.environ["RADHARMONY_WORKERS"] = "2"
    print(machine_line())
    print(load_line())
    verdicts = []
    # One folder for every size, deleted at the end: see set_aside.
    folder = Path(tempfile.mkdtemp(prefix="bench-image-step-"))
    try:
        for name, sides in IMAGE_SIZES.items():
            if not args.only or name == args.only:
                verdicts.append(report(name, sides, args.images, args.repeats, folder))
    finally:
        shutil.rmtree(folder)
    print(load_line())
    return 0 if all(verdicts) or args.smoke else 1


def report(name: str, sides: tuple[int, int], images: int, repeats: int, folder: Path) -> bool:
    """Measure one image size and print every repeat and the median; whether it passes."""
    # ReXGradient-sized renders cost ~50 ms each: a quarter of the count keeps it minutes.
    images = images if sides[1] < 400 or images < 64 else max(64, images // 4)
    repeat_results = measure(folder / f"{sides[0]}x{sides[1]}", sides, images, repeats)
    ratios, user_ratios, row_ratios = [], [], []
    for repeat, cpu in enumerate(repeat_results, 1):
        alone = cpu["work alone"]
        ratios.append(sum(cpu["step"]) / sum(alone))
        user_ratios.append(cpu["step"][0] / alone[0])
        row_ratios.append(sum(cpu["step"]) / sum(cpu["with rows"]))
        print(
            f"{name:<18} {images:>6} images, repeat {repeat} | step {describe(cpu['step'])} "
            f"| pool {describe(cpu['pool'])} | work alone {describe(alone)} | with rows "
            f"{describe(cpu['with rows'])} | step/work alone {ratios[-1]:4.2f}x "
            f"({user_ratios[-1]:4.2f}x user; {row_ratios[-1]:4.2f}x with rows) | "
            f"pool/work alone {sum(cpu['pool']) / sum(alone):4.2f}x"
        )
    ratio = statistics.median(ratios)
    print(
        f"{name:<18} median step/work alone {ratio:4.2f}x "
        f"{'PASS' if ratio <= TARGET else 'FAIL'} (≤ {TARGET}x; repeats "
        f"{min(ratios):4.2f}-{max(ratios):4.2f}x); user CPU alone "
        f"{statistics.median(user_ratios):4.2f}x; against the work alone with rows "
        f"{statistics.median(row_ratios):4.2f}x"
    )
    return ratio <= TARGET


if __name__ == "__main__":
    raise SystemExit(main())
