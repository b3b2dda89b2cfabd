"""Rehearsal at the real size: the whole corpus built, joined, exported and verified as a user
does, through the CLI on a persistent instance, at N/4, N/2 and N (corpus/ says how)."""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from unittest import mock

from commands import (
    LAUNCHED_PARTITION,
    launch_and_kill_halfway,
    launch_command,
    launch_summary,
    stat_each_command,
)
from common import REPOSITORY as REPO
from common import Table, add_options, drop_page_cache, write_table
from corpus.browser import ui_pages
from corpus.generation import TRAIN_SOURCES, write_corpus
from corpus.report import (
    by_size,
    cluster_beside_local,
    cluster_totals,
    figures_table,
    kept_sizes,
    log_file,
    marginal,
    marginal_reads,
    project_search,
    report_ui,
    results_file,
    size_folder,
    stored_results,
    table,
)
from corpus.sampling import Step, _row, counted, run_step
from synthetic_inputs import change_sources

from radharmony_pipeline.processing.storage import output_layout as layout
from radharmony_pipeline.settings import image_size
from radharmony_pipeline.sources import SOURCE_TYPES

BIN = Path(sys.executable).parent
CHANGED_SHARE = 0.01
# The cluster path's figures, instances and buckets: under `--work`/cluster, beside the local
# ones, its data those of the local path's sizes.
CLUSTER = "cluster"
# The steps the cluster table shows (every step's ratio is in its figures): the largest
# partition, the joins, its export and verify.
CLUSTER_HEADLINES = (
    "all_stages rexgradient.train",
    "manifest",
    "exports rexgradient.train",
    "verify",
)
# Each path's instance: SQLite as the demo's, PostgreSQL as docs/cluster.md deploys it.
INSTANCES = {
    False: REPO / "dagster_home" / "dagster.yaml",
    True: REPO / "deploy" / "dagster.postgres.yaml",
}


def partitions() -> list[str]:
    return [f"{key}.{split}" for key, source in SOURCE_TYPES.items() for split in source.splits]


# The disk's own cost of finding train's images, beside the steps that do (check-data and
# raw_index_and_labels): a cold stat of each, in sequence, by coreutils, no Python.
STAT_FLOOR = "disk: stat each train image"


# What `--step` names the UI pages' timing and ReXGradient train's re-runs by.
UI_STEP = "UI"


RERUNS = "re-run train"
# What `--step` names the cluster path's build of train that loses a Dask worker halfway by.
WORKER_LOSS = "worker lost"
# The step the results table shows when `--step` names none (every step is in its figures).
HEADLINE = "all_stages rexgradient.train"


def commands(data: Path) -> list[tuple[str, list[str]]]:
    radharmony = str(BIN / "radharmony")
    stat_each = stat_each_command(data / TRAIN_SOURCES)
    steps = [(STAT_FLOOR, stat_each), ("check-data", [radharmony, "check-data"])]
    steps.append(("observe", launch_command("observe_source_files", None)))
    steps += [(f"all_stages {p}", launch_command("all_stages", p)) for p in partitions()]
    steps.append(("manifest", launch_command("manifest", None)))
    steps += [(f"exports {p}", launch_command("exports", p)) for p in partitions()]
    steps.append(("card", launch_command("dataset_card", None)))
    steps.append(("verify", [radharmony, "verify"]))
    return steps


