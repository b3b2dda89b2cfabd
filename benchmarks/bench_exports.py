"""Benchmark: each export format (Hugging Face Parquet, WebDataset tar) against reading and
decoding the PNGs it exports."""

from __future__ import annotations

import argparse
import io
import math
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from common import Table, add_options, load_line, write_table
from PIL import Image
from synthetic_outputs import EXPORT_CLASS, export_samples

from radharmony_pipeline.processing.corpus.exports import (
    WEBDATASET,
    export_partition,
    huggingface_format,
    huggingface_shards,
    webdataset_shards,
)
from radharmony_pipeline.processing.storage import output_layout as layout

SIZE = 224
TARGET = 1.5
PARTITION = "bench.train"
SHARD_BYTES = 256 * 2**20


def read_and_decode(files: list[Path]) -> int:
    total = 0
    for path in files:
        with Image.open(io.BytesIO(path.read_bytes())) as image:
            total += np.asarray(image).size
    return total


def best_of(repeat: int, run: Callable[[], object]) -> float:
    """The best wall seconds of `repeat` calls (a call is only ever slowed by other load)."""
    best = math.inf
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    """N resized 224² radiograph PNGs as `images` writes them, a union mask and a class mask
    for half; the floor (their bytes read; read and decoded by Pillow) and each export as the
    assets call it, fresh folder each time, best of `--repeat` on a warm page cache. Target:
    each export within 1.5x of read + decode."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    add_options(parser)
    args = parser.parse_args()
    if args.smoke:
        args.images, args.repeat = 8, 1
    workers = os.cpu_count() or 1
    print(f"start: {load_line()}; export threads: {workers}")
    with tempfile.TemporaryDirectory(prefix="bench-exports-") as scratch:
        root = Path(scratch)
        rng = np.random.default_rng(args.seed)
        samples = export_samples(root, PARTITION, args.images, SIZE, rng)
        files = [s.image for s in samples] + [s.mask for s in samples if s.mask is not None]
        megabytes = sum(path.stat().st_size for path in files) / 2**20
        print(f"{len(samples)} samples, {len(files)} PNGs, {megabytes:.1f} MiB")
        seconds = {
            "bare read of the PNGs": best_of(args.repeat, lambda: [p.read_bytes() for p in files]),
            "read + decode of the PNGs": best_of(args.repeat, lambda: read_and_decode(files)),
        }
        formats = {
            "Hugging Face": (
                huggingface_format((EXPORT_CLASS,)),
                huggingface_shards("train"),
                "i.json",
                layout.HUGGINGFACE_EXPORT,
            ),
            "WebDataset": (
                WEBDATASET,
                webdataset_shards(PARTITION),
                "index.json",
                layout.WEBDATASET_EXPORT,
            ),
        }
        sizes = {}
        for name, (export, names, index, export_folder) in formats.items():
            folder = root / export_folder

            def run(export=export, names=names, index=index, folder=folder) -> None:
                shutil.rmtree(folder, ignore_errors=True)
                export_partition(samples, export, folder, names, index, SHARD_BYTES, {}, workers)

            seconds[f"{name} export"] = best_of(args.repeat, run)
            sizes[name] = sum(p.stat().st_size for p in folder.iterdir()) / 2**20
    print(f"end: {load_line()}")
    decode, read = seconds["read + decode of the PNGs"], seconds["bare read of the PNGs"]
    rows = []
    for name, value in seconds.items():
        export = name.removesuffix(" export")
        cell, target = f"{value:.3f} s ({len(samples) / value:,.0f} samples/s", ""
        if export in sizes:
            verdict = "met" if value / decode <= TARGET else "NOT met"
            cell += f", {sizes[export]:.1f} MiB): {value / decode:.2f}× read + decode, "
            cell += f"{value / read:.2f}× bare read"
            target = f"≤ {TARGET}× read + decode: {verdict}"
        rows.append([name, cell if export in sizes else cell + ")", target])
    title = "Exports against reading and decoding their PNGs"
    figures = {
        "samples": len(samples),
        "pngs": len(files),
        "MiB": megabytes,
        "seconds": seconds,
        "export_MiB": sizes,
        "workers": workers,
    }
    write_table(args, Table("exports", title, ["figure", "value", "target"], rows, figures))


if __name__ == "__main__":
    main()
