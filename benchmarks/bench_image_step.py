"""Benchmark: the `images` step's marginal CPU per image against the work alone (issue 30
item 3), on small radiographs (about 190² pixels, where per-row bookkeeping shows) and on
ReXGradient-sized 8-bit PNGs (730 × 742).

For each image size it writes two synthetic ReXGradient train partitions (`--images` and a
sixteenth of it; the project's renderer), builds every stage once on each (the warm-up: the
pool's fork server started, the upstream tables written), then per repeat and per partition
removes the `images` outputs and materializes the `images` asset alone, in this process
through the `all_stages` job (its checks included, two workers, as on this machine), and
reads the CPU of this process, the fork server and the workers it reaped. It prints, per
image, marginal CPU between the two partitions (the minimum over repeats) of:

* step: the asset as Dagster runs it (jobs built from `raw_index`, the pool, rows, table,
  checks, Parquet and metadata);
* pool: `build_packed_images` alone on the same sources (bench_formats' `stage`);
* work alone: the per-image calls in sequence in one process (bench_formats' `work alone`);

and the ratios step / work alone (target ≤ 1.3×) and pool / work alone; the difference
between step and pool is the asset's per-row bookkeeping, between pool and work alone the
jobs', pool's and packed array's.

    .venv/bin/python benchmarks/bench_image_step.py [--images 6000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import tempfile
from pathlib import Path

import bench_reruns
import dagster as dg
from bench_formats import stage_run, work_alone_cpu
from bench_images import load_line, machine_line, pool_cpu_seconds

from radharmony_pipeline.definitions import build_definitions
from radharmony_pipeline.defs.jobs import ALL_STAGES_JOB
from radharmony_pipeline.processing.storage import output_layout as layout

PARTITION = bench_reruns.PARTITION
# (name, (shortest, longest) side): count-driven and ReXGradient-sized 8-bit PNGs.
IMAGE_SIZES = {"small ~190²": (180, 200), "rex-sized 730x742": (730, 742)}
TARGET = 1.3


def images_step_cpu(data: Path, output: Path, instance: dg.DagsterInstance) -> float:
    """CPU seconds (this process, fork server, workers) of one materialization of `images`
    for the partition, every image decoded (its outputs removed first)."""
    for path in output.glob(f"{layout.packed_images(PARTITION)}*"):
        path.unlink()
    shutil.rmtree(output / layout.resized_image_folder(PARTITION), ignore_errors=True)
    job = build_definitions(data, output).resolve_job_def(ALL_STAGES_JOB)
    start = pool_cpu_seconds()
    result = job.execute_in_process(
        partition_key=PARTITION, instance=instance, asset_selection=[dg.AssetKey("images")]
    )
    cpu = pool_cpu_seconds() - start
    materialized = result.asset_materializations_for_node("images")
    decoded = materialized[0].metadata["decoded"].value
    if not result.success or decoded == 0:
        raise SystemExit(f"images step failed or decoded nothing ({decoded}) on {data}")
    return cpu


def measure(work: Path, sides: tuple[int, int], images: int, repeats: int) -> dict[str, float]:
    counts = {"few": max(2, images // 16), "all": images}
    sources, step_cpu = {}, {}
    with dg.DagsterInstance.ephemeral() as instance:
        for name, count in counts.items():
            data, output = work / name / "data", work / name / "output"
            sources[name] = bench_reruns.write_partition(data, count, sides=sides)
            job = build_definitions(data, output).resolve_job_def(ALL_STAGES_JOB)
            if not job.execute_in_process(partition_key=PARTITION, instance=instance).success:
                raise SystemExit(f"all_stages failed on {data}")
        for _ in range(repeats):
            for name in counts:
                data, output = work / name / "data", work / name / "output"
                cpu = images_step_cpu(data, output, instance)
                step_cpu[name] = min(step_cpu.get(name, math.inf), cpu)
    pool_cpu = {name: math.inf for name in counts}
    for repeat in range(repeats):
        for name in counts:
            _, cpu = stage_run(sources[name], work / f"pool-{name}-{repeat}", 2)
            pool_cpu[name] = min(pool_cpu[name], cpu)
            shutil.rmtree(work / f"pool-{name}-{repeat}")
    added = counts["all"] - counts["few"]
    return {
        "step": (step_cpu["all"] - step_cpu["few"]) / added,
        "pool": (pool_cpu["all"] - pool_cpu["few"]) / added,
        "work alone": work_alone_cpu(sources["all"], work / "alone", repeats),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=6000, help="images of the larger partition")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", choices=sorted(IMAGE_SIZES), help="one image size only")
    args = parser.parse_args()
    os.environ["RADHARMONY_WORKERS"] = "2"
    print(machine_line())
    print(load_line())
    verdicts = []
    for name, sides in IMAGE_SIZES.items():
        if args.only and name != args.only:
            continue
        # ReXGradient-sized renders cost ~50 ms each: a quarter of the count keeps it minutes.
        images = args.images if sides[1] < 400 else max(64, args.images // 4)
        with tempfile.TemporaryDirectory(prefix="bench-image-step-") as folder:
            cpu = measure(Path(folder), sides, images, args.repeats)
        ratio = cpu["step"] / cpu["work alone"]
        verdicts.append(ratio <= TARGET)
        print(
            f"{name:<18} {images:>6} images | step {cpu['step'] * 1e3:6.3f} ms | pool "
            f"{cpu['pool'] * 1e3:6.3f} ms | work alone {cpu['work alone'] * 1e3:6.3f} ms | "
            f"step/work alone {ratio:4.2f}x {'PASS' if ratio <= TARGET else 'FAIL'} "
            f"(≤ {TARGET}x) | pool/work alone {cpu['pool'] / cpu['work alone']:4.2f}x"
        )
    print(load_line())
    return 0 if all(verdicts) else 1


if __name__ == "__main__":
    raise SystemExit(main())
