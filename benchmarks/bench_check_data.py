"""Benchmark: how many of ReXGradient train's 238,968 named images exist, in its real nesting.

Writes full-scale train metadata and an empty file at every path it names (deid_png/<patient>/
<accession>/studies/<uid>/series/<uid>/instances/<sop>.png), then times, in the same run and
on the same warm tree:

- per-name stat: one `os.stat` per image, the request-per-image baseline;
- `existing_names`: what check-data and raw_index use (on a store one listing of the prefix;
  locally a listing per folder holding many named images, a stat for a name alone in its
  folder, as every ReXGradient image is);
- full walk: `os.walk` of the whole deid_png/ tree and a stat of each file it lists, in
  sequence (how the observation job found a split's images before), against `tree_states`,
  what it uses now (the folders of one level listed together, the files stated together, on
  threads while the disk is read);
- floor: bare `os.listdir` of each folder holding a named image, nothing else.

and the whole `check_partition` of rexgradient.train (metadata read included) once.

With `--cold` (as root) the page cache, dentries and inodes are dropped before every timed
run, as a first command after a download or after a build larger than memory meets the tree:
a stat then waits on the disk, and `existing_names` makes those stats on threads.

    .venv/bin/python benchmarks/bench_check_data.py [--root DIR] [--repeats 3] [--cold]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from bench_reruns import drop_page_cache

from radharmony_pipeline.processing.storage.source_store import existing_names, tree_states
from radharmony_pipeline.sources import SourceLocation, open_source
from radharmony_pipeline.sources.preflight import check_partition
from radharmony_pipeline.synthetic import write_full_scale_rexgradient_metadata


def per_name_stat(folder: Path, names: list[str]) -> int:
    found = 0
    for name in names:
        try:
            os.stat(folder / name)
            found += 1
        except FileNotFoundError:
            pass
    return found


def walk_and_stat(folder: Path) -> int:
    stated = 0
    for parent, _, files in os.walk(folder):
        for name in files:
            os.stat(os.path.join(parent, name))
            stated += 1
    return stated


def bare_listings(folder: Path, parents: list[str]) -> int:
    return sum(len(os.listdir(os.path.join(folder, parent))) for parent in parents)


def timed(function, repeats: int, cold: bool) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeats):
        if cold:
            drop_page_cache()
        start = time.perf_counter()
        result = function()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, help="reuse a tree written by an earlier run")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per method (median)")
    parser.add_argument("--cold", action="store_true", help="drop the page cache first (root)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-check-data-") as scratch:
        base = args.root or Path(scratch)
        root = base / "rexgradient"
        if not (root / "deid_png").is_dir():
            start = time.perf_counter()
            root = write_full_scale_rexgradient_metadata(base)
            (root / "deid_png").mkdir()
            source = open_source("rexgradient", SourceLocation(root=root), {})
            names = source.read_split("train").index["image_path"].dropna().tolist()
            for name in names:
                path = root / "deid_png" / name
                path.parent.mkdir(parents=True, exist_ok=True)
                path.touch()
            print(f"wrote {len(names)} empty images in {time.perf_counter() - start:.1f} s")
        source = open_source("rexgradient", SourceLocation(root=root), {})
        names = source.read_split("train").index["image_path"].dropna().tolist()
        folder = root / "deid_png"
        parents = sorted({name.rpartition("/")[0] for name in names})
        print(f"{len(names)} named images in {len(parents)} folders")

        cold = args.cold
        stat_s, stat_found = timed(lambda: per_name_stat(folder, names), args.repeats, cold)
        listed_s, listed = timed(lambda: existing_names(folder, names), args.repeats, cold)
        walk_s, walked = timed(lambda: walk_and_stat(folder), args.repeats, cold)
        tree_s, tree = timed(lambda: tree_states(folder, (".png",)), args.repeats, cold)
        floor_s, _ = timed(lambda: bare_listings(folder, parents), args.repeats, cold)
        assert stat_found == len(listed) == walked == len(tree) == len(names)
        print(f"per-name stat (baseline)  {stat_s:6.2f} s")
        print(f"existing_names            {listed_s:6.2f} s  {listed_s / stat_s:.2f}x baseline")
        print(f"os.walk + stat of each    {walk_s:6.2f} s  {walk_s / stat_s:.2f}x baseline")
        print(f"tree_states (observe)     {tree_s:6.2f} s  {tree_s / walk_s:.2f}x os.walk + stat")
        print(
            f"floor: bare listdir       {floor_s:6.2f} s  existing_names is "
            f"{listed_s / floor_s:.2f}x the floor"
        )
        if cold:
            drop_page_cache()
        start = time.perf_counter()
        report = check_partition(source, "train", configured=True, missing_limit=0.5)
        whole = time.perf_counter() - start
        print(f"check_partition(rexgradient.train) {whole:.2f} s: {report.summary()}")


if __name__ == "__main__":
    main()
