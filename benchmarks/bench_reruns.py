"""Benchmark: do re-runs redo only what changed (`launch`), and what do they stand on: the
cold look at each source (`cold`) and moving a flat output root into shard folders (`layout`)."""

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
from commands import (
    LAUNCHED_PARTITION,
    cold_stat_floor,
    launch,
    launch_and_kill_halfway,
    launch_environment,
    launch_summary,
)
from common import (
    REPOSITORY,
    Table,
    add_options,
    can_drop_page_cache,
    drop_page_cache,
    write_table,
)
from synthetic_inputs import SMALL_SIDES, change_sources, write_rexgradient_partition

from radharmony_pipeline.processing.storage import output_layout as layout
from radharmony_pipeline.processing.storage.layout_migration import migrate_stage_outputs
from radharmony_pipeline.synthetic import rexgradient

SIDES = SMALL_SIDES
PARTITION = LAUNCHED_PARTITION
REUSING_STAGES = ("raw_index", "labels", "bboxes", "masks", "partition_profile")
TRAIN_IMAGES = 238_968
SECTIONS = ("launch", "cold", "layout")


# --- launch: dg launch as a user runs it ------------------------------------------------------


def described(name: str, wall: float, first: float, env: dict[str, str]) -> dict:
    """The run's line printed, with what it did; its figures."""
    found = launch_summary(env)
    counts = found["counts"]
    images = counts.get("images", {})
    reused = [stage for stage in REUSING_STAGES if counts.get(stage, {}).get("reused")]
    steps = ", ".join(f"{step} {seconds}s" for step, seconds in found["steps"].items())
    print(f"{name}: wall {wall:.1f} s ({wall / first:.2f}x first build)")
    print(
        f"    decoded {images.get('decoded')}, packed rows written "
        f"{images.get('packed_rows_written')}, replayed {images.get('packed_rows_replayed')}, "
        f"re-used: {', '.join(reused) or 'none'}"
    )
    print(f"    steps: {steps}", flush=True)
    return {"run": name, "wall": wall, "ratio": wall / first, **images, "reused": reused}


def launch_section(args: argparse.Namespace) -> Table:
    """Re-runs of one partition through `dg launch`, as a user launches them, on a synthetic
    ReXGradient train split of `--images` 180-200 px radiographs (per-image bookkeeping, not
    pixels, decides the cost), with an instance and output root of its own: the first build
    of `all_stages`; `--repeats` pairs of an unchanged re-run and one after `--changed` of the
    sources were rewritten; a first build on a new root killed (SIGKILL) once half its PNGs
    are written, then launched again. With `--cold` (as root) the page cache is dropped
    before each unchanged re-run, after timing a cold stat of each source by coreutils (the
    disk's own cost of the look the re-run must take)."""
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
        env = launch_environment(data, work / "output", home)
        first = launch(env)
        runs, floors = [described("first build", first, first, env)], []
        for round_number in range(args.repeats):
            if args.cold:
                floors.append(cold_stat_floor(listed))
                print(f"disk: stat each train source, cold, in sequence: {floors[-1]:.1f} s")
                drop_page_cache()
            runs.append(described("unchanged re-run", launch(env), first, env))
            changed = change_sources(sources, args.changed, round_number)
            share = f"{changed} sources changed ({changed / len(sources):.0%})"
            runs.append(described(share, launch(env), first, env))
        if not args.smoke:  # a smoke run's dozen images are built before a kill could land
            resumed_env = launch_environment(data, work / "resumed", home)
            killed = launch_and_kill_halfway(resumed_env, work / "resumed", args.images)
            written = len(list((work / "resumed").glob(layout.resized_png_glob(PARTITION))))
            name = f"killed after {killed:.1f} s ({written:,} PNGs), resumed"
            runs.append(described(name, launch(resumed_env), first, resumed_env))
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    rows = [[r["run"], f"{r['wall']:.1f} s", f"{r['ratio']:.2f}×", r.get("decoded")] for r in runs]
    columns = [f"run ({len(sources):,} images)", "wall", "ratio", "decoded"]
    figures = {"images": len(sources), "runs": runs, "cold_stat_floor": floors}
    return Table("reruns", "Re-runs through `dg launch`", columns, rows, figures)


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
        if not smoke:  # written data reach the disk before a cold look; a smoke run looks warm
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


