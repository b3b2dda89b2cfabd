"""Benchmark: `radharmony verify` on one large partition against the floor of reading its
outputs once, with the peak memory of both.

It writes, once, a partition of N images (default 20,000) at S×S (default 224) as the
`images` stage leaves it: an `images` table, one radiograph PNG per image (written by
`write_tagged_png`, the stage's own writer, with its pixel digest tag), a union-mask PNG for
one image in ten (`mask_png`) and the packed N×S×S array, at the paths output_layout gives.
The pixels are 16 radiographs rendered by the project's renderer plus per-image noise (3 grey
levels), so every PNG differs and compresses like a small radiograph.

Then, `--repeats` times, back to back (this machine's speed drifts between runs seconds
apart, so each pair shares its drift):

1. **floor**: every file verify reads (the table, every PNG, the packed array) read once in
   1 MiB blocks into a discarded buffer by one process, `cat > /dev/null` in Python;
2. **verify**: `radharmony verify --partition P --output-root ROOT` as a subprocess under
   `/usr/bin/time -f %M`, with RADHARMONY_WORKERS=`--workers`: its wall time, the time its
   last progress line gives for the checks themselves (without the command's start-up: its
   imports and the pool's), the peak RSS of its largest process as time reports it (the
   issue's measure), and the peak of the summed RSS of its whole process tree (sampled by
   psutil every 50 ms).

The page cache is warm for both (the files were just written or read), so the floor is the
cost of reaching every byte, not of the disk. The last lines give the median ratio verify /
floor (whole command, and checks alone), the peak RSS against the packed array's size and
against hashing its rows through one memory map of the whole file (as verify read it before),
one run with a single worker for scale, and twice the CPU time of verify's checks in this
process against that of reading every file once (load changes CPU time far less than wall).

    .venv/bin/python benchmarks/bench_verify.py [--images 20000] [--size 224] [--workers 2]
        [--repeats 3] [--keep DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import psutil
from common import add_smoke

from radharmony_pipeline.operations.verify import verify_outputs
from radharmony_pipeline.processing.imaging.perceptual_hash import pixels_sha256
from radharmony_pipeline.processing.imaging.tagged_png import mask_png, write_tagged_png
from radharmony_pipeline.processing.storage import output_layout as layout
from radharmony_pipeline.processing.storage.integrity import PIXEL_DIGEST
from radharmony_pipeline.synthetic.radiograph import render_radiograph, to_uint8
from radharmony_pipeline.vocabulary import STATUS_OK

PARTITION = "rexgradient.train"
TEMPLATES = 16
NOISE_LEVELS = 3.0
MASK_EVERY = 10
READ_BLOCK = 1 << 20


def write_partition(root: Path, images: int, size: int) -> None:
    """The partition's images table, PNGs and packed array (skipped when already there)."""
    table_path = layout.table_file(root, "images", PARTITION)
    if table_path.exists():
        return
    rng = np.random.default_rng(0)
    templates = [to_uint8(render_radiograph(rng, size, size).pixels) for _ in range(TEMPLATES)]
    packed = root / layout.packed_images(PARTITION)
    packed.parent.mkdir(parents=True, exist_ok=True)
    array = np.lib.format.open_memmap(packed, mode="w+", dtype=np.uint8, shape=(images, size, size))
    records = []
    mask = mask_png((templates[0] > 127).astype(np.uint8) * 255)
    for row in range(images):
        noise = rng.normal(0.0, NOISE_LEVELS, (size, size))
        pixels = np.clip(templates[row % TEMPLATES] + noise, 0, 255).astype(np.uint8)
        array[row] = pixels
        key = f"img{row:07d}"
        image_path = layout.resized_image(PARTITION, key)
        mask_path = layout.resized_union_mask(PARTITION, key) if row % MASK_EVERY == 0 else None
        # As the images stage writes it: the pixels' digest among its tags.
        digest = pixels_sha256(pixels)
        write_tagged_png(root / image_path, lambda p=pixels: p, key, {PIXEL_DIGEST: digest})
        if mask_path is not None:
            write_file(root / mask_path, mask)
        records.append(
            {
                "image_id": key,
                "image_path": image_path,
                "mask_path": mask_path,
                PIXEL_DIGEST: digest,
                "tensor_index": row,
                "status": STATUS_OK,
            }
        )
    array.flush()
    del array
    table_path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(records).to_parquet(table_path)


