"""How long moving a flat output root into shard folders takes, against the bare renames.

    .venv/bin/python benchmarks/bench_layout_migration.py [--images 238968] [--repeats 3]

Writes a root of the flat layout (one small file per resized image, a union mask and a mask
folder for every other image, the images, masks and manifest tables naming them) in a
temporary folder, then per repeat, back to back on fresh copies: the migration of the
partition's masks and images (`migrate_stage_outputs`: listing, renames, the tables rewritten)
and the floor, one `os.rename` per entry into the same shard folders in one loop. Prints both,
their ratio, and the time of a migration that finds nothing to do (what every later step pays).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from radharmony_pipeline.processing.storage import output_layout as layout
from radharmony_pipeline.processing.storage.layout_migration import migrate_stage_outputs

PARTITION = "rexgradient.train"


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=238_968)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-layout-") as scratch:
        template = Path(scratch) / "template"
        moves = write_flat_root(template, args.images)
        pairs, again = [], []
        for repeat in range(args.repeats):
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
        print(
            f"{args.images:,} images, {entries:,} entries moved (images, union masks, mask folders)"
        )
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


if __name__ == "__main__":
    main()