def rehearse(
    work: Path,
    fraction: float,
    largest: float,
    side: int,
    seed: int,
    workers: int,
    only: tuple[str, ...] = (),
    first_pass: bool = True,
    cluster: bool = False,
) -> None:
    """One size written (once) and every step run on it, from an empty output root and
    instance, the re-runs too at the `largest` size of the run; each step's figures are
    added to its runs in results_file, whose runs of the steps measured again are dropped on
    the `first_pass` of a command. With `only`, just the steps whose names begin with one of
    them (UI_STEP for the pages, RERUNS for the re-runs); the others keep their runs. On the
    `cluster` path, the same data and steps but the disk's floor, the UI and the re-runs,
    with their figures under `work`/cluster."""

    def wanted(name: str) -> bool:
        return not only or name.startswith(only)

    size_dir = size_folder(work, fraction)
    data = size_dir / "data"
    figures_root = work / CLUSTER if cluster else work
    runs_dir = size_folder(figures_root, fraction)  # the output root, instance and figures
    output, home = runs_dir / "output", runs_dir / "dagster_home"
    clear_outputs(runs_dir)  # every pass builds from nothing, as a user's first launches do
    home.mkdir(parents=True)
    shutil.copyfile(INSTANCES[cluster], home / "dagster.yaml")
    counts_file = size_dir / "corpus_counts.json"
    if not counts_file.exists():
        shutil.rmtree(data, ignore_errors=True)  # a corpus cut short is written again
        start = time.perf_counter()
        counts = write_corpus(data, work, fraction, largest, side, seed, workers)
        print(f"  corpus written in {time.perf_counter() - start:.0f} s: {counts}", flush=True)
        counts_file.write_text(json.dumps(counts))
    counts = json.loads(counts_file.read_text())
    env = {
        **os.environ,
        "RADHARMONY_DATA_ROOT": str(data),
        "RADHARMONY_OUTPUT_ROOT": str(output),
        "DAGSTER_HOME": str(home),
        "RADHARMONY_WORKERS": str(workers),
    }
    figures: dict = {"counts": counts, "runs": {}, "search": {}, "ui": {}}
    if results_file(figures_root, fraction).exists():
        figures = {"runs": {}, **json.loads(results_file(figures_root, fraction).read_text())}
        figures["counts"] = counts
    if first_pass:
        figures["runs"] = {name: runs for name, runs in figures["runs"].items() if not wanted(name)}
    log = log_file(figures_root, fraction)

    def keep(step: Step | None = None) -> None:
        """Every figure is kept as soon as it is measured: a run cut short loses none."""
        if step is not None:
            figures["runs"].setdefault(step.name, []).append(asdict(step))
        results_file(figures_root, fraction).write_text(json.dumps(figures))

    if cluster:
        check_room_for_the_bucket(work, fraction, runs_dir)
    with on_the_cluster(runs_dir) if cluster else contextlib.nullcontext() as services:
        if services is not None:
            env.update(services.environment(home))
            output = services.objects  # the bytes a step adds to the bucket, on disk
        for name, command in commands(data):
            if not wanted(name) or (cluster and name == STAT_FLOOR):
                continue
            if os.geteuid() == 0:
                drop_page_cache()
            step = run_step(name, command, env, output, log, services)
            if Path(command[0]).name == "dg" and step.ok:
                step.stages = launch_summary(env)["steps"]
            print(f"  {_row(step)}", flush=True)
            keep(step)
            if name == "manifest":
                figures["search"] = near_duplicate_search(env, step)
        if services is not None and fraction == largest and wanted(WORKER_LOSS):
            steps, figures["worker_loss"] = worker_loss(
                data, env, home, services, log, output_of(work, fraction)
            )
            for step in steps:
                keep(step)
        if services is not None:
            figures["leftover_temporaries"] = services.leftover_temporaries()
            print(f"  temporary keys left: {figures['leftover_temporaries']}", flush=True)
            keep()
    print(f"  near_duplicates: {json.dumps(figures['search'])}", flush=True)
    if cluster:
        return
    if wanted(UI_STEP):
        figures["ui"] = ui_pages(env, log)
    keep()
    if fraction == largest and wanted(RERUNS):
        for step in rerun_train(data, output, env, size_dir, log):
            keep(step)


def check_room_for_the_bucket(work: Path, fraction: float, runs_dir: Path) -> None:
    """Stop before a cluster pass that would fill the disk an hour in: the bucket takes what
    the local pass of the size added, and while ReXGradient train publishes its packed array
    the disk holds that array once more (the local scratch copy; the server assembles the
    upload in place of its parts)."""
    kept = results_file(work, fraction)
    if not kept.exists():
        print("  free disk not checked: no local pass of this size is kept", flush=True)
        return
    figures = json.loads(kept.read_text())
    cluster_steps = {name for name, _ in commands(Path())} - {STAT_FLOOR}
    bucket = sum(
        max(run["added_bytes"] for run in runs)
        for name, runs in figures["runs"].items()
        if name in cluster_steps
    )
    # Every split's images: a bound on train's array, which is the largest.
    array = figures["counts"]["rexgradient"] * image_size(os.environ) ** 2
    needed = bucket + array
    runs_dir.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(runs_dir).free
    if free < needed:
        sys.exit(
            f"the cluster pass at {fraction:g} needs about {needed / 1e9:.0f} GB free "
            f"on {runs_dir} (the bucket {bucket / 1e9:.0f} GB as the local pass added, "
            f"ReXGradient's array {array / 1e9:.0f} GB once more); {free / 1e9:.0f} GB are: "
            "delete the local pass's output root (its figures are kept) or use a larger disk"
        )
    print(f"  free disk {free / 1e9:.0f} GB, about {needed / 1e9:.0f} GB needed", flush=True)


