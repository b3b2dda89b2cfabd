"""Benchmark: re-runs of one partition through `dg launch`, as a user launches them.

Writes a synthetic ReXGradient train split of `--images` small radiographs (the project's
renderer, sides of 180-200 pixels, so that per-image bookkeeping rather than pixels decides
the cost), then, on a persistent instance and output root of its own:

1. the first build of `all_stages`;
2. `--repeats` pairs of an unchanged re-run and a re-run after `--changed` of the sources
   were rewritten with other pixels (a new share each time);
3. a first build on a new output root killed with SIGKILL once half of the resized PNGs are
   written, then the same job launched again (the resume).

With `--cold` (as root) the page cache is dropped before each unchanged re-run, as a build
that wrote more than memory leaves it, and before that a cold stat of each train source in
sequence by coreutils is timed: the disk's own cost of the look an unchanged re-run must take.

Each line gives the wall time of the whole `dg launch` (start-up included), the steps'
durations, and the counts the stages report: images decoded, packed rows written (all N on
an assembly, the changed ones when patched in place), and which stages re-used their
tables (the annotation stages and `partition_profile`). Ratios are to the first build
measured in the same run.

    .venv/bin/python benchmarks/bench_reruns.py [--images 3000] [--changed 0.01] [--repeats 2]
        [--keep DIR] [--cold]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import cv2
import numpy as np

from radharmony_pipeline.processing.storage import output_layout as layout
from radharmony_pipeline.synthetic import rexgradient
from radharmony_pipeline.synthetic.radiograph import render_radiograph, to_uint8
from radharmony_pipeline.synthetic.seeding import dataset_rng

REPOSITORY = Path(__file__).resolve().parents[1]
PARTITION = "rexgradient.train"
SIDES = (180, 200)
REUSING_STAGES = ("raw_index", "labels", "bboxes", "masks", "partition_profile")
# Printed per run: the instance's step durations and the stages' own counts.
SUMMARY = """
import json, sys
import dagster as dg
with dg.DagsterInstance.get() as instance:
    run = instance.get_runs(limit=1)[0]
    steps = {s.step_key: round(s.end_time - s.start_time, 1)
             for s in instance.get_run_step_stats(run.run_id) if s.end_time}
    counts = {}
    for record in instance.get_records_for_run(run.run_id).records:
        event = record.event_log_entry.dagster_event
        if event is None or event.event_type_value != "ASSET_MATERIALIZATION":
            continue
        materialization = event.event_specific_data.materialization
        counts[materialization.asset_key.to_user_string()] = {
            k: getattr(v, "value", v) for k, v in materialization.metadata.items()
            if k in ("decoded", "reused", "packed_rows_written", "packed_rows_replayed")
        }
    print(json.dumps({"status": str(run.status), "steps": steps, "counts": counts}))
"""


def write_partition(
    root: Path, images: int, seed: int = 0, sides: tuple[int, int] = SIDES
) -> list[Path]:
    """ReXGradient metadata with `images` train images (tiny val and test), one rendered
    radiograph of `sides` per ImagePath; the train PNGs' paths."""
    sizes = {
        "train": rexgradient.SplitSize(images * 6 // 10, images, images * 4 // 10),
        "val": rexgradient.SplitSize(3, 5, 2),
        "test": rexgradient.SplitSize(3, 5, 2),
    }
    studies = rexgradient.write_metadata(root / "rexgradient", seed, sizes, sides)
    train = []
    for split_index, split in enumerate(rexgradient.SPLIT_FILES):
        index = 0
        for _, study in studies[split]:
            for path, (height, width) in zip(study["ImagePath"], study["ImageShape"], strict=True):
                rng = dataset_rng(seed, "rexgradient", 1, split_index, index)
                target = (
                    root / "rexgradient" / "deid_png" / path.removeprefix(rexgradient.IMAGE_PREFIX)
                )
                write_radiograph(target, rng, height, width)
                if split == "train":
                    train.append(target)
                index += 1
    return train


def write_radiograph(path: Path, rng: np.random.Generator, height: int, width: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)  # a hard-linked source is replaced, its other names kept
    cv2.imwrite(str(path), to_uint8(render_radiograph(rng, height, width, "frontal").pixels))


def change_sources(sources: list[Path], share: float, round_number: int) -> int:
    """Rewrite a fresh share of the sources with other pixels; how many."""
    count = max(1, round(len(sources) * share))
    rng = np.random.default_rng(1000 + round_number)
    for position in rng.choice(len(sources), count, replace=False):
        height, width = cv2.imread(str(sources[position]), cv2.IMREAD_UNCHANGED).shape
        write_radiograph(sources[position], rng, height, width)
    return count


def environment(data: Path, output: Path, home: Path) -> dict[str, str]:
    venv = Path(sys.executable).parent
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith(("RADHARMONY_", "DAGSTER_"))},
        "PATH": f"{venv}:{os.environ.get('PATH', '')}",
        "VIRTUAL_ENV": str(venv.parent),
        "DAGSTER_HOME": str(home),
        "RADHARMONY_DATA_ROOT": str(data),
        "RADHARMONY_OUTPUT_ROOT": str(output),
    }


def launch_command() -> list[str]:
    quiet = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}
    dg = str(Path(sys.executable).with_name("dg"))
    return [dg, "launch", "--job", "all_stages", "--partition", PARTITION,
            "--config-json", json.dumps(quiet)]  # fmt: skip


