"""Benchmark: re-runs, and what they stand on. Three sections (`--section`):

* `launch` (the default): re-runs of one partition through `dg launch`, as a user launches
  them. Writes a synthetic ReXGradient train split of `--images` (default 3000) radiographs of
  180-200 pixels (per-image bookkeeping rather than pixels decides the cost), then, on an
  instance and output root of its own: the first build of `all_stages`; `--repeats` pairs of
  an unchanged re-run and a re-run after `--changed` of the sources were rewritten; a first
  build on a new output root killed with SIGKILL once half of its PNGs are written, then
  launched again (the resume). With `--cold` (as root) the page cache is dropped before each
  unchanged re-run, after a cold stat of each train source by coreutils is timed (the disk's
  own cost of the look an unchanged re-run must take). Each line gives the wall of the whole
  launch, its ratio to the first build, the steps' durations and the stages' counts (images
  decoded, packed rows written, tables re-used).
* `cold` (formerly bench_cold_metadata.py): the floor of an unchanged re-run on a cold tree.
  Writes once under `--work` the first `--files` (default 60,000) train films of the
  full-count plan as 30 KB files in ReXGradient's layout, then per pass, after `drop_caches`
  (root only; otherwise warm, and it says so): a `stat` of every file in sequence (the first
  3,000) and on 16 and 64 threads, a `stat` plus the first 4 KB on 16 and 64 threads, a warm
  `stat` on 16 threads; ms per file and the projection to train's 238,968 images.
* `layout` (formerly bench_layout_migration.py): a flat output root (one small file per
  resized image, a union mask and a mask folder for every other image, the tables naming
  them) of `--images` (default 238,968) migrated into shard folders by
  `migrate_stage_outputs`, paired per repeat with the floor, one `os.rename` per entry; their
  ratio, and a migration that finds nothing to do (what every later step pays).

    .venv/bin/python benchmarks/bench_reruns.py [--images 3000] [--changed 0.01] [--repeats 2]
        [--keep DIR] [--cold]
    sudo .venv/bin/python benchmarks/bench_reruns.py --section cold --work /tmp/cold [--files N]
    .venv/bin/python benchmarks/bench_reruns.py --section layout [--images 238968] [--repeats 3]
    .venv/bin/python benchmarks/bench_reruns.py --smoke   # every section, tiny
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from common import (
    REPOSITORY,
    SMALL_SIDES,
    add_smoke,
    can_drop_page_cache,
    drop_page_cache,
    write_rexgradient_partition,
)
from launches import (
    PARTITION,
    change_sources,
    cold_stat_floor,
    environment,
    launch,
    launch_and_kill_halfway,
    summary,
)

from radharmony_pipeline.processing.storage import output_layout as layout
from radharmony_pipeline.processing.storage.layout_migration import migrate_stage_outputs
from radharmony_pipeline.synthetic import rexgradient

SIDES = SMALL_SIDES
REUSING_STAGES = ("raw_index", "labels", "bboxes", "masks", "partition_profile")
TRAIN_IMAGES = 238_968


# --- launch: dg launch as a user runs it ------------------------------------------------------


def describe(name: str, wall: float, first: float | None, env: dict[str, str]) -> None:
    found = summary(env)
    counts = found["counts"]
    images = counts.get("images", {})
    reused = [stage for stage in REUSING_STAGES if counts.get(stage, {}).get("reused")]
    ratio = f" ({wall / first:.2f}x first build)" if first else ""
    steps = ", ".join(f"{step} {seconds}s" for step, seconds in found["steps"].items())
    print(f"{name}: wall {wall:.1f} s{ratio}")
    print(
        f"    decoded {images.get('decoded')}, packed rows written "
        f"{images.get('packed_rows_written')}, replayed {images.get('packed_rows_replayed')}, "
        f"re-used: {', '.join(reused) or 'none'}"
    )
    print(f"    steps: {steps}")


def launch_section(args: argparse.Namespace) -> int:
    """First build, unchanged and changed re-runs, a killed build resumed, via dg launch."""
    work = args.keep or Path(tempfile.mkdtemp(prefix="bench-reruns-"))
    try:
        data, home = work / "data", work / "dagster_home"
        for previous in ("output", "resumed"):  # a kept folder's earlier runs
            shutil.rmtree(work / previous, ignore_errors=True)
        shutil.rmtree(home, ignore_errors=True)
        home.mkdir(parents=True)
        shutil.copy(REPOSITORY / "dagster_home" / "dagster.yaml", home)
        start = time.perf_counter()
        listed = data / "train_sources.txt"
        if not listed.exists():
            shutil.rmtree(data, ignore_errors=True)
            listed.parent.mkdir(parents=True)
            listed.write_text("\n".join(map(str, write_rexgradient_partition(data, args.images))))
        sources = [Path(line) for line in listed.read_text().splitlines()]
        print(f"{len(sources)} train images of {SIDES[0]}-{SIDES[1]} px "
              f"({time.perf_counter() - start:.0f} s to write), cores: {os.cpu_count()}, "
              f"load {os.getloadavg()[0]:.1f}")  # fmt: skip
        env = environment(data, work / "output", home)
        first = launch(env)
        describe("first build", first, None, env)
        for round_number in range(args.repeats):
            if args.cold:
                floor = cold_stat_floor(listed)
                print(f"disk: stat each train source, cold, in sequence: {floor:.1f} s")
                drop_page_cache()
            describe("unchanged re-run", launch(env), first, env)
            changed = change_sources(sources, args.changed, round_number)
            describe(f"{changed} sources changed", launch(env), first, env)
        if args.smoke:  # the first build alone
            return 0
        resumed_env = environment(data, work / "resumed", home)
        killed = launch_and_kill_halfway(resumed_env, work / "resumed", args.images)
        written = len(list((work / "resumed").glob(layout.resized_png_glob(PARTITION))))
        print(f"first build killed after {killed:.1f} s with {written} PNGs written")
        describe("resumed", launch(resumed_env), first, resumed_env)
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    return 0


# --- cold: the floor of an unchanged re-run's look -------------------------------------------


def write_tree(root: Path, files: int, smoke: bool = False) -> list[Path]:
    """The files' paths, written the first time only (a smoke run plans a tiny release)."""
    sizes = rexgradient.FULL_SCALE
    if smoke:
        sizes = {**rexgradient.SIZES["tiny"], "train": rexgradient.SplitSize(120, 200, 80)}
    plan = rexgradient.plan_studies(0, sizes, (192, 240))
    paths = [
        root / path.removeprefix(rexgradient.IMAGE_PREFIX)
        for _, study in plan["train"]
        for path in study["ImagePath"]
    ][:files]
    done = root / "complete"
    if not done.exists():
        content = os.urandom(30_000)
        for path in paths:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(content)
        os.sync()
        done.touch()
    return paths


