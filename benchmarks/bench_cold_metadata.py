"""The floor of an unchanged re-run on a cold tree: what a `stat` and a header read cost per
file in ReXGradient's layout once the page cache no longer holds the folders.

    sudo .venv/bin/python benchmarks/bench_cold_metadata.py --work /tmp/cold [--files 60000]

Writes (once, kept under --work) the first `--files` train films of the full-count plan as
30 KB files, each in its own series and instances folders as the release lays them out; then
per pass, after `drop_caches` (root only; otherwise every pass is warm and says so): a `stat`
of every file in sequence (the first 3,000) and on 16 and 64 threads, a `stat` plus the first
4 KB of every file on 16 and 64 threads, and a warm `stat` on 16 threads. Prints ms per file
and the projection to ReXGradient train's 238,968 images.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench_reruns import DROP_CACHES, drop_page_cache

from radharmony_pipeline.synthetic import rexgradient

TRAIN_IMAGES = 238_968


def write_tree(root: Path, files: int) -> list[Path]:
    """The files' paths, written the first time only."""
    plan = rexgradient.plan_studies(0, rexgradient.FULL_SCALE, (192, 240))
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


def timed(look: Callable[[Path], object], paths: list[Path], threads: int, cold: bool) -> float:
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, required=True, help="folder for the tree (kept)")
    parser.add_argument("--files", type=int, default=60_000)
    args = parser.parse_args()
    paths = write_tree(args.work, args.files)
    cold = os.access(DROP_CACHES, os.W_OK)
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
        per_file = timed(look, chosen, threads, is_cold)
        print(
            f"{state if is_cold else 'warm':<5} {name:<18} {threads:>2} threads: "
            f"{len(chosen):>6} files, {per_file:.3f} ms each; "
            f"{per_file * TRAIN_IMAGES / 1e3:5.1f} s for train's {TRAIN_IMAGES:,}",
            flush=True,
        )


if __name__ == "__main__":
    main()