def cold_section(work: Path, files: int, smoke: bool) -> Table:
    """The floor of an unchanged re-run on a cold tree: the first `files` train films of the
    full-count plan as 30 KB files in ReXGradient's layout (written once under `work`), then
    after `drop_caches` (root only; otherwise warm, and it says so) a stat of every file in
    sequence (the first 3,000) and on 16 and 64 threads, a stat plus the first 4 KB on 16 and
    64 threads, and a warm stat; ms per file, projected to train's 238,968 images."""
    paths = write_tree(work, files, smoke)
    cold = can_drop_page_cache() and not smoke
    state = "cold" if cold else "warm" if smoke else "warm (not root: drop_caches unavailable)"
    passes = [
        ("stat, in sequence", os.stat, 1, paths[:3000], cold),
        ("stat, 16 threads", os.stat, 16, paths, cold),
        ("stat, 64 threads", os.stat, 64, paths, cold),
        ("stat + first 4 KB, 16 threads", stat_and_header, 16, paths, cold),
        ("stat + first 4 KB, 64 threads", stat_and_header, 64, paths, cold),
        ("stat, 16 threads, warm", os.stat, 16, paths, False),
    ]
    figures = {}
    for name, look, threads, chosen, is_cold in passes:
        figures[name] = ms_per_file(look, chosen, threads, is_cold)
        print(
            f"{state if is_cold else 'warm':<5} {name:<30}: {len(chosen):>6} files, "
            f"{figures[name]:.3f} ms each; {figures[name] * TRAIN_IMAGES / 1e3:5.1f} s for "
            f"train's {TRAIN_IMAGES:,}",
            flush=True,
        )
    seconds = {name: ms * TRAIN_IMAGES / 1e3 for name, ms in figures.items()}
    return Table(
        "cold_metadata",
        "The cold floor of an unchanged re-run",
        [f"look ({len(paths):,} files, {'cold' if cold else 'warm'})", "ms per file"],
        [[name, f"{ms:.3f}"] for name, ms in figures.items()],
        {"files": len(paths), "cold": cold, "ms_per_file": figures},
        f"At train's {TRAIN_IMAGES:,} images: {seconds['stat, 16 threads']:.0f} s for the "
        f"stats alone on 16 threads, {seconds['stat + first 4 KB, 16 threads']:.0f} s with a "
        "header read each.",
        "--section cold",
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
    """One rename per entry into its shard folder, each folder created once: the floor of any
    migration (a few thousand images fill every shard)."""
    start = time.perf_counter()
    for shard in sorted({Path(sharded).parent for _, sharded in moves}):
        (root / shard).mkdir()
    for flat, sharded in moves:
        os.rename(root / flat, root / sharded)
    return time.perf_counter() - start


def migration(root: Path) -> float:
    start = time.perf_counter()
    for stage in ("masks", "images"):
        migrate_stage_outputs(root, stage, PARTITION)
    return time.perf_counter() - start


def layout_section(images: int, repeats: int) -> Table:
    """A flat output root of `images` images (a small file per resized image, a union mask
    and a mask folder for every other one, the tables naming them) moved into shard folders
    by `migrate_stage_outputs`, paired per repeat with the floor, one rename per entry; then
    a migration that finds nothing to do (what every later step pays)."""
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
    entries, median = len(moves), statistics.median(ratios)
    migrated, renamed = min(m for m, _ in pairs), min(r for _, r in pairs)
    per_entry = {
        name: seconds / entries * 1e6 for name, seconds in (("m", migrated), ("r", renamed))
    }
    rows = [
        [
            f"migration ({entries:,} entries)",
            f"{migrated:.2f} s ({per_entry['m']:.0f} µs per entry)",
        ],
        ["bare renames", f"{renamed:.2f} s ({per_entry['r']:.0f} µs per entry)"],
        [
            "migration / renames, paired",
            f"median {median:.2f}× ({min(ratios):.2f}–{max(ratios):.2f}×)",
        ],
        ["nothing to do", f"{min(again) * 1e3:.1f} ms"],
    ]
    print(f"{images:,} images, {entries:,} entries moved (images, union masks, mask folders)")
    print(*(f"{name}: {value}" for name, value in rows), sep="\n")
    figures = {"images": images, "entries": entries, "pairs": pairs, "nothing_to_do": again}
    title = "Moving a flat root into shard folders"
    return Table(
        "layout_migration", title, ["figure", "value"], rows, figures, "", "--section layout"
    )


# --- entry point ----------------------------------------------------------------------------


def parse_arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--section", choices=SECTIONS, help="default launch; --smoke: cold, layout")
    parser.add_argument("--images", type=int, help="launch: 3000; layout: 238968")
    parser.add_argument("--changed", type=float, default=0.01, help="share changed per round")
    parser.add_argument("--repeats", type=int, help="launch: re-run pairs (2); layout: 3")
    parser.add_argument("--keep", type=Path, help="launch: work folder kept after the run")
    parser.add_argument(
        "--cold", action="store_true", help="launch: drop the page cache first (root)"
    )
    parser.add_argument("--work", type=Path, help="cold: folder for the tree (kept; required)")
    parser.add_argument("--files", type=int, default=60_000, help="cold: files in the tree")
    add_options(parser)
    args = parser.parse_args(argv)
    if args.section == "cold" and args.work is None and not args.smoke:
        parser.error("--section cold needs --work")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_arguments(argv)
    # A smoke run is tiny and skips `launch` unless named: one dg launch takes several seconds.
    sections = (
        [args.section] if args.section else (["cold", "layout"] if args.smoke else ["launch"])
    )
    with tempfile.TemporaryDirectory(prefix="bench-cold-") as scratch:
        if "launch" in sections:
            args.images = 12 if args.smoke else args.images or 3000
            args.repeats = (0 if args.smoke else 2) if args.repeats is None else args.repeats
            write_table(args, launch_section(args))
        if "cold" in sections:
            work, files = (Path(scratch), 40) if args.smoke else (args.work, args.files)
            write_table(args, cold_section(work, files, args.smoke))
        if "layout" in sections:
            images = 20 if args.smoke else args.images or TRAIN_IMAGES
            write_table(args, layout_section(images, 1 if args.smoke else args.repeats or 3))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
