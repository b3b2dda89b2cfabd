"""Benchmark: reading a partition's metadata and checking it (`cli`, `index`, `data`), and
verifying its outputs (`verify`), each against the floor of reading its files once."""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from commands import under_time
from common import Table, add_options, drop_page_cache, timed, write_table
from synthetic_inputs import write_rexgradient_metadata
from synthetic_outputs import write_images_partition

from radharmony_pipeline.operations.verify import verify_outputs
from radharmony_pipeline.processing.storage import output_layout as layout
from radharmony_pipeline.processing.storage.source_store import existing_names, tree_states
from radharmony_pipeline.sources import SourceLocation, open_source
from radharmony_pipeline.sources.preflight import check_partition

BIN = Path(sys.executable).parent
PARTITION = "rexgradient.train"
DEFINITIONS = "radharmony_pipeline.definitions"
TRAIN_JSON = Path("download/metadata/train_metadata_view_position.json")
# Metadata-only data has no images: every one is missing, which raw_index refuses at the
# default limit. The folder listing still runs, as it does on a real download.
NO_IMAGES = {"RADHARMONY_UNREADABLE_LIMIT": "1"}
READ_BLOCK = 1 << 20
MIB = 2**20

# The floor of reading a metadata JSON, and the two assets, each in a fresh process that
# prints its figures as JSON: (wall, CPU, peak RSS MiB, entries) and the assets' outcome.
BARE_LOAD = """import json, resource, sys, time
start, cpu = time.perf_counter(), time.process_time()
with open(sys.argv[1], 'rb') as handle:
    data = json.load(handle)
wall, cpu = time.perf_counter() - start, time.process_time() - cpu
print(json.dumps([wall, cpu, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  len(data)]))"""
ASSETS = """import json, resource, sys, tempfile, time, warnings
warnings.filterwarnings("ignore")
import dagster as dg
from radharmony_pipeline.defs.assets.index_and_labels import raw_index_and_labels
from radharmony_pipeline.defs.resources import (DatasetsResource, SourceLocationConfig,
    pipeline_resources)
imported = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
with tempfile.TemporaryDirectory() as output:
    resources = {**pipeline_resources(output_root=output),
                 "datasets": DatasetsResource(rexgradient=SourceLocationConfig(root=sys.argv[1]))}
    instance = dg.DagsterInstance.ephemeral()
    start = time.perf_counter()
    result = dg.materialize([raw_index_and_labels], partition_key=sys.argv[2],
                            resources=resources, instance=instance)
    wall = time.perf_counter() - start
rows = {e.materialization.asset_key.to_user_string():
        int(e.materialization.metadata["dagster/row_count"].value)
        for e in result.get_asset_materialization_events()}
print(json.dumps([wall, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, imported,
                  rows, result.success]))"""