def write_file(path: Path, content: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)


def output_files(root: Path) -> list[Path]:
    """Every file verify reads: the table, the PNGs it names, the packed array."""
    table_path = layout.table_file(root, "images", PARTITION)
    table = pd.read_parquet(table_path, columns=["image_path", "mask_path"])
    named = [*table["image_path"].dropna(), *table["mask_path"].dropna()]
    return [
        table_path,
        *(root / relative for relative in named),
        root / layout.packed_images(PARTITION),
    ]


def read_once(files: list[Path]) -> tuple[float, int]:
    """(seconds, bytes) to read every file once in blocks, discarding them."""
    buffer = bytearray(READ_BLOCK)
    total = 0
    started = time.perf_counter()
    for path in files:
        with open(path, "rb", buffering=0) as handle:
            while got := handle.readinto(buffer):
                total += got
    return time.perf_counter() - started, total


def run_verify(root: Path, workers: int) -> tuple[float, float, int, int]:
    """(wall seconds, seconds of the checks as its last progress line gives them, peak RSS
    of the largest process in bytes (time's %M), peak summed RSS of the process tree in
    bytes) of the command."""
    environment = {**os.environ, "RADHARMONY_WORKERS": str(workers)}
    environment.pop("DAGSTER_HOME", None)
    environment.pop("RADHARMONY_DASK_SCHEDULER", None)
    command = [
        "/usr/bin/time",
        "-f",
        "maxrss_kb=%M",
        sys.executable,
        "-m",
        "radharmony_pipeline.cli",
        "verify",
        "--partition",
        PARTITION,
        "--output-root",
        str(root),
    ]
    started = time.perf_counter()
    process = subprocess.Popen(
        command, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    tree_peak = 0
    watched = psutil.Process(process.pid)
    while process.poll() is None:
        tree_peak = max(tree_peak, _tree_rss(watched))
        time.sleep(0.05)
    wall = time.perf_counter() - started
    out, err = process.communicate()
    if process.returncode != 0:
        raise SystemExit(f"verify failed ({process.returncode}):\n{out}\n{err}")
    lines = err.strip().splitlines()
    largest = int(next(line for line in lines if line.startswith("maxrss_kb=")).split("=")[1])
    finished = next(
        (m for line in lines if (m := re.search(r"outputs checked in ([0-9.]+) s", line))), None
    )
    if finished is None:
        raise SystemExit(f"verify printed no final progress line:\n{err}")
    # The line gives tenths of a second: a tiny (--smoke) partition's checks print 0.0.
    checks = max(float(finished.group(1)), 0.05)
    return wall, checks, largest * 1024, tree_peak


# The packed array's rows hashed through one memory map of the whole file, as verify read it
# before packed_rows: every page touched stays in the process's resident set.
_MAPPED_WHOLE = """
import hashlib, sys
import numpy as np
array = np.load(sys.argv[1], mmap_mode="r")
for row in array:
    hashlib.sha256(row.tobytes()).hexdigest()
"""


def mapped_whole_rss(packed: Path) -> int:
    """Peak RSS in bytes (time's %M) of hashing every row through a whole-file memory map."""
    command = ["/usr/bin/time", "-f", "maxrss_kb=%M", sys.executable, "-c", _MAPPED_WHOLE]
    done = subprocess.run([*command, str(packed)], capture_output=True, text=True, check=True)
    line = next(x for x in done.stderr.splitlines() if x.startswith("maxrss_kb="))
    return int(line.split("=")[1]) * 1024


def cpu_in_one_process(root: Path, files: list[Path]) -> tuple[float, float]:
    """(CPU seconds of reading every file once, CPU seconds of verify's checks) in this one
    process, back to back: the work itself, which a loaded machine changes far less than
    wall time."""
    started = time.process_time()
    read_once(files)
    floor = time.process_time() - started
    started = time.process_time()
    mismatches = verify_outputs(root, [PARTITION], None)
    checks = time.process_time() - started
    if mismatches:
        raise SystemExit(f"the partition does not verify: {mismatches[0]}")
    return floor, checks


def _tree_rss(process: psutil.Process) -> int:
    total = 0
    for member in [process, *process.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):  # it ended meanwhile
            total += member.memory_info().rss
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=20_000)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3, choices=range(1, 21), metavar="1-20")
    parser.add_argument(
        "--keep", type=Path, default=None, help="write (or reuse) the partition here"
    )
    add_smoke(parser)
    args = parser.parse_args()
    if args.smoke:
        args.images, args.repeats, args.keep = 60, 1, None

    with tempfile.TemporaryDirectory(prefix="bench_verify-") as scratch:
        root = args.keep or Path(scratch)
        started = time.perf_counter()
        write_partition(root, args.images, args.size)
        print(
            f"partition {PARTITION}: {args.images:,} images at {args.size}² in {root} "
            f"(ready in {time.perf_counter() - started:.1f} s)"
        )
        files = output_files(root)
        # What verify's progress counts: every PNG and every packed row.
        outputs = len(files) - 2 + args.images
        packed_bytes = (root / layout.packed_images(PARTITION)).stat().st_size
        print(f"load average at start: {os.getloadavg()[0]:.2f}; {os.cpu_count()} CPUs")
        read_once(files)  # warm the page cache for both measurements
        ratios, check_ratios, walls, largest_peaks, tree_peaks = [], [], [], [], []
        for repeat in range(1, args.repeats + 1):
            floor, total = read_once(files)
            wall, checks, largest, tree = run_verify(root, args.workers)
            ratios.append(wall / floor)
            check_ratios.append(checks / floor)
            walls.append(wall)
            largest_peaks.append(largest)
            tree_peaks.append(tree)
            print(
                f"repeat {repeat}: floor {floor:.2f} s ({len(files):,} files, "
                f"{total / 2**20:,.0f} MiB, {total / 2**20 / floor:,.0f} MiB/s); verify "
                f"{wall:.2f} s on {args.workers} workers, its checks {checks:.1f} s "
                f"({outputs / checks:,.0f} outputs/s): {wall / floor:.1f}x, checks "
                f"{checks / floor:.1f}x the floor; peak RSS largest process "
                f"{largest / 2**20:,.0f} MiB, process tree {tree / 2**20:,.0f} MiB"
            )
        one_wall, one_checks, one_largest, one_tree = run_verify(root, 1)
        print(
            f"one worker: verify {one_wall:.2f} s, its checks {one_checks:.1f} s, peak RSS "
            f"{one_largest / 2**20:,.0f} MiB (tree {one_tree / 2**20:,.0f} MiB)"
        )
        for _pair in range(2):
            floor_cpu, checks_cpu = cpu_in_one_process(root, files)
            print(
                f"CPU in one process: reading every file {floor_cpu:.2f} s, verify's checks "
                f"{checks_cpu:.2f} s ({checks_cpu / outputs * 1e6:.0f} µs per output, "
                f"{checks_cpu / floor_cpu:.1f}x the read)"
            )
        mapped = mapped_whole_rss(root / layout.packed_images(PARTITION))
        print(
            f"the rows hashed through a whole-file memory map: peak RSS {mapped / 2**20:,.0f} MiB"
        )
        print(f"load average at end: {os.getloadavg()[0]:.2f}")
        print(
            f"verify / floor: median {statistics.median(ratios):.1f}x (range "
            f"{min(ratios):.1f}-{max(ratios):.1f}x over {args.repeats} pairs), checks alone "
            f"{statistics.median(check_ratios):.1f}x; one worker / {args.workers} workers: "
            f"{one_wall / statistics.median(walls):.2f}x"
        )
        print(
            f"peak RSS: largest process {max(largest_peaks) / 2**20:,.0f} MiB, process tree "
            f"{max(tree_peaks) / 2**20:,.0f} MiB, against a packed array of "
            f"{packed_bytes / 2**20:,.0f} MiB"
        )


if __name__ == "__main__":
    main()
