"""Benchmark: reading a partition's metadata and checking it, against their floors. Three
sections (`--section`, default `cli`):

* `cli`: the whole CLI materialization of raw_index + labels, checks included, against a bare
  `json.load` of the same train JSON in a fresh process, on full-scale synthetic ReXGradient
  metadata (`radharmony synth --rexgradient-metadata-only --full-scale`): the wall time of
  `dagster asset materialize -m radharmony_pipeline.definitions --select raw_index,labels
  --partition rexgradient.train` with a fresh DAGSTER_HOME, start-up included (the step runs
  the partition's four checks too), and the ratio (target <= 5x) in wall and in CPU time (user +
  system of the whole process tree), with the load average. `--root` is a data root holding
  rexgradient/.
* `index` (formerly bench_index.py): `dg.materialize` of raw_index + labels alone, in a fresh
  child process, against the bare json.load: wall and peak RSS. Targets: within 2x, peak RSS
  < 1.5 GiB. The ephemeral instance (~0.5 s of Dagster start-up) and imports are outside the
  timer. `--root` is a rexgradient root.
* `data` (formerly bench_check_data.py): how many of train's 238,968 named images exist, in
  its real nesting. Writes the metadata and an empty file at every path it names, then times
  on the same tree: a stat per name (the baseline), `existing_names` (check-data's and
  raw_index's), `os.walk` + a stat of each against `tree_states` (the observation job's), the
  floor (a bare listdir of each folder holding a named image), then `check_partition` once.
  With `--cold` (as root) the page cache is dropped before every timed run. `--root` reuses a
  tree written by an earlier run.

    .venv/bin/python benchmarks/bench_checks.py [--root DATA_ROOT]
    .venv/bin/python benchmarks/bench_checks.py --section index [--root REXGRADIENT_ROOT]
    .venv/bin/python benchmarks/bench_checks.py --section data [--root DIR] [--repeats 3] [--cold]
    .venv/bin/python benchmarks/bench_checks.py --smoke   # every section, 40 images' metadata
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import queue as queues
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import (
    add_smoke,
    bare_json_load,
    drop_page_cache,
    peak_rss_mib,
    timed,
    write_rexgradient_metadata,
)

from radharmony_pipeline.processing.storage.source_store import existing_names, tree_states
from radharmony_pipeline.sources import SourceLocation, open_source
from radharmony_pipeline.sources.preflight import check_partition

BIN = Path(sys.executable).parent

PARTITION = "rexgradient.train"

TRAIN_JSON = Path("rexgradient/download/metadata/train_metadata_view_position.json")


# --- cli: the whole command ------------------------------------------------------------------


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def cli_materialize(
    data_root: Path, scratch: Path
) -> tuple[float, float, subprocess.CompletedProcess]:
    """Wall and CPU seconds of the whole command (every process it starts), and its output."""
    home = scratch / "dagster_home"
    home.mkdir()
    environ = {k: v for k, v in os.environ.items() if not k.startswith("RADHARMONY_")}
    environ.update(
        DAGSTER_HOME=str(home),
        RADHARMONY_DATA_ROOT=str(data_root),
        RADHARMONY_OUTPUT_ROOT=str(scratch / "output"),
        # Metadata-only data has no images: every one is missing, which raw_index refuses at
        # the default limit. The folder listing still runs, as it does on a real download.
        RADHARMONY_UNREADABLE_LIMIT="1",
    )
    command = [
        str(BIN / "dagster"),
        "asset",
        "materialize",
        "-m",
        "radharmony_pipeline.definitions",
        "--select",
        "raw_index,labels",
        "--partition",
        PARTITION,
    ]
    cpu = children_cpu()
    start = time.perf_counter()
    completed = subprocess.run(command, env=environ, capture_output=True, text=True)
    return time.perf_counter() - start, children_cpu() - cpu, completed


def cli_section(root: Path | None, smoke: bool) -> int:
    """The whole CLI materialization of raw_index + labels, checks included, vs json.load."""
    with tempfile.TemporaryDirectory() as scratch_dir:
        scratch = Path(scratch_dir)
        data_root = None if smoke else root
        if smoke:  # 40 images' metadata, written here rather than by the CLI
            data_root = scratch / "data"
            write_rexgradient_metadata(data_root, smoke=True)
        elif data_root is None:
            data_root = scratch / "data"
            subprocess.run(
                [
                    str(BIN / "radharmony"),
                    "synth",
                    "--rexgradient-metadata-only",
                    "--full-scale",
                    "--out",
                    str(data_root),
                ],
                check=True,
            )
        (data_root / "rexgradient" / "deid_png").mkdir(exist_ok=True)
        train_json = data_root / TRAIN_JSON
        size_mib = train_json.stat().st_size / 2**20
        loaded = bare_json_load(train_json)
        bare, bare_cpu = loaded["seconds"], loaded["cpu"]
        cli, cli_cpu, completed = cli_materialize(data_root, scratch)
    log = completed.stdout + completed.stderr
    evaluations = log.count("ASSET_CHECK_EVALUATION")
    load = os.getloadavg()
    print(f"train JSON: {size_mib:.0f} MiB")
    print(f"bare json.load:                       {bare:6.2f} s   CPU {bare_cpu:6.2f} s")
    print(
        f"CLI materialize raw_index,labels:     {cli:6.2f} s   CPU {cli_cpu:6.2f} s   "
        f"exit code {completed.returncode}"
    )
    print(f"check evaluations in the run's log:   {evaluations}")
    print(f"ratio CLI / json.load, wall time:     {cli / bare:6.2f}x  (target <= 5x)")
    print(f"ratio CLI / json.load, CPU time:      {cli_cpu / bare_cpu:6.2f}x")
    print(f"load average (1, 5, 15 min):          {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    if completed.returncode or os.environ.get("BENCH_LOG"):
        print(log[-6000:], file=sys.stderr)
    return completed.returncode


# --- index: the two assets in a child process ------------------------------------------------


def materialize_index_and_labels(root: str, queue: multiprocessing.Queue) -> None:
    import warnings

    warnings.filterwarnings("ignore")
    # Metadata-only data has no images: every one is missing, which raw_index refuses at the
    # default limit (as bench_checks.py sets it). The folder listing still runs.
    os.environ["RADHARMONY_UNREADABLE_LIMIT"] = "1"
    import dagster as dg

    from radharmony_pipeline.defs.assets.index_and_labels import raw_index_and_labels
    from radharmony_pipeline.defs.resources import (
        DatasetsResource,
        SourceLocationConfig,
        pipeline_resources,
    )

    baseline_rss = peak_rss_mib()
    with tempfile.TemporaryDirectory() as output:
        resources = {
            **pipeline_resources(output_root=output),
            "datasets": DatasetsResource(rexgradient=SourceLocationConfig(root=root)),
        }
        instance = dg.DagsterInstance.ephemeral()
        start = time.perf_counter()
        result = dg.materialize(
            [raw_index_and_labels],
            partition_key="rexgradient.train",
            resources=resources,
            instance=instance,
        )
        elapsed = time.perf_counter() - start
        rows = {
            e.materialization.asset_key.to_user_string(): int(
                e.materialization.metadata["dagster/row_count"].value
            )
            for e in result.get_asset_materialization_events()
        }
    queue.put(
        {
            "seconds": elapsed,
            "peak_rss_mib": peak_rss_mib(),
            "import_rss_mib": baseline_rss,
            "rows": rows,
            "success": result.success,
        }
    )


def in_child(target, *args) -> dict:
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    process = context.Process(target=target, args=(*args, queue))
    process.start()
    while True:  # a child that died without an answer must not hang the run
        try:
            outcome = queue.get(timeout=1)
            break
        except queues.Empty:
            if not process.is_alive():
                message = f"{target.__name__} failed (exit code {process.exitcode})"
                raise SystemExit(message) from None
    process.join()
    return outcome


def index_section(root: Path | None, smoke: bool) -> int:
    """raw_index + labels against a bare json.load, each in a fresh process."""
    with tempfile.TemporaryDirectory() as scratch:
        root = None if smoke else root
        if root is None:
            start = time.perf_counter()
            root = write_rexgradient_metadata(Path(scratch) / "data", smoke)
            print(f"generated full-scale metadata in {time.perf_counter() - start:.1f} s")
        (root / "deid_png").mkdir(exist_ok=True)
        train_json = root / "download" / "metadata" / "train_metadata_view_position.json"
        size_mib = train_json.stat().st_size / 2**20
        bare = bare_json_load(train_json)
        assets = in_child(materialize_index_and_labels, str(root))
    ratio = assets["seconds"] / bare["seconds"]
    print(f"train JSON: {size_mib:.0f} MiB, {bare['studies']} studies")
    print(
        f"bare json.load:          {bare['seconds']:6.2f} s   peak RSS "
        f"{bare['peak_rss_mib']:6.0f} MiB"
    )
    print(
        f"raw_index + labels:      {assets['seconds']:6.2f} s   peak RSS "
        f"{assets['peak_rss_mib']:6.0f} MiB (after imports {assets['import_rss_mib']:.0f} MiB)"
    )
    print(f"rows: {assets['rows']}  success: {assets['success']}")
    print(f"ratio assets / json.load: {ratio:.2f}x  (target <= 2.0x)")
    print(f"peak RSS under 1.5 GiB:   {assets['peak_rss_mib'] < 1536}")
    return 0 if assets["success"] else 1


# --- data: which named images exist ---------------------------------------------------------


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


def _median(function, repeats: int, cold: bool) -> tuple[float, object]:
    """Median wall seconds of `repeats` calls and the last call's result."""
    timing = timed(function, repeats, cold)
    return timing.seconds, timing.result


