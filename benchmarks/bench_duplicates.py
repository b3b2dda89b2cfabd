"""Benchmark: near duplicates (`search`) and NIH parent links (`parents`) at the corpus's size,
and the measurements behind the hash (`hashes`) and the pixel threshold (`films`)."""

from __future__ import annotations

import argparse
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import cv2
import numpy as np
import pandas as pd
from common import Table, add_options, per_item, write_table
from duplicates import planted
from duplicates.choices import faiss_comparison, films_section, hashes_section, old_search
from PIL import Image

from radharmony_pipeline.processing.corpus import duplicates
from radharmony_pipeline.processing.corpus.duplicates import PackedContents, near_duplicate_members
from radharmony_pipeline.processing.corpus.parent_fingerprints import (
    fingerprint_parent_image,
    parent_image_jobs,
)
from radharmony_pipeline.processing.corpus.parents import PARENT_MATCH_RADIUS, match_to_parents
from radharmony_pipeline.processing.imaging.perceptual_hash import (
    DEFAULT_RADIUS,
    HashPairs,
    close_pairs,
    hamming,
    hashes_to_words,
)
from radharmony_pipeline.processing.storage.source_store import tree_states
from radharmony_pipeline.synthetic.look_alikes import COPY_KINDS

PROJECTED = 1_000_000
NIH_IMAGES = 112_120