def stat_and_header(path: Path) -> bytes:
    os.stat(path)
    with open(path, "rb") as handle:
        return handle.read(4096)


def ms_per_file(
    look: Callable[[Path], object], paths: list[Path], threads: int, cold: bool
) -> float:
    """Milliseconds per file of `look` over `paths` on `threads` (1: in sequence)."""
    if cold:
        drop_page_cache()
    start = time.perf_counter()
    if threads == 1:
        for path in paths:
            look(path)
    else:
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(look, paths, chunksize=64))
    return (time.perf_counter() - start) / len(paths) * 1e3


def cold_section(work: Path, files: int, smoke: bool) -> None:
    """The cold floor of an unchanged re-run's look at each file."""
    paths = write_tree(work, files, smoke)
    cold = can_drop_page_cache() and not smoke
    state = "cold" if cold else "warm (not root: drop_caches unavailable)"
    passes = [
        ("stat", os.stat, 1, paths[:3000], cold),
        ("stat", os.stat, 16, paths, cold),
        ("stat", os.stat, 64, paths, cold),
        ("stat + first 4 KB", stat_and_header, 16, paths, cold),
        ("stat + first 4 KB", stat_and_header, 64, paths, cold),
        ("stat", os.stat, 16, paths, False),
    ]
    for name, look, threads, chosen, is_cold in passes:
        per_file = ms_per_file(look, chosen, threads, is_cold)
        print(
            f"{state if is_cold else 'warm':<5} {name:<18} {threads:>2} threads: "
            f"{len(chosen):>6} files, {per_file:.3f} ms each; "
            f"{per_file * TRAIN_IMAGES / 1e3:5.1f} s for train's {TRAIN_IMAGES:,}",
            flush=True,
        )


# --- layout: a flat root into shard folders --------------------------------------------------