def data_section(base_root: Path | None, repeats: int, cold: bool, smoke: bool) -> None:
    """Which of train's named images exist: existing_names, tree_states and their floors."""
    with tempfile.TemporaryDirectory(prefix="bench-check-data-") as scratch:
        base = base_root or Path(scratch)
        root = base / "rexgradient"
        if not (root / "deid_png").is_dir():
            start = time.perf_counter()
            root = write_rexgradient_metadata(base, smoke)
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

        stat_s, stat_found = _median(lambda: per_name_stat(folder, names), repeats, cold)
        listed_s, listed = _median(lambda: existing_names(folder, names), repeats, cold)
        walk_s, walked = _median(lambda: walk_and_stat(folder), repeats, cold)
        tree_s, tree = _median(lambda: tree_states(folder, (".png",)), repeats, cold)
        floor_s, _ = _median(lambda: bare_listings(folder, parents), repeats, cold)
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


# --- entry point ----------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--section", choices=("cli", "index", "data"), default="cli")
    parser.add_argument("--root", type=Path, help="reuse metadata written before (see above)")
    parser.add_argument("--repeats", type=int, default=3, help="data: timed runs (median)")
    parser.add_argument("--cold", action="store_true", help="data: drop the page cache (root)")
    add_smoke(parser)
    args = parser.parse_args()
    if args.smoke:
        outcomes = [cli_section(None, True), index_section(None, True)]
        data_section(None, 1, False, True)
        return max(outcomes)
    if args.section == "index":
        return index_section(args.root, False)
    if args.section == "data":
        data_section(args.root, args.repeats, args.cold, False)
        return 0
    return cli_section(args.root, False)


if __name__ == "__main__":
    sys.exit(main())