def launch(env: dict[str, str]) -> float:
    start = time.perf_counter()
    completed = subprocess.run(launch_command(), cwd=REPOSITORY, env=env, capture_output=True)
    wall = time.perf_counter() - start
    if completed.returncode != 0:
        raise SystemExit(f"dg launch failed:\n{completed.stderr.decode()[-3000:]}")
    return wall


def launch_and_kill_halfway(env: dict[str, str], output: Path, images: int) -> float:
    """A first build killed (SIGKILL, its whole process group) once half of its PNGs are
    written; the seconds until the kill."""
    start = time.perf_counter()
    process = subprocess.Popen(
        launch_command(), cwd=REPOSITORY, env=env, start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    pattern = layout.resized_png_glob(PARTITION)
    while process.poll() is None and len(list(output.glob(pattern))) < images // 2:
        time.sleep(0.2)
    if process.returncode is not None:  # e.g. the disk filled up: there is nothing to kill
        raise SystemExit(
            f"the first build exited with {process.returncode} before half of its {images} "
            f"PNGs were written under {output}; launch it by hand to see why"
        )
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    return time.perf_counter() - start


def stat_each_command(listed: Path) -> list[str]:
    """A stat of each file `listed` (one path a line) in sequence by coreutils, no Python:
    on a cold cache, the disk's own cost of looking at each source once."""
    return ["xargs", "-d", "\\n", "-a", str(listed), "stat", "--printf="]


def cold_stat_floor(listed: Path) -> float:
    """Seconds of stat_each_command after the page cache is dropped (root only)."""
    drop_page_cache()
    start = time.perf_counter()
    subprocess.run(stat_each_command(listed), check=True)
    return time.perf_counter() - start


DROP_CACHES = Path("/proc/sys/vm/drop_caches")


def drop_page_cache() -> None:
    """Written data to disk, then every clean page, dentry and inode dropped (root only)."""
    os.sync()
    DROP_CACHES.write_text("3\n")


def summary(env: dict[str, str]) -> dict:
    completed = subprocess.run(
        [sys.executable, "-c", SUMMARY], env=env, capture_output=True, text=True, check=True
    )
    return json.loads(completed.stdout)


def describe(name: str, wall: float, first: float | None, env: dict[str, str]) -> None:
    found = summary(env)
    counts = found["counts"]
    images = counts.get("images", {})
    reused = [stage for stage in REUSING_STAGES if counts.get(stage, {}).get("reused")]
    ratio = f" ({wall / first:.2f}x first build)" if first else ""
    steps = ", ".join(f"{step} {seconds}s" for step, seconds in found["steps"].items())
    print(f"{name}: wall {wall:.1f} s{ratio}")
    print(
        f"    decoded {images.get('decoded')}, packed rows written "
        f"{images.get('packed_rows_written')}, replayed {images.get('packed_rows_replayed')}, "
        f"re-used: {', '.join(reused) or 'none'}"
    )
    print(f"    steps: {steps}")


def parse_arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=3000, help="train images (default 3000)")
    parser.add_argument("--changed", type=float, default=0.01, help="share changed per round")
    parser.add_argument("--repeats", type=int, default=2, help="unchanged/changed pairs")
    parser.add_argument("--keep", type=Path, help="work folder kept after the run")
    parser.add_argument(
        "--cold", action="store_true", help="drop the page cache before unchanged re-runs (root)"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_arguments(argv)
    work = args.keep or Path(tempfile.mkdtemp(prefix="bench-reruns-"))
    try:
        data, home = work / "data", work / "dagster_home"
        for previous in ("output", "resumed"):  # a kept folder's earlier runs
            shutil.rmtree(work / previous, ignore_errors=True)
        shutil.rmtree(home, ignore_errors=True)
        home.mkdir(parents=True)
        shutil.copy(REPOSITORY / "dagster_home" / "dagster.yaml", home)
        start = time.perf_counter()
        listed = data / "train_sources.txt"
        if not listed.exists():
            shutil.rmtree(data, ignore_errors=True)
            listed.parent.mkdir(parents=True)
            listed.write_text("\n".join(map(str, write_partition(data, args.images))))
        sources = [Path(line) for line in listed.read_text().splitlines()]
        print(f"{len(sources)} train images of {SIDES[0]}-{SIDES[1]} px "
              f"({time.perf_counter() - start:.0f} s to write), cores: {os.cpu_count()}, "
              f"load {os.getloadavg()[0]:.1f}")  # fmt: skip
        env = environment(data, work / "output", home)
        first = launch(env)
        describe("first build", first, None, env)
        for round_number in range(args.repeats):
            if args.cold:
                floor = cold_stat_floor(listed)
                print(f"disk: stat each train source, cold, in sequence: {floor:.1f} s")
                drop_page_cache()
            describe("unchanged re-run", launch(env), first, env)
            changed = change_sources(sources, args.changed, round_number)
            describe(f"{changed} sources changed", launch(env), first, env)
        resumed_env = environment(data, work / "resumed", home)
        killed = launch_and_kill_halfway(resumed_env, work / "resumed", args.images)
        written = len(list((work / "resumed").glob(layout.resized_png_glob(PARTITION))))
        print(f"first build killed after {killed:.1f} s with {written} PNGs written")
        describe("resumed", launch(resumed_env), first, resumed_env)
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