def write_flat_root(root: Path, count: int) -> list[tuple[str, str]]:
    """The flat root; the (flat, sharded) path of every entry the migration moves."""
    images = layout.resized_image_folder(PARTITION)
    masks = layout.mask_folder(PARTITION)
    (root / images).mkdir(parents=True)
    (root / masks).mkdir(parents=True)
    moves, image_paths, union_paths, mask_paths = [], [], [], []
    for number in range(count):
        key = f"rexgradient__{number:08d}"
        shard = layout.image_shard(key)
        masked = number % 2 == 0
        names = [f"{key}{layout.RESIZED_IMAGE_SUFFIX}"]
        names += [f"{key}{layout.UNION_MASK_SUFFIX}"] if masked else []
        for name in names:
            (root / images / name).write_bytes(b"png")
            moves.append((f"{images}/{name}", f"{images}/{shard}/{name}"))
        image_paths.append(f"{images}/{names[0]}")
        union_paths.append(f"{images}/{names[1]}" if masked else None)
        if masked:
            (root / masks / key).mkdir()
            (root / masks / key / "any.png").write_bytes(b"png")
            moves.append((f"{masks}/{key}", f"{masks}/{shard}/{key}"))
            mask_paths.append(f"{masks}/{key}/any.png")
    table = pd.DataFrame({"image_path": image_paths, "mask_path": union_paths})
    for relative, frame in (
        (layout.table_path("images", PARTITION), table),
        (layout.MANIFEST, table),
        (layout.table_path("masks", PARTITION), pd.DataFrame({"mask_path": mask_paths})),
    ):
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), root / relative)
    return moves


def bare_renames(root: Path, moves: list[tuple[str, str]]) -> float:
    """One rename per entry into its (created) shard folder: the floor of any migration."""
    start = time.perf_counter()
    for folder in (layout.resized_image_folder(PARTITION), layout.mask_folder(PARTITION)):
        for shard in range(layout.SHARD_COUNT):
            (root / folder / f"{shard:0{layout.SHARD_DIGITS}x}").mkdir()
    for flat, sharded in moves:
        os.rename(root / flat, root / sharded)
    return time.perf_counter() - start


def migration(root: Path) -> float:
    start = time.perf_counter()
    for stage in ("masks", "images"):
        migrate_stage_outputs(root, stage, PARTITION)
    return time.perf_counter() - start


def layout_section(images: int, repeats: int) -> None:
    """A flat root's migration into shard folders against the bare renames."""
    with tempfile.TemporaryDirectory(prefix="bench-layout-") as scratch:
        template = Path(scratch) / "template"
        moves = write_flat_root(template, images)
        pairs, again = [], []
        for repeat in range(repeats):
            roots = [Path(scratch) / f"{name}{repeat}" for name in ("migrated", "renamed")]
            for root in roots:
                shutil.copytree(template, root)
            pairs.append((migration(roots[0]), bare_renames(roots[1], moves)))
            again.append(migration(roots[0]))
            for root in roots:
                shutil.rmtree(root)
        ratios = [migrated / renamed for migrated, renamed in pairs]
        entries = len(moves)
        best_migration = min(m for m, _ in pairs)
        best_renames = min(r for _, r in pairs)
        print(f"{images:,} images, {entries:,} entries moved (images, union masks, mask folders)")
        print(
            f"migration    {best_migration:.2f} s "
            f"({best_migration / entries * 1e6:.1f} µs per entry)"
        )
        print(
            f"bare renames {best_renames:.2f} s  ({best_renames / entries * 1e6:.1f} µs per entry)"
        )
        print(
            "ratio migration / renames, paired per repeat: "
            f"median {statistics.median(ratios):.2f}x "
            f"(range {min(ratios):.2f}-{max(ratios):.2f}x)"
        )
        print(f"nothing to do (a later step's check): {min(again) * 1e3:.1f} ms")


# --- entry point ----------------------------------------------------------------------------


def parse_arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--section", choices=("launch", "cold", "layout"), default="launch")
    parser.add_argument("--images", type=int, help="launch: 3000; layout: 238968")
    parser.add_argument("--changed", type=float, default=0.01, help="share changed per round")
    parser.add_argument("--repeats", type=int, help="launch: re-run pairs (2); layout: 3")
    parser.add_argument("--keep", type=Path, help="launch: work folder kept after the run")
    parser.add_argument(
        "--cold", action="store_true", help="launch: drop the page cache first (root)"
    )
    parser.add_argument("--work", type=Path, help="cold: folder for the tree (kept; required)")
    parser.add_argument("--files", type=int, default=60_000, help="cold: files in the tree")
    add_smoke(parser)
    args = parser.parse_args(argv)
    if args.section == "cold" and args.work is None and not args.smoke:
        parser.error("--section cold needs --work")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_arguments(argv)
    if args.smoke:  # every section, tiny: one dg launch (the first build), 300 entries, 200 files
        args.images, args.repeats, args.cold = 12, 0, False
        launch_section(args)
        layout_section(300, 1)
        with tempfile.TemporaryDirectory(prefix="bench-cold-") as work:
            cold_section(Path(work), 200, smoke=True)
        return 0
    if args.section == "layout":
        layout_section(args.images or 238_968, args.repeats or 3)
    elif args.section == "cold":
        cold_section(args.work, args.files, smoke=False)
    else:
        args.images = args.images or 3000
        args.repeats = 2 if args.repeats is None else args.repeats
        return launch_section(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
