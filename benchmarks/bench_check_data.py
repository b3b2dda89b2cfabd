"""Benchmark: how many of ReXGradient train's 238,968 named images exist, in its real nesting.

Writes full-scale train metadata and an empty file at every path it names (deid_png/<patient>/
<accession>/studies/<uid>/series/<uid>/instances/<sop>.png), then times, in the same run and
on the same warm tree:

- per-name stat: one `os.stat` per image, the request-per-image baseline;
- `existing_names`: what check-data and raw_index use (on a store one listing of the prefix;
  locally a listing per folder holding many named images, a stat for a name alone in its
  folder, as every ReXGradient image is);
- full walk: `os.walk` of the whole deid_png/ tree;
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

from radharmony_pipeline.processing.storage.source_store import existing_names
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


def full_walk(folder: Path) -> int:
    return sum(len(files) for _, _, files in os.walk(folder))


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
        walk_s, walked = timed(lambda: full_walk(folder), args.repeats, cold)
        floor_s, _ = timed(lambda: bare_listings(folder, parents), args.repeats, cold)
        assert stat_found == len(listed) == walked == len(names)
        print(f"per-name stat (baseline)  {stat_s:6.2f} s")
        print(f"existing_names            {listed_s:6.2f} s  {listed_s / stat_s:.2f}x baseline")
        print(f"os.walk of deid_png/      {walk_s:6.2f} s  {walk_s / stat_s:.2f}x baseline")
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