def in_python(code: str, *arguments: object, env: dict | None = None) -> list:
    """What `code` prints as JSON on its last line, run in a fresh interpreter."""
    done = subprocess.run(
        [sys.executable, "-c", code, *map(str, arguments)], env=env, capture_output=True, text=True
    )
    if done.returncode:
        raise SystemExit(f"a measuring process failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.splitlines()[-1])


def metadata(base: Path, smoke: bool) -> Path:
    """base/rexgradient with its metadata, written there first when missing (full-scale, or
    40 images' for a smoke run); with the image folder the reader wants."""
    rexgradient = base / "rexgradient"
    if not (rexgradient / TRAIN_JSON).exists():
        rexgradient = write_rexgradient_metadata(base, smoke)
    (rexgradient / "deid_png").mkdir(exist_ok=True)
    return rexgradient


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def cli_section(args: argparse.Namespace, scratch: Path) -> Table:
    """`dagster asset materialize --select raw_index,labels` of ReXGradient train (start-up
    and the partition's checks included, a fresh DAGSTER_HOME) against a bare json.load of
    the same train JSON in a fresh process, on full-scale synthetic metadata: wall and CPU
    of the whole process tree. Target: <= 5x."""
    rexgradient = metadata(args.root or scratch, args.smoke)
    wall, cpu, _, _ = in_python(BARE_LOAD, rexgradient / TRAIN_JSON)
    environ = {k: v for k, v in os.environ.items() if not k.startswith("RADHARMONY_")}
    environ.update(
        DAGSTER_HOME=str(scratch / "home"),
        RADHARMONY_DATA_ROOT=str(rexgradient.parent),
        RADHARMONY_OUTPUT_ROOT=str(scratch / "output"),
        **NO_IMAGES,
    )
    (scratch / "home").mkdir()
    select = ["--select", "raw_index,labels", "--partition", PARTITION]
    command = [str(BIN / "dagster"), "asset", "materialize", "-m", DEFINITIONS, *select]
    start, cpu_start = time.perf_counter(), children_cpu()
    done = subprocess.run(command, env=environ, capture_output=True, text=True)
    cli, cli_cpu = time.perf_counter() - start, children_cpu() - cpu_start
    log = done.stdout + done.stderr
    if done.returncode or os.environ.get("BENCH_LOG"):
        print(log[-6000:], file=sys.stderr)
    if done.returncode:
        raise SystemExit(f"the CLI materialization exited {done.returncode}")
    rows = [
        [
            "`dagster asset materialize --select raw_index,labels` / bare json.load, wall",
            f"{cli:.2f} vs {wall:.2f} s {cli / wall:.2f}×",
            "≤ 5×",
        ],
        ["the same, CPU", f"{cli_cpu / cpu:.1f}× ({cli_cpu:.2f} vs {cpu:.2f} s)", ""],
    ]
    figures = {
        "cli": [cli, cli_cpu],
        "json_load": [wall, cpu],
        "MiB": _mib(rexgradient),
        "check_evaluations": log.count("ASSET_CHECK_EVALUATION"),
    }
    title = "The whole CLI materialization, checks included"
    return Table("checks", title, ["figure", "value", "target"], rows, figures)


def index_section(args: argparse.Namespace, scratch: Path) -> Table:
    """`dg.materialize` of raw_index + labels alone in a fresh process (its imports and the
    ephemeral instance outside the timer) against the bare json.load: wall and peak RSS.
    Targets: <= 2x, < 1.5 GiB."""
    rexgradient = metadata(args.root or scratch, args.smoke)
    load, _, load_rss, studies = in_python(BARE_LOAD, rexgradient / TRAIN_JSON)
    env = {**os.environ, **NO_IMAGES}
    wall, rss, imported, rows, success = in_python(ASSETS, rexgradient, PARTITION, env=env)
    if not success:
        raise SystemExit("raw_index + labels failed")
    print(f"{studies:,} studies; rows {rows}; assets peak RSS after imports {imported:.0f} MiB")
    table = [
        [
            f"{PARTITION}, {_mib(rexgradient):.0f} MiB JSON: assets / json.load",
            f"{wall:.2f} s vs {load:.2f} s: {wall / load:.2f}×",
            "≤ 2×",
        ],
        ["peak RSS", f"{rss:,.0f} MiB (json.load {load_rss:,.0f} MiB)", "< 1.5 GiB"],
    ]
    figures = {"assets": [wall, rss, imported], "json_load": [load, load_rss], "rows": rows}
    title = "`raw_index` + `labels` against a bare json.load"
    return Table(
        "index", title, ["figure", "value", "target"], table, figures, "", "--section index"
    )


def _mib(rexgradient: Path) -> float:
    return (rexgradient / TRAIN_JSON).stat().st_size / MIB


def data_section(args: argparse.Namespace, scratch: Path) -> Table:
    """Which of train's 238,968 named images exist, in its real nesting (an empty file at
    every named path): a stat per name (the baseline), `existing_names`, `os.walk` + a stat
    of each, `tree_states`, and the floor, a bare listdir of each folder holding a named
    image; then `check_partition` once. `--cold` (as root) drops the page cache first."""
    root = metadata(args.root or scratch, args.smoke)
    source = open_source("rexgradient", SourceLocation(root=root), {})
    names = source.read_split("train").index["image_path"].dropna().tolist()
    folder = root / "deid_png"
    if not any(folder.iterdir()):  # an empty file at every named path, the first time
        for name in names:
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            (folder / name).touch()
    parents = sorted({name.rpartition("/")[0] for name in names})
    looks = {
        "per-name stat (baseline)": lambda: sum(os.path.exists(folder / n) for n in names),
        "existing_names": lambda: len(existing_names(folder, names)),
        "os.walk + stat of each": lambda: sum(
            len([os.stat(os.path.join(p, f)) for f in files]) for p, _, files in os.walk(folder)
        ),
        "tree_states (the observation job's)": lambda: len(tree_states(folder, (".png",))),
        "floor: bare listdir of each folder": lambda: sum(
            len(os.listdir(folder / parent)) for parent in parents
        ),
    }
    seconds, found = {}, {}
    for name, look in looks.items():
        timing = timed(look, args.repeats, args.cold)
        seconds[name], found[name] = timing.seconds, timing.result
        print(f"{name:<36} {timing.seconds:6.2f} s ({timing.result} found)", flush=True)
    if set(found.values()) != {len(names)}:
        raise SystemExit(f"the looks disagree with the {len(names)} names: {found}")
    if args.cold:
        drop_page_cache()
    start = time.perf_counter()
    report = check_partition(source, "train", configured=True, missing_limit=0.5)
    print(f"check_partition {time.perf_counter() - start:.2f} s: {report.summary()}")
    cache = "cold cache" if args.cold else "warm cache"
    return Table(
        "check_data",
        "Which named images exist" + (", cold" if args.cold else ""),
        [f"method ({len(names):,} names, {cache})", "seconds"],
        [[name, f"{value:.1f}"] for name, value in seconds.items()],
        {"names": len(names), "folders": len(parents), "seconds": seconds},
        "",
        "--section data",
    )


# --- verify ----------------------------------------------------------------------------------


def output_files(root: Path) -> list[Path]:
    """Every file verify reads: the table, the PNGs it names, the packed array."""
    import pandas as pd

    table_path = layout.table_file(root, "images", PARTITION)
    table = pd.read_parquet(table_path, columns=["image_path", "mask_path"])
    named = [*table["image_path"].dropna(), *table["mask_path"].dropna()]
    return [table_path, *(root / n for n in named), root / layout.packed_images(PARTITION)]


def read_once(files: list[Path]) -> tuple[float, int]:
    """(seconds, bytes) to read every file once in blocks, discarding them."""
    buffer, total, started = bytearray(READ_BLOCK), 0, time.perf_counter()
    for path in files:
        with open(path, "rb", buffering=0) as handle:
            while got := handle.readinto(buffer):
                total += got
    return time.perf_counter() - started, total


def run_verify(root: Path, workers: int) -> tuple[float, float, int, int]:
    """(wall, seconds of the checks as its last progress line gives them, peak RSS of the
    largest process, of the process tree) of `radharmony verify`."""
    environment = {**os.environ, "RADHARMONY_WORKERS": str(workers)}
    environment.pop("DAGSTER_HOME", None)
    environment.pop("RADHARMONY_DASK_SCHEDULER", None)
    command = [
        sys.executable,
        "-m",
        "radharmony_pipeline.cli",
        "verify",
        "--partition",
        PARTITION,
        "--output-root",
        str(root),
    ]
    wall, largest, tree, err = under_time(command, environment)
    finished = re.findall(r"outputs checked in ([0-9.]+) s", err)
    if not finished:
        raise SystemExit(f"verify printed no final progress line:\n{err}")
    # The line gives tenths of a second: a tiny (--smoke) partition's checks print 0.0.
    return wall, max(float(finished[-1]), 0.05), largest, tree


# The rows hashed through one memory map of the whole file, as verify read them before
# packed_rows: every page touched stays in the process's resident set.
MAPPED_WHOLE = """import hashlib, sys
import numpy as np
for row in np.load(sys.argv[1], mmap_mode="r"):
    hashlib.sha256(row.tobytes()).hexdigest()"""


def verify_section(args: argparse.Namespace, scratch: Path) -> Table:
    """`radharmony verify` on a partition of `--images` S x S PNGs, a union mask for one in
    ten and the packed array, against reading every file it reads once in one process,
    `--repeats` times back to back (warm cache; a pair shares the host's drift): wall of the
    command and of its checks alone (its last progress line), peak RSS of its largest
    process (/usr/bin/time) and of its process tree; then one worker, the CPU of the checks
    against reading once in this process, and the peak RSS of hashing the rows through one
    whole-file memory map (how verify read them before)."""
    root = args.root or scratch
    started = time.perf_counter()
    write_images_partition(root, PARTITION, args.images, args.size)
    files, packed = output_files(root), root / layout.packed_images(PARTITION)
    outputs = len(files) - 2 + args.images  # what verify's progress counts: PNGs and rows
    print(
        f"{args.images:,} images at {args.size}² in {root} ({time.perf_counter() - started:.1f} s)"
    )
    read_once(files)  # warm the page cache for both measurements
    runs = []
    for repeat in range(1, args.repeats + 1):
        floor, total = read_once(files)
        runs.append((floor, *run_verify(root, args.workers)))
        wall, checks, largest, tree = runs[-1][1:]
        print(
            f"repeat {repeat}: floor {floor:.2f} s ({len(files):,} files, {total / MIB:,.0f} "
            f"MiB); verify {wall:.2f} s, its checks {checks:.1f} s ({outputs / checks:,.0f} "
            f"outputs/s): {wall / floor:.1f}x, checks {checks / floor:.1f}x the floor; peak "
            f"RSS {largest / MIB:,.0f} MiB, process tree {tree / MIB:,.0f} MiB",
            flush=True,
        )
    one = runs[-1][1:] if args.workers == 1 else run_verify(root, 1)
    cpu = []
    for _pair in range(2):
        before = time.process_time()
        read_once(files)
        middle = time.process_time()
        if mismatches := verify_outputs(root, [PARTITION], None):
            raise SystemExit(f"the partition does not verify: {mismatches[0]}")
        cpu.append((middle - before, time.process_time() - middle))
    mapped = under_time([sys.executable, "-c", MAPPED_WHOLE, str(packed)])[1]
    ratios = [wall / floor for floor, wall, *_ in runs]
    checks = [check / floor for floor, _, check, *_ in runs]
    per_output = [checks_cpu / outputs * 1e6 for _, checks_cpu in cpu]
    largest, tree = [run[3] / MIB for run in runs], [run[4] / MIB for run in runs]
    rows = [
        [
            "peak RSS of the largest process",
            f"{_span(largest)} MiB on {args.workers} workers, {one[2] / MIB:,.0f} MiB on 1",
        ],
        ["peak RSS of the process tree", f"{_span(tree)} MiB"],
        ["the same rows through one whole-file memory map", f"{mapped / MIB:,.0f} MiB"],
        [
            "CPU per output in one process",
            f"{_span(per_output)} µs ("
            f"{_span([c / f for f, c in cpu], '.1f')}× the CPU of reading the files once)",
        ],
        ["floor: every file read once, warm", f"{_span([r[0] for r in runs], '.2f')} s"],
        [
            f"verify on {args.workers} workers / floor",
            f"{_span([r[1] for r in runs], '.1f')} s, median {statistics.median(ratios):.1f}×",
        ],
        [
            "its checks alone / floor",
            f"{_span([r[2] for r in runs], '.1f')} s, median {statistics.median(checks):.1f}×",
        ],
    ]
    figures = {
        "images": args.images,
        "outputs": outputs,
        "runs": runs,
        "one_worker": one,
        "cpu_read_and_checks": cpu,
        "mapped_whole_rss": mapped,
    }
    title = "`radharmony verify` at full size"
    return Table("verify", title, ["figure", "value"], rows, figures, "", "--section verify")


def _span(values: list[float], form: str = ",.0f") -> str:
    low, high = f"{min(values):{form}}", f"{max(values):{form}}"
    return low if low == high else f"{low}–{high}"


SECTIONS = {
    "cli": cli_section,
    "index": index_section,
    "data": data_section,
    "verify": verify_section,
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--section", choices=SECTIONS, help="default cli; --smoke: data, verify")
    parser.add_argument("--root", type=Path, help="reuse data or outputs written before")
    parser.add_argument("--repeats", type=int, default=3, help="data, verify: timed runs")
    parser.add_argument("--cold", action="store_true", help="data: drop the page cache (root)")
    parser.add_argument("--images", type=int, default=20_000, help="verify: partition size")
    parser.add_argument("--size", type=int, default=224, help="verify: image side")
    parser.add_argument("--workers", type=int, default=2, help="verify: RADHARMONY_WORKERS")
    add_options(parser)
    args = parser.parse_args()
    # A smoke run skips the sections that start Dagster (seconds each) unless named.
    sections = [args.section] if args.section else ["data", "verify"] if args.smoke else ["cli"]
    if args.smoke:
        args.root, args.repeats, args.cold, args.images, args.workers = None, 1, False, 60, 1
    for name in sections:
        with tempfile.TemporaryDirectory(prefix=f"bench-{name}-") as scratch:
            write_table(args, SECTIONS[name](args, Path(scratch)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