def on_the_cluster(runs_dir: Path) -> contextlib.AbstractContextManager:
    """The cluster path's services for a size (imported here: they add tests/ to the path)."""
    from corpus.cluster import cluster_path

    return cluster_path(runs_dir)


def clear_outputs(size_dir: Path) -> None:
    """A size's output root and instance deleted; its data stay."""
    for folder in ("output", "dagster_home", "bucket"):
        shutil.rmtree(size_dir / folder, ignore_errors=True)


def rerun_train(data: Path, output: Path, env: dict, size_dir: Path, log: Path) -> Iterator[Step]:
    """ReXGradient train launched again as issue 30 item 4 budgets it: unchanged, after 1 % of
    its sources changed, and on a fresh output root killed (SIGKILL) once half its PNGs are
    written, then launched again; with what each decoded and rewrote."""
    command = launch_command()
    yield counted(run_step("re-run train, unchanged", command, env, output, log), env)
    sources = [Path(line) for line in (data / TRAIN_SOURCES).read_text().splitlines()]
    changed = change_sources(sources, CHANGED_SHARE, 0)
    yield counted(run_step(f"re-run train, {changed} changed", command, env, output, log), env)
    # The exports are measured by now and a second build of train needs their room: at the
    # full count they hold 12 GB, and with them the disk filled before the kill.
    shutil.rmtree(output / layout.EXPORTS, ignore_errors=True)
    resumed = size_dir / "resumed"
    resumed_env = {**env, "RADHARMONY_OUTPUT_ROOT": str(resumed)}
    killed = launch_and_kill_halfway(resumed_env, resumed, len(sources))
    written = len(list(resumed.glob(layout.resized_png_glob(LAUNCHED_PARTITION))))
    print(f"  first build of train killed after {killed:.1f} s, {written} PNGs written")
    resume = run_step(f"{RERUNS}, resumed after kill -9", command, resumed_env, resumed, log)
    yield counted(resume, resumed_env)
    shutil.rmtree(resumed, ignore_errors=True)


