"""The rehearsal's figures as kept per size, and what is printed from them: the steps'
table, the marginal cost per image between sizes, near_duplicates' projection, the UI pages
(bench_corpus.py)."""

from __future__ import annotations

import itertools
import json
import math
import statistics
from pathlib import Path
from typing import TypeVar

from corpus.browser import _ui_line
from corpus.sampling import STEP_NAME_WIDTH, Step

T = TypeVar("T")

# A step or stage whose time grows less than this from the smallest size to the largest is
# fixed-cost: its marginal ratio is this machine's timing noise (±0.6 s a step measured).
FIXED_COST_SECONDS = 1.0


# A step whose disk reads grow less than this from the smallest size to the largest reads
# what every size holds alike (the small datasets, the code): no per-image reads to compare.
FIXED_COST_READS = 10_000


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
        runs[0].requests,
        {
            role: max(run.service_peaks_mb.get(role, 0.0) for run in runs)
            for role in runs[0].service_peaks_mb
        },
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


def figures_table(
    results: list[tuple[float, Runs]], images: dict[float, int], shown: tuple[str, ...]
) -> tuple[list[str], list[list[str]]]:
    """The steps whose names begin with one of `shown` at every size, one row each: wall /
    CPU / peak RSS of each pass, and the median wall / CPU (the results file's table; every
    step's figures are in the file beside it)."""
    chosen = [(f, {n: r for n, r in sized.items() if n.startswith(shown)}) for f, sized in results]
    passes = max((len(runs) for _, sized in chosen for runs in sized.values()), default=1)
    columns = ["step", "size (images)", *(f"pass {n + 1}" for n in range(passes))]
    rows = []
    for fraction, sized in chosen:
        for name, runs in sized.items():
            cells = [
                f"{r.wall:.1f} s / {r.cpu:.1f} s / {r.peak_rss_mb / 1024:.2f} GB" for r in runs
            ]
            cells += [""] * (passes - len(runs))
            middle = typical(runs)
            size = f"{fraction:g} ({images[fraction]:,})"
            rows.append([name, size, *cells, f"{middle.wall:.1f} s / {middle.cpu:.1f} s"])
    return [*columns, "median (wall / CPU)"], rows


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


# The server's request kinds that are not requests (tests/s3_server.js counts them alongside).
NOT_REQUESTS = ("bytes in", "bytes out", "5xx")


Pairs = dict[str, tuple[Step, Step]]  # step name -> (local run, cluster run), typical runs


def steps_on_both_paths(local: KeptSizes, cluster: KeptSizes) -> list[tuple[float, Pairs]]:
    """Per size (smallest first), each step run on both paths: its local and cluster run."""
    local_runs = dict(stored_results(local)[0])
    return [
        (
            fraction,
            {
                name: (typical(local_runs[fraction][name]), typical(step_runs))
                for name, step_runs in runs.items()
                if name in local_runs.get(fraction, {})
            },
        )
        for fraction, runs in stored_results(cluster)[0]
    ]


def by_size(figures: dict[str, T]) -> dict[str, T]:
    """Figures keyed by size ("0.25"), smallest size first."""
    return dict(sorted(figures.items(), key=lambda item: float(item[0])))


def cluster_beside_local(
    local: KeptSizes,
    cluster: KeptSizes,
    shown: tuple[str, ...],
    earlier: dict[str, dict[str, float]] | None = None,
) -> tuple[list[str], list[list[str]], dict]:
    """Each step run on both paths at the largest size whose name begins with one of `shown`,
    one row: the local and cluster wall, their ratio at each size (smallest first), the
    cluster's CPU, its S3 requests per corpus image (the two most) and the largest peak RSS
    of the step and the services (cluster_totals names the size and its images); every
    step's ratio at every size in the figures (each run's requests by kind, bytes and peaks
    are in the kept figures). `earlier`: the ratios of sizes measured before and no longer
    kept, by size and step, shown beside the kept ones."""
    images = stored_results(cluster)[1]
    columns = [
        "step",
        "local wall",
        "cluster wall / CPU",
        "cluster / local, each size",
        "S3 requests per corpus image (top 2)",
        "largest peak RSS",
    ]
    ratios: dict[str, dict[str, float]] = {}
    largest: dict[str, tuple[float, Step, Step]] = {}
    for fraction, pairs in steps_on_both_paths(local, cluster):
        for name, (near, far) in pairs.items():
            ratios.setdefault(f"{fraction:g}", {})[name] = round(far.wall / near.wall, 3)
            largest[name] = (fraction, near, far)
    ratios = by_size({**(earlier or {}), **ratios})
    rows = []
    for name, (fraction, near, far) in largest.items():
        if not name.startswith(shown):
            continue
        requests = {k: v for k, v in far.requests.items() if k not in NOT_REQUESTS}
        most = sorted(requests.items(), key=lambda item: -item[1])[:2]
        peaks = {"step": far.peak_rss_mb, **far.service_peaks_mb}
        heaviest = max(peaks, key=lambda role: peaks[role])
        each_size = [by_step[name] for by_step in ratios.values() if name in by_step]
        rows.append(
            [
                name,
                f"{near.wall:.1f} s",
                f"{far.wall:.1f} s / {far.cpu:.1f} s" + ("" if far.ok else " FAILED"),
                " → ".join(f"{ratio:.2f}×" for ratio in each_size),
                f"{sum(requests.values()) / images[fraction]:.2f} ("
                + ", ".join(f"{k} {v:,}" for k, v in most)
                + ")",
                f"{peaks[heaviest] / 1024:.2f} GB ({heaviest})",
            ]
        )
    return columns, rows, {"cluster_over_local": ratios}


def cluster_totals(local: KeptSizes, cluster: KeptSizes) -> str:
    """One sentence on every step run on both paths at the largest such size: their walls
    summed, the 5xx answers, the largest peak RSS of any process, the temporary keys left."""
    fraction, pairs = [size for size in steps_on_both_paths(local, cluster) if size[1]][-1]
    images = stored_results(cluster)[1][fraction]
    walls = [sum(pair[side].wall for pair in pairs.values()) for side in (0, 1)]
    errors = sum(far.requests.get("5xx", 0) for _, far in pairs.values())
    peak = max(max(far.peak_rss_mb, *far.service_peaks_mb.values()) for _, far in pairs.values())
    left = len(dict(cluster)[fraction].get("leftover_temporaries", []))
    return (
        f"Size {fraction:g} ({images:,} images), all steps: local {walls[0]:,.0f} s, "
        f"cluster {walls[1]:,.0f} s ({walls[1] / walls[0]:.2f}×); {errors} 5xx; every process "
        f"≤ {peak / 1024:.2f} GB; {left} temporary keys left."
    )