def search_section(args: argparse.Namespace) -> Table:
    """`near_duplicates` on look-alike radiographs' hashes (cached under `--cache`: rendering
    278,000 takes 10-40 minutes on 2 cores) with planted copies of every kind, at N/4, N/2
    and N: the exact search and its hash pairs compared, the whole step's computation (with
    confirmation on pixels read from a packed array), plants found and false groups; the
    search projected to 1,000,000 hashes; the search before issue 30 at N/4 (the baseline)
    and, with `--faiss-at M`, faiss-cpu's indexes. Targets: the step <= 60 s at N, the
    projection <= 10 min, every plant found, no false group."""
    chunk = args.count if args.smoke else 50_000  # renders per cached file
    looks = planted.look_alike_words(args.cache, args.seed, args.hash_side, args.count, chunk)
    words, truth, pixels = planted.plant_copies(looks, args.planted, args.film_side, args.seed)
    print(
        f"{args.count:,} look-alike hashes ({args.hash_side} px renders) + {len(truth)} planted "
        f"copies ({len(COPY_KINDS)} kinds, {args.film_side} px films resized to 224); radius "
        f"{DEFAULT_RADIUS}"
    )
    if args.faiss_at:
        faiss_comparison(np.unique(looks[: args.faiss_at], axis=0), DEFAULT_RADIUS)
    sizes, rows, note = [], [], ""
    for share in (4, 2, 1):
        count = args.count // share
        plants = [t for t in truth if t[0] < count]
        rows_in = np.r_[np.arange(count), [copy for _, copy, _ in plants]].astype(np.int64)
        distinct = np.unique(words[rows_in], axis=0)
        start = time.perf_counter()
        pairs = close_pairs(distinct)
        search = time.perf_counter() - start
        table = planted.images_table(words, rows_in, args.film_side)
        needed = _rows_in_pairs(words, rows_in, distinct, pairs)
        planted.write_packed(args.work, len(words), needed, pixels, args.seed, args.film_side)
        inner: list[float] = []
        duplicates.close_pairs = _timed_search(inner)  # times the step's own search
        start = time.perf_counter()
        result = near_duplicate_members(table, PackedContents(args.work))
        step = time.perf_counter() - start
        duplicates.close_pairs = close_pairs
        groups = result.members.groupby("group_id")["image_id"].apply(frozenset)
        plants_in = {frozenset(_ids(t)) for t in plants}
        visible = {frozenset(_ids(t)) for t in plants if _bits(words, t) <= DEFAULT_RADIUS}
        found = sum(1 for p in plants_in if any(p <= g for g in groups))
        found_visible = sum(1 for p in visible if any(p <= g for g in groups))
        false_groups = sum(1 for g in groups if g not in plants_in)
        sizes.append((len(distinct), search, pairs.compared))
        print(
            f"N/{share} = {len(rows_in):,} images: search {search:.1f} s, {pairs.compared:,} "
            f"hash pairs compared, {len(pairs)} within {DEFAULT_RADIUS} bits | whole step "
            f"{step:.1f} s (its search {sum(inner):.1f} s): {result.candidates} candidates, "
            f"{result.confirmed} confirmed, {result.rejected} rejected | planted copies found "
            f"{found} / {len(plants_in)} ({found_visible} / {len(visible)} within the "
            f"radius), false groups: {false_groups}",
            flush=True,
        )
        label = "N" if share == 1 else f"N/{share}"
        rows.append(
            [
                f"{label} = {len(rows_in):,}",
                f"{search:.1f} s",
                f"{pairs.compared:,}",
                f"{step:.1f} s",
                f"{found} of {len(plants_in)}",
                false_groups,
            ]
        )
        if share == 4 and not args.skip_baseline:
            start = time.perf_counter()
            candidates, within = old_search(distinct, DEFAULT_RADIUS)
            old = time.perf_counter() - start
            note = (
                f" The old search at N/4: {old / search:.1f}× slower, "
                f"{candidates / pairs.compared:.1f}× the comparisons ({within} within)."
            )
            print(note.strip(), flush=True)
    distinct, times, compared = (
        np.array(column, dtype=np.float64) for column in zip(*sizes, strict=True)
    )
    # Comparisons grow as a power of n (fitted through the three sizes). The time has a part
    # per hash (sorting, probing) and a part per comparison; at these sizes the first
    # dominates, so the time at 1,000,000 lies between N's time scaled by the hashes (all of
    # it per hash) and by the comparisons (all of it per comparison: the upper bound stated).
    exponent, offset = np.polyfit(np.log(distinct), np.log(compared), 1)
    projected = float(np.exp(offset) * PROJECTED**exponent)
    by_hashes = times[2] * PROJECTED / distinct[2]
    upper = times[2] * projected / compared[2]
    print(
        f"projection to {PROJECTED:,} hashes: comparisons ~ n^{exponent:.2f} -> {projected:.2e}"
        f"; search time between {by_hashes:.0f} s and {upper:.0f} s = {upper / 60:.1f} min "
        "(N's time per comparison: the upper bound)"
    )
    columns = [
        "images",
        "search",
        "hash pairs compared",
        "whole step",
        "planted copies found",
        "false groups",
    ]
    note = (
        f"Projected to {PROJECTED:,} hashes: ≤ {upper / 60:.1f} min (upper bound; target ≤ "
        f"10 min).{note}"
    )
    figures = {"sizes": sizes, "exponent": exponent, "projected_seconds": [by_hashes, upper]}
    return Table("duplicates", "Near duplicates at the corpus's size", columns, rows, figures, note)


def _timed_search(inner: list[float]) -> Callable[..., HashPairs]:
    search = duplicates.close_pairs

    def timed(*args, **kwargs):
        start = time.perf_counter()
        try:
            return search(*args, **kwargs)
        finally:
            inner.append(time.perf_counter() - start)

    return timed


def _bits(words: np.ndarray, plant: tuple[int, int, str]) -> int:
    return int(hamming(words[plant[0]][None, :], words[plant[1]][None, :])[0])


def _ids(plant: tuple[int, int, str]) -> list[str]:
    return [f"rexgradient/{plant[0]:07d}", f"rexgradient/{plant[1]:07d}"]