def worker_loss(
    data: Path, env: dict[str, str], home: Path, services, log: Path, local_output: Path
) -> tuple[list[Step], dict]:
    """ReXGradient train built from nothing on the cluster path (a prefix of its own) with
    one of the two Dask workers lost for good once half its PNGs are written, as issue 60
    item 4 asks; launched again if that build fails. Its steps, and what it left: the PNGs,
    and whether its packed array and images table equal the local path's."""
    from corpus.cluster import WORKER_LOSS_PREFIX

    images = len((data / TRAIN_SOURCES).read_text().splitlines())
    env = {**env, **services.environment(home, WORKER_LOSS_PREFIX)}
    command = launch_command("all_stages", LAUNCHED_PARTITION)
    name = f"{WORKER_LOSS}, all_stages {LAUNCHED_PARTITION}"
    with services.worker_lost_after(images // 2) as loss:
        steps = [counted(run_step(name, command, env, services.objects, log, services), env)]
    summary = {"images": images, **loss, "first_launch_ok": steps[0].ok}
    if not steps[0].ok:
        name = f"{WORKER_LOSS}, launched again"
        steps.append(counted(run_step(name, command, env, services.objects, log, services), env))
        summary["next_launch_ok"] = steps[-1].ok
    folder = layout.resized_image_folder(LAUNCHED_PARTITION)
    summary["objects_in_images_folder"] = services.object_count(WORKER_LOSS_PREFIX, folder)
    array = layout.packed_images(LAUNCHED_PARTITION)
    table = layout.table_path("images", LAUNCHED_PARTITION)
    if (local_output / array).exists():
        with (
            open(local_output / array, "rb") as local,
            services.open_object(WORKER_LOSS_PREFIX, array) as remote,
        ):
            hashes = [hashlib.file_digest(handle, "sha256").digest() for handle in (local, remote)]
            summary["same_packed_array"] = hashes[0] == hashes[1]
        with services.open_object(WORKER_LOSS_PREFIX, table) as remote:
            summary["same_images_table"] = same_rows(local_output / table, remote)
    print(f"  {WORKER_LOSS}: {json.dumps(summary)}", flush=True)
    return steps, summary


def same_rows(local: Path, remote) -> bool:
    """Whether two Parquet tables hold the same rows, in any order."""
    import pandas as pd

    tables = [pd.read_parquet(source) for source in (local, remote)]
    ordered = [t.sort_values("image_id", ignore_index=True) for t in tables]
    return ordered[0].equals(ordered[1])


def output_of(work: Path, fraction: float) -> Path:
    """The local path's output root of a size (kept with --keep)."""
    return size_folder(work, fraction) / "output"


def near_duplicate_search(env: dict[str, str], manifest: Step) -> dict:
    """The near_duplicates stage of the `manifest` run just measured: its seconds and the
    search's figures from its latest materialization's metadata."""
    import dagster as dg

    # The instance's dagster.yaml finds its storage by the variables, as the steps saw them.
    instance_variables = {k: v for k, v in env.items() if k.startswith("DAGSTER_")}
    with (
        mock.patch.dict(os.environ, instance_variables),
        dg.DagsterInstance.get() as instance,
    ):
        event = instance.get_latest_materialization_event(dg.AssetKey("near_duplicates"))
        if event is None:
            return {}
        metadata = event.asset_materialization.metadata
        wanted = ("images_compared", "hash_pairs_compared", "hash_candidates", "groups")
        figures = {key: metadata[key].value for key in wanted if key in metadata}
    if "near_duplicates" in manifest.stages:
        figures["seconds"] = manifest.stages["near_duplicates"]
    return figures


SMOKE_EARLIER = (0.25, 1.0)  # the smoke's published sizes: 1 is kept again, 0.25 is not


def smoke(args: argparse.Namespace) -> None:
    """No corpus (its small datasets alone are thousands of images): the step commands as
    built for a data root, then the report over two made-up sizes' kept figures."""
    names = [name for name, _ in commands(Path("/data"))]
    print(f"smoke: {len(names)} steps, {names[0]!r} … {names[-1]!r}")
    with tempfile.TemporaryDirectory(prefix="bench-corpus-") as folder:
        work = Path(folder)
        for fraction, images in ((0.5, 1000), (1.0, 2000)):
            runs = {
                name: [asdict(Step(name, images / 100 + 1, images / 50, 300.0, images * 10, True))]
                for name in (*names[:3], HEADLINE)
            }
            search = {"images_compared": images, "seconds": images / 500}
            figures = {"counts": {"rexgradient": images}, "runs": runs, "search": search, "ui": {}}
            results_file(work, fraction).write_text(json.dumps(figures))
            for runs_of_step in runs.values():
                step = runs_of_step[0]
                step["wall"] *= 1.2
                step["requests"] = {"PUT": images, "GET": images // 2, "5xx": 1, "bytes in": 9}
                step["service_peaks_mb"] = {"dask worker": 700.0, "s3 server": 120.0}
            (work / CLUSTER).mkdir(exist_ok=True)
            figures["worker_loss"] = {
                "images": images,
                "lost_after_s": 3.0,
                "first_launch_ok": True,
                "objects_in_images_folder": images,
            }
            results_file(work / CLUSTER, fraction).write_text(json.dumps(figures))
        report(args, work)
        # A size measured before and no longer kept is shown beside the kept ones; a kept
        # size's figures replace the published ones.
        earlier = {
            "cluster_over_local": {f"{size:g}": {HEADLINE: 1.5} for size in SMOKE_EARLIER},
            "totals": {f"{size:g}": f"Size {size:g}: published before." for size in SMOKE_EARLIER},
        }
        report_cluster(args, work, earlier)


def report_cluster(args: argparse.Namespace, work: Path, earlier: dict | None = None) -> None:
    """The cluster path's figures kept under `work`/cluster, printed, and their table beside
    the local path's figures of the same sizes written as results; with `earlier` (the
    published table's figures), the sizes it has and `work` no longer keeps shown too."""
    cluster, local = kept_sizes(work / CLUSTER), kept_sizes(work)
    table(*stored_results(cluster))
    measured = {f"{fraction:g}" for fraction, _ in cluster}
    before = {
        figure: {size: value for size, value in sizes.items() if size not in measured}
        for figure, sizes in (earlier or {}).items()
    }
    columns, rows, figures = cluster_beside_local(
        local, cluster, CLUSTER_HEADLINES, before.get("cluster_over_local")
    )
    largest = f"{max(fraction for fraction, _ in cluster):g}"
    figures["totals"] = by_size(
        {**before.get("totals", {}), largest: cluster_totals(local, cluster)}
    )
    figures["worker_loss"] = by_size(
        {
            **before.get("worker_loss", {}),
            **{
                f"{fraction:g}": kept["worker_loss"]
                for fraction, kept in cluster
                if "worker_loss" in kept
            },
        }
    )
    notes = list(figures["totals"].values())
    notes += [worker_loss_note(size, loss) for size, loss in figures["worker_loss"].items()]
    title = "The corpus on the cluster path beside the local one"
    note = " ".join(notes)
    write_table(args, Table("corpus_cluster", title, columns, rows, figures, note, "--cluster"))


def published_figures(name: str) -> dict:
    """The figures of the published results file `name` (benchmarks/results/), {} if none."""
    published = REPO / "benchmarks" / "results" / f"{name}.json"
    return json.loads(published.read_text())["figures"] if published.exists() else {}


def worker_loss_note(fraction: str, loss: dict) -> str:
    """One sentence on the build that lost a worker at a size (worker_loss's summary)."""
    lost = f"killed {loss['lost_after_s']:.0f} s" if "lost_after_s" in loss else "not killed"
    outcome = "succeeded"
    if not loss["first_launch_ok"]:
        outcome = f"failed, relaunch {'succeeded' if loss['next_launch_ok'] else 'failed'}"
    same = {True: "equal", False: "NOT equal", None: "not compared"}
    array, rows = (same[loss.get(f"same_{what}")] for what in ("packed_array", "images_table"))
    return (
        f"Size {fraction}: a Dask worker (of 2) {lost} into train's build ({loss['images']:,} "
        f"images); {outcome}; array {array}, images table {rows} to local."
    )


def report(args: argparse.Namespace, work: Path) -> None:
    """The figures kept under `work`, printed, and their table written as results."""
    kept = kept_sizes(work)
    results, images = stored_results(kept)
    table(results, images)
    if len(results) > 1:
        marginal(results, images)
        marginal_reads(results, images)
    project_search(kept)
    report_ui(kept)
    columns, rows = figures_table(results, images, tuple(args.step) or (HEADLINE,))
    title = "The corpus at its real size"
    write_table(args, Table("corpus", title, columns, rows, {"sizes": dict(kept)}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--work", type=Path, help="folder for data, outputs, logs (required)")
    parser.add_argument("--fractions", default="0.25,0.5,1", help="shares of the documented counts")
    parser.add_argument("--side", type=int, default=192, help="pixel side of ReXGradient/NIH films")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep", action="store_true", help="keep each size's data and outputs")
    parser.add_argument(
        "--cluster",
        action="store_true",
        help="on PostgreSQL, the disk-backed S3 server and 2 Dask workers (figures under "
        f"--work/{CLUSTER}, shown beside the local ones of the same sizes)",
    )
    parser.add_argument(
        "--report", action="store_true", help="only print the figures kept under --work"
    )
    parser.add_argument(
        "--step",
        action="append",
        default=[],
        help=f"run only the steps whose names begin so (repeatable; {UI_STEP!r}: the UI pages, "
        f"{RERUNS!r}: the re-runs); the others keep the figures last kept per size",
    )
    parser.add_argument(
        "--passes",
        type=int,
        default=1,
        help="passes over the sizes (N/4, N/2, N, then N, N/2, N/4, …); each step's figures are "
        "its medians over the passes, with the range of its ratio",
    )
    add_options(parser)
    args = parser.parse_args()
    if args.smoke:
        smoke(args)
        return
    if args.work is None:
        parser.error("--work is required")
    fractions = [] if args.report else [float(f) for f in args.fractions.split(",")]
    # Every other pass runs the sizes largest first: a drift of the host over the passes
    # then weighs on each size alike.
    passes = [(index, f) for index in range(args.passes) for f in fractions[:: (-1) ** index]]
    for index, fraction in passes:
        print(
            f"size {fraction:g} of the documented counts (side {args.side}), "
            f"pass {index + 1} of {args.passes}:",
            flush=True,
        )
        rehearse(
            args.work,
            fraction,
            max(fractions),
            args.side,
            args.seed,
            args.workers,
            tuple(args.step),
            first_pass=index == 0,
            cluster=args.cluster,
        )
        if not args.keep:
            # A pass's outputs make room for the next size's; the data serve every pass.
            size_dir = size_folder(args.work, fraction)
            clear_outputs(size_dir)
            if index == args.passes - 1:
                shutil.rmtree(size_dir, ignore_errors=True)
    if args.cluster:
        report_cluster(args, args.work, published_figures("corpus_cluster"))
    else:
        report(args, args.work)


if __name__ == "__main__":
    main()
