"""The `step` section of bench_images.py: the `images` step's marginal CPU per image against
the work alone, on small films (~190², where per-row bookkeeping shows) and on ReXGradient-sized
8-bit PNGs (730 x 742).

Two synthetic ReXGradient train partitions (`--images` and a sixteenth of it) get every stage
built once (the warm-up). Then each repeat measures, back to back, user and system CPU per
image between the two partitions of: the `images` asset materialized alone through
`all_stages` (checks included, two workers; its outputs set aside first, so every image is
decoded); `build_packed_images` alone (the pool); and over the larger partition's sources the
work alone, then the same writing each image's packed row (49 KB of new pages per image,
0.01-0.3 ms each on this machine). Target: step / work alone <= 1.3x. Step minus pool is the
asset's per-row bookkeeping; pool minus work alone the jobs', pool's and packed array's."""

from __future__ import annotations

import shutil
import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path

import dagster as dg
from baselines import work_alone
from common import SIZE, Table, load_line, pool_cpu_times, ratio, run_stage
from synthetic_inputs import REXGRADIENT_PARTITION, write_rexgradient_partition

from radharmony_pipeline.definitions import build_definitions
from radharmony_pipeline.defs.jobs import ALL_STAGES_JOB
from radharmony_pipeline.processing.storage import output_layout as layout
from radharmony_pipeline.processing.storage.packed_rows import PackedRowWriter
from radharmony_pipeline.processing.storage.store import allocate_array

PARTITION = REXGRADIENT_PARTITION
# --only's names, their films' (shortest, longest) side, and the name the table gives them:
# count-driven small films, and ReXGradient-sized 8-bit PNGs.
IMAGE_SIZES = {"small ~190²": ((180, 200), "~190²"), "rex-sized 730x742": ((730, 742), "730 × 742")}
TARGET = 1.3
# A smoke run builds only these, without their checks (Great Expectations' import alone
# takes seconds), once, on one partition.
SMOKE_SELECTION = dg.AssetSelection.assets("raw_index", "labels", "masks", "images")

Cpu = tuple[float, float]  # (user, system) CPU seconds


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
    if path.exists():  # a smoke run has built nothing yet
        path.rename(trash / f"{len(list(trash.iterdir()))}-{path.name}")


def step_job(data: Path, output: Path, smoke: bool) -> dg.JobDefinition:
    """`all_stages` on these roots; in a smoke run, the images stage and what it reads."""
    definitions = build_definitions(data, output)
    if not smoke:
        return definitions.resolve_job_def(ALL_STAGES_JOB)
    job = dg.define_asset_job("smoke", SMOKE_SELECTION.without_checks())
    return dg.Definitions.merge(definitions, dg.Definitions(jobs=[job])).resolve_job_def("smoke")