def _rows_in_pairs(
    words: np.ndarray, rows: np.ndarray, distinct: np.ndarray, pairs: HashPairs
) -> set[int]:
    """Image rows whose hash is in a pair within the radius or shared with another row (the
    rows confirmation reads)."""
    involved = np.unique(np.r_[pairs.left, pairs.right]).tolist()
    wanted = {distinct[i].tobytes() for i in involved}
    keys = [words[r].tobytes() for r in rows.tolist()]
    shared = pd.Series(keys).duplicated(keep=False).to_numpy()
    return {
        int(r)
        for r, key, twin in zip(rows.tolist(), keys, shared, strict=True)
        if twin or key in wanted
    }


def parents_section(args: argparse.Namespace) -> Table:
    """`match_to_parents` of ChestX-Det's fingerprints planted among NIH's (in clusters of
    look-alikes) against brute force on a sample, with the peak traced memory per NIH
    fingerprint at a quarter, half and all of NIH (target: < 10 s, every planted link, none
    invented); then NIH-like 1024² PNGs fingerprinted against the decode floor."""
    rng = np.random.default_rng(args.seed)
    nih, children, truth = planted.planted_fingerprints(
        rng, args.nih, args.children, args.clusters, args.flip
    )
    linked = sum(v is not None for v in truth.values())
    start = time.perf_counter()
    links = match_to_parents(children, nih)
    elapsed = time.perf_counter() - start
    found = dict(zip(links["image_id"], links["parent_image_id"].astype(object), strict=True))
    recovered = sum(1 for k, v in truth.items() if v is not None and found[k] == v)
    invented = sum(1 for k, v in found.items() if not pd.isna(v) and truth[k] != v)
    sample = children.sample(n=min(args.sample, len(children)), random_state=args.seed)
    start, parent_words = time.perf_counter(), hashes_to_words(nih["perceptual_hash"])
    for row in hashes_to_words(sample["perceptual_hash"]):  # brute force: every NIH hash
        np.flatnonzero(hamming(parent_words, row[None, :]) <= PARENT_MATCH_RADIUS)
    brute = (time.perf_counter() - start) * len(children) / len(sample)
    peaks = []
    for share in (4, 2, 1):
        tracemalloc.start()
        match_to_parents(children, nih.iloc[: len(nih) // share])
        peaks.append(tracemalloc.get_traced_memory()[1] / (len(nih) // share))
        tracemalloc.stop()
    met = elapsed < 10 and invented == 0 and recovered == linked
    print(
        f"match_to_parents {elapsed:.2f} s, kinds {links['match'].value_counts().to_dict()}, "
        f"{recovered} / {linked} planted links, {invented} invented: target "
        f"{'met' if met else 'MISSED'}",
        flush=True,
    )
    images = args.images or 40
    fingerprint, read, decode = fingerprinting(images, args.seed)
    rows = [
        [
            f"{len(children):,} ChestX-Det against {len(nih):,} NIH fingerprints",
            f"{elapsed:.2f} s, {recovered:,} of {linked:,} planted links, {invented} invented",
            "< 10 s, all, none",
        ],
        ["brute force, extrapolated", f"{brute:.1f} s ({brute / elapsed:.1f}×)", ""],
        [
            "peak traced memory per NIH fingerprint (N/4, N/2, N)",
            " / ".join(f"{peak:.0f} B" for peak in peaks),
            "constant",
        ],
        [
            f"fingerprinting {images} 1024² PNGs, one process",
            f"{fingerprint * 1e3:.1f} ms "
            f"per image, {fingerprint / decode:.2f}× the decode floor (bare read {read * 1e3:.2f} "
            f"ms)",
            "",
        ],
        [
            f"projected for {NIH_IMAGES:,} NIH images",
            f"{NIH_IMAGES * fingerprint / 60:.0f} min in one process, once (re-used per image)",
            "",
        ],
    ]
    figures = {
        "match_seconds": elapsed,
        "recovered": recovered,
        "invented": invented,
        "brute_force_seconds": brute,
        "peak_bytes_per_fingerprint": peaks,
        "fingerprint_seconds": fingerprint,
        "decode_floor": decode,
        "read": read,
    }
    title = "NIH parent links and fingerprints"
    return Table(
        "parents", title, ["figure", "value", "target"], rows, figures, "", "--section parents"
    )


def fingerprinting(images: int, seed: int) -> tuple[float, float, float]:
    """Seconds per image of fingerprinting NIH-like 1024² PNGs in one process, of reading
    them and of the fastest decode-only (OpenCV or Pillow), from a warm page cache."""
    from radharmony_pipeline.synthetic.encoding import png_bytes
    from radharmony_pipeline.synthetic.radiograph import render_radiograph, to_uint8

    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        (root / "images").mkdir()
        for number in range(images):
            rng = np.random.default_rng([seed, number])
            pixels = to_uint8(render_radiograph(rng, 1024, 1024).pixels)
            (root / "images" / f"{number:08d}_000.png").write_bytes(png_bytes(pixels))
        jobs = parent_image_jobs(root, tree_states(root, (".png",)), 224, "letterbox")
        files = [job.source_file for job in jobs]
        per_item(Path.read_bytes, files)  # warms the page cache: every method reads memory
        read = per_item(Path.read_bytes, files)
        opencv = per_item(
            lambda p: cv2.imdecode(np.frombuffer(p.read_bytes(), np.uint8), cv2.IMREAD_GRAYSCALE),
            files,
        )
        pillow = per_item(lambda p: np.asarray(Image.open(p).convert("L")), files)
        start = time.perf_counter()
        if any(fingerprint_parent_image(job)["status"] != "ok" for job in jobs):
            raise SystemExit("a parent image did not fingerprint")
        return (time.perf_counter() - start) / len(jobs), read, min(opencv, pillow)


SECTIONS = {
    "search": search_section,
    "hashes": lambda args: hashes_section(args.images or 70, args.smoke),
    "films": lambda args: films_section(args.films, args.closest, args.film_side),
    "parents": parents_section,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--section", choices=SECTIONS, help="default search; --smoke: all")
    parser.add_argument("--count", type=int, default=278_000, help="search: look-alike hashes")
    parser.add_argument("--planted", type=int, default=240, help="search: planted copies")
    parser.add_argument("--hash-side", type=int, default=64)
    parser.add_argument("--film-side", type=int, default=190)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--cache", type=Path, default=Path.home() / ".cache/radharmony/bench_duplicates"
    )
    parser.add_argument("--work", type=Path, default=Path("/tmp/bench_duplicates"))
    parser.add_argument("--faiss-at", type=int, default=0)
    parser.add_argument("--skip-baseline", action="store_true")
    parser.add_argument("--images", type=int, help="hashes: radiographs (70); parents: PNGs (40)")
    parser.add_argument("--films", type=int, default=40, help="films: originals")
    parser.add_argument("--closest", type=int, default=40, help="films: pairs of different films")
    parser.add_argument("--nih", type=int, default=NIH_IMAGES)
    parser.add_argument("--children", type=int, default=3_578)
    parser.add_argument("--clusters", type=int, default=3_000)
    parser.add_argument("--flip", type=float, default=0.15)
    parser.add_argument("--sample", type=int, default=200)
    add_options(parser)
    args = parser.parse_args()
    sections = [args.section] if args.section else list(SECTIONS) if args.smoke else ["search"]
    with tempfile.TemporaryDirectory(prefix="bench-duplicates-") as folder:
        if args.smoke:  # tiny, and nothing kept: cache and packed files in a temporary folder
            args.count, args.planted, args.faiss_at = 320, 8, 0
            args.cache, args.work = Path(folder) / "cache", Path(folder) / "work"
            args.films, args.closest, args.images = 3, 2, 2
            args.nih, args.children, args.clusters, args.sample = 2000, 120, 100, 20
        for section in sections:
            write_table(args, SECTIONS[section](args))


if __name__ == "__main__":
    main()
