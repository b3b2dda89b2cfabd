"""Rehearsal at the real size: the whole corpus built, joined, exported and verified as a user
does, through the CLI on a persistent instance, at N/4, N/2 and N of the documented counts.

Per size it writes the four datasets (CheXlocalize, MS-CXR over MIMIC-CXR and ChestX-Det at
their documented counts whatever the size; ReXGradient and an NIH ChestX-ray14 parent at the
size's share of 273,004 and 112,120 films, rendered in parallel by the project's renderer as
distinct, look-alike radiographs of about `--side` pixels), then runs, each as its own
command under `/usr/bin/time`: a stat of each ReXGradient train image by coreutils (the
disk's own cost of finding them, beside the steps that do), check-data, the observation job,
every partition's `all_stages`, the corpus joins (`manifest`), every partition's `exports`,
the card and `radharmony verify`; at the largest size, ReXGradient train's re-runs
(unchanged, 1 % of its sources changed, and resumed after a kill -9 halfway through a first
build). Run as root, it drops the page cache before each of those commands but the re-runs
(which follow the builds as a user's next launch does), so every size meets its files as a
user's first command after a download does (otherwise N/4 would be read from memory and N
partly from the disk). It prints per step: wall, CPU (busy CPU seconds of the machine while
the step runs: the rehearsal runs alone, and pool workers forked by a fork server are never
the command's reaped children), peak RSS, the bytes it added under the output root, the
reads the disk completed (on a cold cache a step's wall is its reads times the disk's
latency, which varies over the day on this machine) and the pages the kernel reclaimed (what
a step writing more than the free memory holds pays), with the seconds of each stage of a
launched job (from the instance); then near_duplicates' time and hash pairs per size with a
projection to 1,000,000 images, and the marginal cost per image between sizes, per step and
per stage. The datasets written whole are rendered once (`--work`/whole_datasets) and
hard-linked into each size; each size's figures and its commands' output are kept
(`--work`/steps_n*.json, .log), so sizes run by separate commands combine. Everything lives
under `--work` (up to about 60 GB at the full count with `--side 192`: the render, N's outputs
and train's second build, for which N's measured exports are deleted). Every pass over a size
starts from an empty output root and instance (a step chosen by `--step` is a first build and
needs what it reads chosen too: every `all_stages` before `manifest`) and deletes them after,
unless `--keep`; a size's data go after its last pass. With `--passes K` the sizes are run K
times, in turn (N/4, N/2, N, N, N/2, N/4, …), and each step's figures are its medians, with the
range of each ratio over the passes: on this machine one cold step's wall moves by tens of
percent between runs.

    .venv/bin/python benchmarks/bench_corpus.py --work /tmp/rehearsal
    .venv/bin/python benchmarks/bench_corpus.py --work /tmp/r --fractions 0.02 --side 512
    .venv/bin/python benchmarks/bench_corpus.py --work /tmp/rehearsal --step check-data \
        --step "all_stages rexgradient"      # a few steps again, on the corpus already written
    .venv/bin/python benchmarks/bench_corpus.py --work /tmp/rehearsal --passes 3 --step check-data

It is a benchmark, not a test (most of an hour at the full count on 2 cores).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import math
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from unittest import mock

import bench_reruns

from radharmony_pipeline.processing.storage import output_layout as layout
from radharmony_pipeline.sources import SOURCE_TYPES
from radharmony_pipeline.sources.nih_chestxray14 import FOLDER as NIH_FOLDER
from radharmony_pipeline.synthetic import generate_datasets, rexgradient
from radharmony_pipeline.synthetic.encoding import png_bytes
from radharmony_pipeline.synthetic.files import write_bytes
from radharmony_pipeline.synthetic.parents import write_nih_metadata
from radharmony_pipeline.synthetic.radiograph import render_radiograph, to_uint8
from radharmony_pipeline.synthetic.seeding import dataset_rng

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
# Datasets whose documented counts are small: written whole at every size.
WHOLE_DATASETS = ("chexlocalize", "ms_cxr", "chestx_det")
NIH_FILMS = 112_120
NIH_FOLDER_FILMS = 10_000  # the real release: images_001/ … images_012/, ≤ 10,000 films each
# The UI pages a user opens at full size, timed to network idle (item 8 of issue 30).
UI_PAGES = (
    "/assets/images?view=partitions",
    "/assets/images?partition=rexgradient.train",
    "/assets/unified_manifest",
    "/assets/unified_manifest?view=checks",
)
# One load of a page varies by tens of percent on this host: each is loaded this many times,
# the pages in turn, and its median kept.
UI_LOADS = 5
CHROMIUM = "/usr/bin/chromium"
TRAIN_SOURCES = "rexgradient_train_sources.txt"  # under the size's data folder
CHANGED_SHARE = 0.01
# zlib level 1 for the rendered films: level 6 spent 5.3 of 8.8 ms per 192² film here, for
# 15 % smaller files; what the rehearsal measures is per-file cost, not these bytes.
FILM_PNG_LEVEL = 1
QUIET = json.dumps({"loggers": {"console": {"config": {"log_level": "WARNING"}}}})


@dataclass
class Step:
    name: str
    wall: float
    cpu: float
    peak_rss_mb: float
    added_bytes: int
    ok: bool
    # A launched job's stages (Dagster step keys) and their seconds, from the instance.
    stages: dict[str, float] = field(default_factory=dict)
    # Reads the disk under the output root completed while the step ran (all processes).
    disk_reads: int = 0
    # Pages the kernel reclaimed while the step ran (all processes): what writing more than
    # the free memory holds costs.
    pages_reclaimed: int = 0


# --- the corpus ------------------------------------------------------------------------------


def write_corpus(
    data: Path, work: Path, fraction: float, largest: float, side: int, seed: int, workers: int
):
    """The four datasets and the NIH parent under `data`; return their image counts.

    Each size is a share of one corpus rendered once under `work` at the largest size asked:
    the datasets written whole, hard-linked; ReXGradient's first studies of each split (its
    metadata written for them) and the NIH parent's first films, their files hard-linked
    from the render (the pipeline only reads its data roots). Sizes differ in count only."""
    link_whole_datasets(work / "whole_datasets", data, seed)
    films = work / "films"
    plan = rexgradient.plan_studies(seed, rexgradient.FULL_SCALE, (side, side + side // 4))
    render_films(films, first_studies(plan, largest), data, side, seed, workers, largest)
    share = first_studies(plan, fraction)
    root = data / "rexgradient"
    rexgradient.write_planned_metadata(root, share)
    train = []
    for split, studies in share.items():
        for _, study in studies:
            for path in study["ImagePath"]:
                relative = path.removeprefix(rexgradient.IMAGE_PREFIX)
                target = _mkdir((root / "deid_png" / relative).parent) / Path(relative).name
                os.link(films / "rexgradient" / "deid_png" / relative, target)
                if split == "train":
                    train.append(target)
    (data / TRAIN_SOURCES).write_text("\n".join(map(str, train)))
    images = sum(len(study["ImagePath"]) for studies in share.values() for _, study in studies)
    return {"rexgradient": images, "nih": _write_nih(data, films, round(NIH_FILMS * fraction))}


def link_whole_datasets(whole: Path, data: Path, seed: int) -> None:
    done = whole / "complete"
    if not done.exists():
        shutil.rmtree(whole, ignore_errors=True)
        generate_datasets(whole / "data", "full", seed, datasets=list(WHOLE_DATASETS))
        done.touch()
    data.mkdir(parents=True, exist_ok=True)
    for entry in (whole / "data").iterdir():
        subprocess.run(["cp", "-al", str(entry), str(data / entry.name)], check=True)


def first_studies(plan: dict, fraction: float) -> dict:
    """The first `fraction` of each split's studies (at least two): the same films at every
    size, so a smaller size is a part of a larger one."""
    return {
        split: studies[: max(2, round(len(studies) * fraction))] for split, studies in plan.items()
    }


def render_films(
    films: Path, plan: dict, data: Path, side: int, seed: int, workers: int, fraction: float
) -> None:
    """Every ReXGradient film of `plan` and the NIH distractors (NIH's films beyond
    ChestX-Det's originals) of `fraction` of its count, in parallel, once: `films`/complete
    holds the fraction of a finished render, which serves every size up to it."""
    done = films / "complete"
    if done.exists() and float(done.read_text() or 1) >= fraction:
        return
    shutil.rmtree(films, ignore_errors=True)
    distractors = max(0, round(NIH_FILMS * fraction) - len(chestx_det_films(data)))
    with ProcessPoolExecutor(workers) as pool:
        jobs = []
        for split_index, split in enumerate(rexgradient.SPLIT_FILES):
            first = 0
            for chunk in _chunks(plan[split], 500):
                jobs.append(
                    pool.submit(
                        rexgradient.write_images,
                        films / "rexgradient",
                        seed,
                        split_index,
                        chunk,
                        first,
                        FILM_PNG_LEVEL,
                    )
                )
                first += sum(len(study["ImagePath"]) for _, study in chunk)
        jobs += [
            pool.submit(_render_nih_films, films / "nih", seed, side, chunk)
            for chunk in _chunks(list(range(distractors)), 2000)
        ]
        for job in jobs:
            job.result()
    done.write_text(f"{fraction:g}")


def chestx_det_films(data: Path) -> list[Path]:
    return sorted((data / "chestx-det").glob("*/*.png"))


def _chunks(items: list, size: int) -> list[list]:
    return [items[i : i + size] for i in range(0, len(items), size)]


def _write_nih(data: Path, films: Path, count: int) -> int:
    """ChestX-Det's files as their NIH originals plus the first rendered distractors, with the
    real Data_Entry_2017.csv and split lists; the film count."""
    root = data / NIH_FOLDER
    children = chestx_det_films(data)
    entries = []
    for number, child in enumerate(children):
        name = f"{number + 1:08d}_000.png"
        os.link(child, _mkdir(root / _nih_folder(number)) / name)
        entries.append(
            (name, number + 1, 0, "test" if child.parent.name == "test" else "train_val")
        )
    first_patient = len(children) + 1
    for number in range(max(0, count - len(children))):
        patient = first_patient + number // 2
        name = f"{patient:08d}_{number % 2:03d}.png"
        folder = _mkdir(root / _nih_folder(len(children) + number))
        os.link(films / "nih" / f"{number:07d}.png", folder / name)
        split = "test" if patient % 5 == 0 else "train_val"
        entries.append((name, patient, number % 2, split))
    write_nih_metadata(root, entries)
    return len(entries)


def _render_nih_films(folder: Path, seed: int, side: int, numbers: list[int]) -> None:
    for number in numbers:
        rng = dataset_rng(seed, "nih_chestxray14", 1, number)
        pixels = to_uint8(render_radiograph(rng, side, side).pixels)
        write_bytes(folder / f"{number:07d}.png", png_bytes(pixels, FILM_PNG_LEVEL))


def _nih_folder(number: int) -> str:
    return f"images_{number // NIH_FOLDER_FILMS + 1:03d}/images"


def _mkdir(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    return folder


# --- the steps -------------------------------------------------------------------------------


def partitions() -> list[str]:
    return [f"{key}.{split}" for key, source in SOURCE_TYPES.items() for split in source.splits]


# A step or stage whose time grows less than this from the smallest size to the largest is
# fixed-cost: its marginal ratio is this machine's timing noise (±0.6 s a step measured).
FIXED_COST_SECONDS = 1.0


STEP_NAME_WIDTH = 34  # the step column of the printed lines


# A step whose disk reads grow less than this from the smallest size to the largest reads
# what every size holds alike (the small datasets, the code): no per-image reads to compare.
FIXED_COST_READS = 10_000


# The disk's own cost of finding train's images, beside the steps that do (check-data and
# raw_index_and_labels): a cold stat of each, in sequence, by coreutils, no Python.
STAT_FLOOR = "disk: stat each train image"
# What `--step` names the UI pages' timing and ReXGradient train's re-runs by.
UI_STEP = "UI"
RERUNS = "re-run train"


def commands(data: Path) -> list[tuple[str, list[str]]]:
    radharmony, dg = str(BIN / "radharmony"), str(BIN / "dg")
    launch = [dg, "launch", "--config-json", QUIET, "--job"]
    stat_each = bench_reruns.stat_each_command(data / TRAIN_SOURCES)
    steps = [(STAT_FLOOR, stat_each), ("check-data", [radharmony, "check-data"])]
    steps.append(("observe", [*launch, "observe_source_files"]))
    steps += [(f"all_stages {p}", [*launch, "all_stages", "--partition", p]) for p in partitions()]
    steps.append(("manifest", [*launch, "manifest"]))
    steps += [(f"exports {p}", [*launch, "exports", "--partition", p]) for p in partitions()]
    steps.append(("card", [*launch, "dataset_card"]))
    steps.append(("verify", [radharmony, "verify"]))
    return steps


def run_step(name: str, command: list[str], env: dict, output: Path, log: Path) -> Step:
    before = _tree_bytes(output)
    stats = log.with_suffix(".time")
    busy, reads, reclaimed = machine_busy_seconds(), disk_reads(output), pages_reclaimed()
    start = time.perf_counter()
    with log.open("ab") as sink:
        sink.write(f"\n=== {name}: {' '.join(command)}\n".encode())
        sink.flush()
        code = subprocess.call(
            ["/usr/bin/time", "-o", str(stats), "-f", "%M", *command],
            cwd=REPO,
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    wall = time.perf_counter() - start
    cpu = machine_busy_seconds() - busy
    rss_kb = stats.read_text().split()[-1]
    return Step(
        name,
        wall,
        cpu,
        int(rss_kb) / 1024,
        _tree_bytes(output) - before,
        code == 0,
        disk_reads=disk_reads(output) - reads,
        pages_reclaimed=pages_reclaimed() - reclaimed,
    )


def machine_busy_seconds() -> float:
    """CPU seconds every core has spent busy since boot (/proc/stat: all but idle and iowait)."""
    fields = [int(value) for value in Path("/proc/stat").read_text().split("\n")[0].split()[1:8]]
    user, nice, system, _idle, _iowait, irq, softirq = fields
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def disk_reads(folder: Path) -> int:
    """Reads completed since boot by the block device holding `folder` (its nearest existing
    folder), 0 where the kernel keeps no such count (a virtual file system): a cold step's
    wall is its reads (the code's part) times their latency (the disk's part)."""
    while not folder.exists():
        folder = folder.parent
    device = os.stat(folder).st_dev
    counts = Path(f"/sys/dev/block/{os.major(device)}:{os.minor(device)}/stat")
    return int(counts.read_text().split()[0]) if counts.exists() else 0


# The kernel's reclaimers, each counted in /proc/vmstat as pgsteal_<reclaimer>.
RECLAIMERS = ("kswapd", "direct", "khugepaged", "proactive")


def pages_reclaimed() -> int:
    """Pages the kernel has reclaimed since boot, by every reclaimer: kswapd's reclaim costs
    CPU beside the step, direct reclaim stalls it."""
    counts = dict(line.split() for line in Path("/proc/vmstat").read_text().splitlines())
    return sum(int(counts.get(f"pgsteal_{reclaimer}", 0)) for reclaimer in RECLAIMERS)


def _tree_bytes(folder: Path) -> int:
    if not folder.exists():
        return 0
    done = subprocess.run(["du", "-sb", str(folder)], capture_output=True, text=True, check=False)
    return int(done.stdout.split()[0]) if done.stdout else 0


def rehearse(
    work: Path,
    fraction: float,
    largest: float,
    side: int,
    seed: int,
    workers: int,
    only: tuple[str, ...] = (),
    first_pass: bool = True,
) -> None:
    """One size written (once) and every step run on it, from an empty output root and
    instance, the re-runs too at the `largest` size of the run; each step's figures are
    added to its runs in results_file, whose runs of the steps measured again are dropped on
    the `first_pass` of a command. With `only`, just the steps whose names begin with one of
    them (UI_STEP for the pages, RERUNS for the re-runs); the others keep their runs."""

    def wanted(name: str) -> bool:
        return not only or name.startswith(only)

    size_dir = size_folder(work, fraction)
    data, output, home = size_dir / "data", size_dir / "output", size_dir / "dagster_home"
    clear_outputs(size_dir)  # every pass builds from nothing, as a user's first launches do
    home.mkdir(parents=True)
    shutil.copyfile(REPO / "dagster_home" / "dagster.yaml", home / "dagster.yaml")
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
    if results_file(work, fraction).exists():
        figures = {"runs": {}, **json.loads(results_file(work, fraction).read_text())}
        figures["counts"] = counts
    if first_pass:
        figures["runs"] = {name: runs for name, runs in figures["runs"].items() if not wanted(name)}
    log = log_file(work, fraction)

    def keep(step: Step | None = None) -> None:
        """Every figure is kept as soon as it is measured: a run cut short loses none."""
        if step is not None:
            figures["runs"].setdefault(step.name, []).append(asdict(step))
        results_file(work, fraction).write_text(json.dumps(figures))

    for name, command in commands(data):
        if not wanted(name):
            continue
        if os.geteuid() == 0:
            bench_reruns.drop_page_cache()
        step = run_step(name, command, env, output, log)
        if Path(command[0]).name == "dg" and step.ok:
            step.stages = bench_reruns.summary(env)["steps"]
        print(f"  {_row(step)}", flush=True)
        keep(step)
        if name == "manifest":
            figures["search"] = near_duplicate_search(home, step)
    print(f"  near_duplicates: {json.dumps(figures['search'])}", flush=True)
    if wanted(UI_STEP):
        figures["ui"] = ui_pages(env, log)
    keep()
    if fraction == largest and wanted(RERUNS):
        for step in rerun_train(data, output, env, size_dir, log):
            keep(step)


def clear_outputs(size_dir: Path) -> None:
    """A size's output root and instance deleted; its data stay."""
    for folder in ("output", "dagster_home"):
        shutil.rmtree(size_dir / folder, ignore_errors=True)


def ui_pages(env: dict, log: Path) -> dict[str, dict[str, float]]:
    """Each UI page's median and range of seconds to network idle over UI_LOADS loads,
    printed; none where they cannot be timed."""
    if not Path(CHROMIUM).exists():
        print(f"  UI pages not timed: no {CHROMIUM} (apt-get install chromium)")
        return {}
    try:
        loads = time_ui_pages(env, log)
    except Exception as error:  # the re-runs after it are still worth measuring
        print(f"  UI pages not timed: {error!r} (see {log})", flush=True)
        return {}
    pages = {
        path: {
            "median": statistics.median(seconds),
            "min": min(seconds),
            "max": max(seconds),
            "loads": len(seconds),
        }
        for path, seconds in loads.items()
    }
    for path, times in pages.items():
        print(f"  {_ui_line(path, times)}", flush=True)
    return pages


def rerun_train(data: Path, output: Path, env: dict, size_dir: Path, log: Path) -> Iterator[Step]:
    """ReXGradient train launched again as issue 30 item 4 budgets it: unchanged, after 1 % of
    its sources changed, and on a fresh output root killed (SIGKILL) once half its PNGs are
    written, then launched again; with what each decoded and rewrote."""
    command = bench_reruns.launch_command()
    yield counted(run_step("re-run train, unchanged", command, env, output, log), env)
    sources = [Path(line) for line in (data / TRAIN_SOURCES).read_text().splitlines()]
    changed = bench_reruns.change_sources(sources, CHANGED_SHARE, 0)
    yield counted(run_step(f"re-run train, {changed} changed", command, env, output, log), env)
    # The exports are measured by now and a second build of train needs their room: at the
    # full count they hold 12 GB, and with them the disk filled before the kill.
    shutil.rmtree(output / layout.EXPORTS, ignore_errors=True)
    resumed = size_dir / "resumed"
    resumed_env = {**env, "RADHARMONY_OUTPUT_ROOT": str(resumed)}
    killed = bench_reruns.launch_and_kill_halfway(resumed_env, resumed, len(sources))
    written = len(list(resumed.glob(layout.resized_png_glob(bench_reruns.PARTITION))))
    print(f"  first build of train killed after {killed:.1f} s, {written} PNGs written")
    resume = run_step(f"{RERUNS}, resumed after kill -9", command, resumed_env, resumed, log)
    yield counted(resume, resumed_env)
    shutil.rmtree(resumed, ignore_errors=True)


def counted(step: Step, env: dict) -> Step:
    """The step with its stages' seconds, after printing its line and what its images stage
    decoded and wrote."""
    print(f"  {_row(step)}", flush=True)
    launched = bench_reruns.summary(env)
    step.stages = launched["steps"]
    print(f"    stages: {json.dumps(step.stages)}", flush=True)
    print(f"    images: {json.dumps(launched['counts'].get('images', {}))}", flush=True)
    return step


def near_duplicate_search(home: Path, manifest: Step) -> dict:
    """The near_duplicates stage of the `manifest` run just measured: its seconds and the
    search's figures from its latest materialization's metadata."""
    import dagster as dg

    # The instance's dagster.yaml places its storage by the variable, as the steps saw it.
    with (
        mock.patch.dict(os.environ, {"DAGSTER_HOME": str(home)}),
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


def time_ui_pages(env: dict, log: Path) -> dict[str, list[float]]:
    """Seconds from navigation to network idle for each of UI_PAGES, loaded UI_LOADS times in
    turn, on a webserver of the rehearsal's instance (loopback, stopped by its process group
    in `finally`)."""
    from playwright.sync_api import sync_playwright

    port = _free_port()
    with log.open("ab") as sink:
        server = subprocess.Popen(
            [
                str(BIN / "dagster-webserver"),
                "-w",
                str(REPO / "workspace.yaml"),
                "-h",
                "127.0.0.1",
                "-p",
                str(port),
            ],
            cwd=REPO,
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        base = f"http://127.0.0.1:{port}"
        _wait_for(base + "/server_info", timeout=180)
        timings: dict[str, list[float]] = {path: [] for path in UI_PAGES}
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True)
            page = browser.new_page(viewport={"width": 1600, "height": 1000})
            page.goto(base + "/assets", wait_until="networkidle", timeout=120_000)  # warm-up
            for _ in range(UI_LOADS):
                for path in UI_PAGES:
                    start = time.perf_counter()
                    page.goto(base + path, wait_until="networkidle", timeout=120_000)
                    timings[path].append(time.perf_counter() - start)
            browser.close()
        return timings
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _wait_for(url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def _row(step: Step) -> str:
    flag = "" if step.ok else "  FAILED (see steps_n<size>.log)"
    return (
        f"{step.name:<{STEP_NAME_WIDTH}} wall {step.wall:8.1f} s  cpu {step.cpu:8.1f} s  "
        f"peak {step.peak_rss_mb:7.0f} MB  +{step.added_bytes / 1e9:6.2f} GB  "
        f"reads {step.disk_reads / 1e3:7.0f} K ({step.disk_reads / step.wall / 1e3:5.1f} K/s)  "
        f"reclaimed {step.pages_reclaimed / 1e3:7.0f} K pages"
        f"{flag}"
    )


# A size's steps, each by name with its runs (one per pass over the size, in order).
Runs = dict[str, list[Step]]


def typical(runs: list[Step]) -> Step:
    """One step's runs at one size as one: the median of each figure and of each stage's
    seconds, the largest peak RSS (the bound that matters), ok only if every run was."""
    return Step(
        runs[0].name,
        statistics.median(run.wall for run in runs),
        statistics.median(run.cpu for run in runs),
        max(run.peak_rss_mb for run in runs),
        round(statistics.median(run.added_bytes for run in runs)),
        all(run.ok for run in runs),
        {
            stage: statistics.median(run.stages[stage] for run in runs if stage in run.stages)
            for stage in runs[0].stages
        },
        round(statistics.median(run.disk_reads for run in runs)),
        round(statistics.median(run.pages_reclaimed for run in runs)),
    )


def marginal(results: list[tuple[float, Runs]], images: dict[float, int]) -> None:
    """Per step, then per stage of each launched job, the wall (and the step's CPU) per 1,000
    corpus images between consecutive sizes, and the ratio of the last two (1.0: linear);
    "fixed-cost" where the time grows by less than FIXED_COST_SECONDS over all sizes. Of a
    step run more than once per size, the medians, then the range of the ratio over the
    passes (the first run at each size, the second, ...)."""
    print("\nmarginal cost per 1,000 images between sizes (wall | CPU), ratio of the last two")
    by_name, added = _by_size(results, images)
    width = 2 + max(
        (
            len(name)
            for named in by_name
            for step in named.values()
            for name in (step.name, *step.stages)
        ),
        default=0,
    )  # a run with no steps (`--step` naming none: the corpus only) prints no rows
    for name in by_name[0]:
        if not all(name in named for named in by_name):
            continue  # not measured at every size (a run cut short)
        steps = [named[name] for named in by_name]
        walls = _per_thousand([step.wall for step in steps], added)
        cpus = _per_thousand([step.cpu for step in steps], added)
        shown = "  ".join(f"{w:7.2f} | {c:7.2f} s" for w, c in zip(walls, cpus, strict=True))
        verdict = _verdict([step.wall for step in steps], walls)
        spread = "" if verdict == FIXED_COST else _spread(results, name, added)
        print(f"  {name:<{width}} {shown}   {verdict} | {_ratio(cpus)}{spread}")
        for stage in steps[0].stages:
            seconds = [step.stages.get(stage) for step in steps]
            if None not in seconds:
                walls = _per_thousand(seconds, added)
                shown = "  ".join(f"{w:7.2f} s{'':11}" for w in walls)
                verdict = _verdict(seconds, walls)
                spread = "" if verdict == FIXED_COST else _spread(results, name, added, stage)
                print(f"    {stage:<{width - 2}} {shown}   {verdict}{spread}")


def _spread(
    results: list[tuple[float, Runs]], name: str, added: list[float], stage: str | None = None
) -> str:
    """The lowest and highest ratio of the last two marginal costs of step `name` (of its
    `stage`) over the passes with a run of it at every size; nothing if only one has."""
    passes = min(len(kept.get(name, [])) for _, kept in results)
    ratios = []
    for index in range(passes):
        at_sizes = [kept[name][index] for _, kept in results]
        values = [run.wall if stage is None else run.stages.get(stage) for run in at_sizes]
        ratio = _last_ratio(_per_thousand(values, added)) if None not in values else None
        if ratio is not None:
            ratios.append(ratio)
    return f"   (passes {min(ratios):.2f}–{max(ratios):.2f})" if len(ratios) > 1 else ""


def marginal_reads(results: list[tuple[float, Runs]], images: dict[float, int]) -> None:
    """Per step that reads the disk, its reads per 1,000 corpus images between consecutive
    sizes and their ratio: the code's part of a cold step's scaling, whatever the disk's
    latency did meanwhile; steps whose reads grow by fewer than FIXED_COST_READS are left out."""
    print("\ndisk reads per 1,000 images between sizes, ratio of the last two")
    by_name, added = _by_size(results, images)
    for name in by_name[0]:
        if all(name in named for named in by_name):
            reads = [named[name].disk_reads for named in by_name]
            if reads[-1] - reads[0] >= FIXED_COST_READS:
                costs = _per_thousand(reads, added)
                shown = "  ".join(f"{cost:9,.0f}" for cost in costs)
                print(f"  {name:<{STEP_NAME_WIDTH}} {shown}   {_ratio(costs)}")


def _by_size(
    results: list[tuple[float, Runs]], images: dict[float, int]
) -> tuple[list[dict[str, Step]], list[float]]:
    """Each size's steps by name (their typical run), and the thousands of images each size
    adds to the last."""
    by_name = [{name: typical(steps) for name, steps in runs.items()} for _, runs in results]
    added = [(images[f1] - images[f0]) / 1000 for f0, f1 in itertools.pairwise(images)]
    return by_name, added


def _per_thousand(totals: list[float], added: list[float]) -> list[float]:
    return [(t1 - t0) / a for (t0, t1), a in zip(itertools.pairwise(totals), added, strict=True)]


FIXED_COST = "fixed-cost"


def _verdict(seconds: list[float], costs: list[float]) -> str:
    return FIXED_COST if seconds[-1] - seconds[0] < FIXED_COST_SECONDS else _ratio(costs)


def _ratio(costs: list[float]) -> str:
    ratio = _last_ratio(costs)
    return "  n/a" if ratio is None else f"{ratio:5.2f}"


def _last_ratio(costs: list[float]) -> float | None:
    """The last marginal cost over the one before it; none without a positive one before."""
    return costs[-1] / costs[-2] if len(costs) > 1 and costs[-2] > 0 else None


def table(results: list[tuple[float, Runs]], images: dict[float, int]) -> None:
    """Every step at every size as one Markdown table (wall / CPU / peak RSS; of a step run
    more than once, the medians and the largest peak, with the number of runs)."""
    sizes = [f"{fraction:g} ({images[fraction]:,} images)" for fraction, _ in results]
    print("\n| step | " + " | ".join(sizes) + " |")
    print("|---|" + "---|" * len(results))
    names = dict.fromkeys(name for _, runs in results for name in runs)
    for name in names:
        cells = []
        for _, runs in results:
            if name not in runs:
                cells.append("–")
                continue
            step = typical(runs[name])
            cells.append(
                f"{step.wall:.1f} s / {step.cpu:.1f} s / {step.peak_rss_mb / 1024:.2f} GB"
                + ("" if step.ok else " FAILED")
                + (f" ({len(runs[name])} runs)" if len(runs[name]) > 1 else "")
            )
        print(f"| {name} | " + " | ".join(cells) + " |")


def size_folder(work: Path, fraction: float) -> Path:
    """A size's data, output root and instance."""
    return work / f"n{fraction:g}"


RESULTS_PREFIX = "steps_n"  # results_file's name before the size


def results_file(work: Path, fraction: float) -> Path:
    """Each size's steps outlive its data, so sizes run by separate commands combine."""
    return work / f"{RESULTS_PREFIX}{fraction:g}.json"


def log_file(work: Path, fraction: float) -> Path:
    """Each size's commands' output (progress lines, failures), kept beside its figures."""
    return results_file(work, fraction).with_suffix(".log")


KeptSizes = list[tuple[float, dict]]  # (size, its kept figures), smallest size first


def kept_sizes(work: Path) -> KeptSizes:
    """Every size's kept figures (results_file), smallest size first; a file whose name only
    begins so (a copy kept aside) is left out, with a note."""
    kept = []
    for path in work.glob(f"{RESULTS_PREFIX}*.json"):
        try:
            fraction = float(path.stem.removeprefix(RESULTS_PREFIX))
        except ValueError:
            print(f"{path}: not a size's figures ({RESULTS_PREFIX}<size>.json), left out")
            continue
        kept.append((fraction, json.loads(path.read_text())))
    return sorted(kept, key=lambda size: size[0])


def stored_results(kept: KeptSizes) -> tuple[list[tuple[float, Runs]], dict[float, int]]:
    """Each kept size's runs per step, and its number of images."""
    results, images = [], {}
    for fraction, stored in kept:
        runs = {
            name: [Step(**run) for run in step_runs] for name, step_runs in stored["runs"].items()
        }
        results.append((fraction, runs))
        images[fraction] = sum(stored["counts"].values())
    return results, images


def report_ui(kept: KeptSizes) -> None:
    """Each size's UI pages as kept: the median of their loads, with the range."""
    for fraction, stored in kept:
        pages = stored.get("ui", {})
        if not pages or not all(isinstance(t, dict) and "loads" in t for t in pages.values()):
            continue  # not timed at this size, or kept as single loads by an earlier version
        print(f"\nUI pages at size {fraction:g}")
        for page, times in pages.items():
            print(f"  {_ui_line(page, times)}")


def _ui_line(page: str, times: dict) -> str:
    return (
        f"UI {page:<46} network idle after {times['median']:5.2f} s "
        f"(median of {times['loads']}; {times['min']:.2f}–{times['max']:.2f} s)"
    )


def project_search(kept: KeptSizes, corpus: int = 1_000_000) -> None:
    """near_duplicates per size, and its time at `corpus` images extrapolated from the two
    largest sizes with the growth exponent they show (t ∝ n^k)."""
    searches = sorted(
        (s["images_compared"], s["seconds"])
        for _, stored in kept
        if {"images_compared", "seconds"} <= (s := stored["search"]).keys()
    )
    print("\nnear_duplicates (images compared: seconds)")
    for images, seconds in searches:
        print(f"  {images:>9,}: {seconds:6.1f} s")
    if len(searches) >= 2:
        (n0, t0), (n1, t1) = searches[-2:]
        exponent = math.log(t1 / t0) / math.log(n1 / n0)
        projected = t1 * (corpus / n1) ** exponent
        print(f"  projected to {corpus:,} images: {projected / 60:.1f} min (t ∝ n^{exponent:.2f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, required=True, help="folder for data, outputs, logs")
    parser.add_argument("--fractions", default="0.25,0.5,1", help="shares of the documented counts")
    parser.add_argument("--side", type=int, default=192, help="pixel side of ReXGradient/NIH films")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep", action="store_true", help="keep each size's data and outputs")
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
    args = parser.parse_args()
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
        )
        if not args.keep:
            # A pass's outputs make room for the next size's; the data serve every pass.
            size_dir = size_folder(args.work, fraction)
            clear_outputs(size_dir)
            if index == args.passes - 1:
                shutil.rmtree(size_dir, ignore_errors=True)
    kept = kept_sizes(args.work)
    results, images = stored_results(kept)
    table(results, images)
    if len(results) > 1:
        marginal(results, images)
        marginal_reads(results, images)
    project_search(kept)
    report_ui(kept)


if __name__ == "__main__":
    main()