def images_step(
    data: Path, output: Path, instance: dg.DagsterInstance, trash: Path, smoke: bool = False
) -> None:
    """One materialization of `images` for the partition, every image decoded (its outputs
    set aside first); in a smoke run with what it reads."""
    for path in output.glob(f"{layout.packed_images(PARTITION)}*"):
        set_aside(path, trash)
    set_aside(output / layout.resized_image_folder(PARTITION), trash)
    result = step_job(data, output, smoke).execute_in_process(
        partition_key=PARTITION,
        instance=instance,
        asset_selection=None if smoke else [dg.AssetKey("images")],
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


def measure(
    work: Path, sides: tuple[int, int], images: int, repeats: int, smoke: bool
) -> list[dict[str, Cpu]]:
    """Per repeat, per image (user, system) CPU of step, pool, work alone and with rows; a
    smoke run has no warm-up and one partition, its whole cost taken as marginal."""
    counts = {"few": max(2, images // 16), "all": images}
    if smoke:
        counts = {"all": images}
    added = counts["all"] - counts.get("few", 0)
    sources = {}
    repeat_results = []
    trash = work / "set-aside"
    with dg.DagsterInstance.ephemeral() as instance:
        for name, count in counts.items():
            data, output = work / name / "data", work / name / "output"
            sources[name] = write_rexgradient_partition(data, count, sides=sides)
            job = build_definitions(data, output).resolve_job_def(ALL_STAGES_JOB)
            if (
                not smoke
                and not job.execute_in_process(partition_key=PARTITION, instance=instance).success
            ):
                raise SystemExit(f"all_stages failed on {data}")
        for repeat in range(repeats):
            step, pool = {"few": (0.0, 0.0)}, {"few": (0.0, 0.0)}
            for name in counts:
                data, output = work / name / "data", work / name / "output"
                step[name] = cpu_of(images_step, data, output, instance, trash, smoke)
                pool[name] = cpu_of(run_stage, sources[name], work / f"pool-{name}-{repeat}", 2)
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


def report(
    name: str, sides: tuple[int, int], images: int, repeats: int, folder: Path, smoke: bool
) -> dict:
    """Measure one image size and print every repeat and the median; its figures."""
    # ReXGradient-sized renders cost ~50 ms each: a quarter of the count keeps it minutes.
    images = images if sides[1] < 400 or images < 64 else max(64, images // 4)
    repeat_results = measure(folder / f"{sides[0]}x{sides[1]}", sides, images, repeats, smoke)
    ratios, user_ratios, row_ratios = [], [], []
    for repeat, cpu in enumerate(repeat_results, 1):
        alone = cpu["work alone"]
        ratios.append(ratio(sum(cpu["step"]), sum(alone)))
        user_ratios.append(ratio(cpu["step"][0], alone[0]))
        row_ratios.append(ratio(sum(cpu["step"]), sum(cpu["with rows"])))
        print(
            f"{name:<18} {images:>6} images, repeat {repeat} | step {describe(cpu['step'])} "
            f"| pool {describe(cpu['pool'])} | work alone {describe(alone)} | with rows "
            f"{describe(cpu['with rows'])} | step/work alone {ratios[-1]:4.2f}x "
            f"({user_ratios[-1]:4.2f}x user; {row_ratios[-1]:4.2f}x with rows) | "
            f"pool/work alone {ratio(sum(cpu['pool']), sum(alone)):4.2f}x"
        )
    median = statistics.median(ratios)
    print(
        f"{name:<18} median step/work alone {median:4.2f}x "
        f"{'PASS' if median <= TARGET else 'FAIL'} (≤ {TARGET}x; repeats "
        f"{min(ratios):4.2f}-{max(ratios):4.2f}x); user CPU alone "
        f"{statistics.median(user_ratios):4.2f}x; against the work alone with rows "
        f"{statistics.median(row_ratios):4.2f}x"
    )
    return {
        "images": images,
        "ratio": median,
        "ratios": ratios,
        "user_ratio": statistics.median(user_ratios),
        "with_rows_ratio": statistics.median(row_ratios),
        "repeats": repeat_results,
    }


def run_step_section(images: int, repeats: int, only: str | None, smoke: bool) -> Table:
    print(load_line())
    figures = {}
    # One folder for every size, deleted at the end: see set_aside.
    folder = Path(tempfile.mkdtemp(prefix="bench-image-step-"))
    try:
        for name, (sides, label) in IMAGE_SIZES.items():
            if not only or name == only:
                figures[label] = report(name, sides, images, repeats, folder, smoke)
    finally:
        shutil.rmtree(folder)
    print(load_line())
    rows = [
        [
            label,
            f"{size['ratio']:.2f}× ({min(size['ratios']):.2f}–{max(size['ratios']):.2f}×): "
            + ("met" if size["ratio"] <= TARGET else "not met"),
            f"{size['user_ratio']:.2f}×",
            f"{size['with_rows_ratio']:.2f}×",
        ]
        for label, size in figures.items()
    ]
    return Table(
        "images_step",
        "The `images` step against the work alone",
        ["films", f"step / work alone (target ≤ {TARGET}×)", "user CPU only", "step / with rows"],
        rows,
        figures,
        "User + system CPU per image, the median of the repeats (their range in brackets).",
        "--sections step",
    )
