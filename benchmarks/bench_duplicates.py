"""Benchmark: `near_duplicates` on look-alike radiographs at the corpus's size, and beyond.

The hashes are the project's renderer's (`synthetic/look_alikes.py`: distinct frontal and
lateral films, `--hash-side` pixels, dHash as the `images` stage computes it), cached under
`--cache` (rendering 278,000 takes 10–40 minutes on 2 cores). Planted copies of every kind
in `COPY_KINDS` are added: originals and copies rendered at `--film-side` and resized to 224
as the stage does, their hashes from those pixels. For N/4, N/2 and N it prints:

- the exact search (`close_pairs` over the distinct hashes): time and hash pairs compared;
- the whole step's computation (`near_duplicate_members`: search, candidates, confirmation on
  pixels read row by row from a packed array written like the stage's), time, candidates,
  confirmed / rejected, groups found, planted copies found and groups that are not a plant;
- a projection of the search to 1,000,000 hashes from a power law fitted to N/2 and N;
- the old search (16 blocks of 16 bits, exact block matches) at N/4 as the baseline, with its
  candidate count, and the ratio of the two in the same run;
- with `--faiss-at M`: faiss-cpu's IndexBinaryMultiHash (8 × 32 bits, one flip) and
  IndexBinaryFlat range search on the first M hashes, against `close_pairs` on the same.

Targets (issue 30): the step ≤ 60 s at N, the projection ≤ 10 min, every planted copy found,
no group that is not a plant.

    .venv/bin/python benchmarks/bench_duplicates.py [--count 278000] [--planted 240]
        [--cache ~/.cache/radharmony/bench_duplicates] [--faiss-at 0] [--skip-baseline]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd
from common import add_smoke

from radharmony_pipeline.processing.corpus import duplicates
from radharmony_pipeline.processing.corpus.duplicates import (
    PackedContents,
    near_duplicate_members,
)
from radharmony_pipeline.processing.imaging.perceptual_hash import (
    DEFAULT_RADIUS,
    close_pairs,
    hamming,
    hashes_to_words,
    perceptual_hash,
)
from radharmony_pipeline.processing.storage.output_layout import packed_images
from radharmony_pipeline.synthetic.look_alikes import (
    COPY_KINDS,
    look_alike_radiograph,
    resized_like_images_stage,
)

SIZE = 224
PARTITION = "rexgradient.train"
CHUNK = 50_000
PROJECTED = 1_000_000


def _hash_chunk(seed: int, side: int, start: int, stop: int) -> np.ndarray:
    hashes = [perceptual_hash(look_alike_radiograph(seed, i, side)) for i in range(start, stop)]
    return hashes_to_words(hashes)


def look_alike_words(cache: Path, seed: int, side: int, count: int) -> np.ndarray:
    """Hashes of renders 0..count-1, from the cache or rendered on 2 processes."""
    cache.mkdir(parents=True, exist_ok=True)
    starts = range(0, count, CHUNK)
    files = {s: cache / f"h{side}_seed{seed}_{s}.npy" for s in starts}
    missing = [s for s in starts if not files[s].exists()]
    if missing:
        print(f"rendering {len(missing) * CHUNK:,} look-alike radiographs at {side} px …")
        with ProcessPoolExecutor(2) as pool:
            futures = {s: pool.submit(_hash_chunk, seed, side, s, s + CHUNK) for s in missing}
            for s, future in futures.items():
                np.save(files[s], future.result())
    return np.concatenate([np.load(files[s]) for s in starts])[:count]


def content_hash(pixels: np.ndarray) -> tuple[np.ndarray, str]:
    framed, content = resized_like_images_stage(pixels, SIZE)
    return framed, perceptual_hash(content)


def plant_copies(
    words: np.ndarray, planted: int, film_side: int, seed: int
) -> tuple[np.ndarray, list[tuple[int, int, str]], dict[int, np.ndarray]]:
    """Copies appended after the look-alikes, their originals' hashes taken from the same
    pixels: (words, [(original, copy, kind)], framed pixels of every planted row)."""
    rng = np.random.default_rng(seed)
    originals = rng.choice(len(words), size=planted, replace=False)
    kinds = sorted(COPY_KINDS)
    words = words.copy()
    extra, truth, pixels = [], [], {}
    for k, original in enumerate(originals.tolist()):
        kind = kinds[k % len(kinds)]
        film = look_alike_radiograph(seed, original, film_side)
        pixels[original], words_hex = content_hash(film)
        words[original] = hashes_to_words([words_hex])[0]
        framed, copy_hex = content_hash(COPY_KINDS[kind](film))
        copy_row = len(words) + k
        pixels[copy_row] = framed
        extra.append(copy_hex)
        truth.append((original, copy_row, kind))
    return np.concatenate([words, hashes_to_words(extra)]), truth, pixels


def images_table(words: np.ndarray, rows: np.ndarray, film_side: int) -> pd.DataFrame:
    hexes = [w.astype(">u8").tobytes().hex() for w in words[rows]]
    return pd.DataFrame(
        {
            "image_id": [f"rexgradient/{r:07d}" for r in rows],
            "dataset": "rexgradient",
            "split": "train",
            "image_path": [f"images/{PARTITION}/{r:07d}.png" for r in rows],
            "perceptual_hash": hexes,
            "source_sha256": [f"source-{r}" for r in rows],
            "pixels_sha256": [f"pixels-{r}" for r in rows],
            "tensor_index": rows,
            "resize": "letterbox",
            "orig_height": film_side,
            "orig_width": film_side,
            "size": SIZE,
        }
    )


def write_packed(
    root: Path, total: int, needed: set[int], pixels: dict[int, np.ndarray], args
) -> None:
    """A packed array of `total` rows (sparse on disk) holding the rows the run reads."""
    path = root / packed_images(PARTITION)
    path.parent.mkdir(parents=True, exist_ok=True)
    array = np.lib.format.open_memmap(path, mode="w+", dtype=np.uint8, shape=(total, SIZE, SIZE))
    for row in sorted(needed):
        if row not in pixels:
            film = look_alike_radiograph(args.seed, row, args.film_side)
            pixels[row] = content_hash(film)[0]
        array[row] = pixels[row]
    array.flush()
    del array


def old_search(words: np.ndarray, radius: int) -> tuple[int, int]:
    """The search before issue 30: 16 blocks of 16 bits, pairs sharing a block value
    compared in NumPy (offset by offset in each run). Returns (candidates, pairs found)."""
    shifts = np.arange(0, 64, 16, dtype=np.uint64)
    blocks = ((words[:, :, None] >> shifts[None, None, :]) & np.uint64(0xFFFF)).reshape(
        len(words), -1
    )
    candidates, found = 0, set()
    for block in range(blocks.shape[1]):
        order = np.argsort(blocks[:, block], kind="stable")
        ordered = blocks[order, block]
        starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
        lengths = np.diff(np.r_[starts, len(ordered)])
        positions = np.flatnonzero(np.repeat(lengths > 1, lengths))
        run_end = np.repeat(starts + lengths, lengths)[positions]
        offset = 1
        while len(positions):
            keep = positions + offset < run_end
            positions, run_end = positions[keep], run_end[keep]
            for start in range(0, len(positions), 250_000):
                left = order[positions[start : start + 250_000]]
                right = order[positions[start : start + 250_000] + offset]
                candidates += len(left)
                close = hamming(words[left], words[right]) <= radius
                found.update(zip(left[close].tolist(), right[close].tolist(), strict=True))
            offset += 1
    return candidates, len({(min(a, b), max(a, b)) for a, b in found})


def faiss_comparison(words: np.ndarray, radius: int) -> None:
    try:
        import faiss
    except ImportError:
        print("faiss-cpu is not installed: `.venv/bin/pip install 'faiss-cpu>=1.15,<1.16'`")
        return
    codes = np.ascontiguousarray(words.astype(">u8").view(np.uint8))
    start = time.perf_counter()
    ours = close_pairs(words, radius)
    ours_time = time.perf_counter() - start
    start = time.perf_counter()
    index = faiss.IndexBinaryMultiHash(256, 8, 32)
    index.nflip = 1
    index.add(codes)
    limits, _, found = index.range_search(codes, radius + 1)
    multi_time = time.perf_counter() - start
    query = np.repeat(np.arange(len(words)), np.diff(limits).astype(np.int64))
    multi_pairs = int((query < found).sum())
    start = time.perf_counter()
    flat = faiss.IndexBinaryFlat(256)
    flat.add(codes)
    limits, _, found = flat.range_search(codes, radius + 1)
    flat_time = time.perf_counter() - start
    query = np.repeat(np.arange(len(words)), np.diff(limits).astype(np.int64))
    flat_pairs = int((query < found).sum())
    print(
        f"faiss on {len(words):,} hashes ({faiss.omp_get_max_threads()} threads): "
        f"IndexBinaryMultiHash 8x32 nflip 1: {multi_time:.1f} s ({multi_pairs} pairs); "
        f"IndexBinaryFlat range_search: {flat_time:.1f} s ({flat_pairs} pairs); "
        f"close_pairs: {ours_time:.1f} s ({len(ours)} pairs) — "
        f"{multi_time / ours_time:.1f}x and {flat_time / ours_time:.1f}x its time"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=278_000)
    parser.add_argument("--planted", type=int, default=240)
    parser.add_argument("--hash-side", type=int, default=64)
    parser.add_argument("--film-side", type=int, default=190)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--cache", type=Path, default=Path.home() / ".cache/radharmony/bench_duplicates"
    )
    parser.add_argument("--work", type=Path, default=Path("/tmp/bench_duplicates"))
    parser.add_argument("--faiss-at", type=int, default=0)
    parser.add_argument("--skip-baseline", action="store_true")
    add_smoke(parser)
    args = parser.parse_args()
    if args.smoke:  # nothing kept: cache and packed files in a temporary folder
        with tempfile.TemporaryDirectory(prefix="bench-duplicates-") as folder:
            global CHUNK
            CHUNK = 400  # renders per cached file
            args.count, args.planted, args.faiss_at = 800, 8, 0
            args.cache, args.work = Path(folder) / "cache", Path(folder) / "work"
            run(args)
        return
    run(args)


def run(args: argparse.Namespace) -> None:

    looks = look_alike_words(args.cache, args.seed, args.hash_side, args.count)
    words, truth, pixels = plant_copies(looks, args.planted, args.film_side, args.seed)
    print(
        f"{args.count:,} look-alike hashes ({args.hash_side} px renders) + {len(truth)} planted "
        f"copies ({len(COPY_KINDS)} kinds, {args.film_side} px films resized to {SIZE}); "
        f"radius {DEFAULT_RADIUS}"
    )
    if args.faiss_at:
        faiss_comparison(np.unique(looks[: args.faiss_at], axis=0), DEFAULT_RADIUS)
    measured = []
    for share in (4, 2, 1):
        count = args.count // share
        plants = [t for t in truth if t[0] < count]
        rows = np.r_[np.arange(count), [copy for _, copy, _ in plants]].astype(np.int64)
        distinct = np.unique(words[rows], axis=0)
        start = time.perf_counter()
        pairs = close_pairs(distinct)
        search = time.perf_counter() - start
        table = images_table(words, rows, args.film_side)
        needed = _rows_in_pairs(words, rows, distinct, pairs)
        write_packed(args.work, len(words), needed, pixels, args)
        inner: list[float] = []
        duplicates.close_pairs = _timed_search(inner)  # times the step's own search
        start = time.perf_counter()
        result = near_duplicate_members(table, PackedContents(args.work))
        step = time.perf_counter() - start
        duplicates.close_pairs = close_pairs
        rest = step - sum(inner)
        groups = result.members.groupby("group_id")["image_id"].apply(frozenset)
        planted = {frozenset(_ids(t)) for t in plants}
        visible = {frozenset(_ids(t)) for t in plants if _bits(words, t) <= DEFAULT_RADIUS}
        found = sum(1 for p in planted if any(p <= g for g in groups))
        found_visible = sum(1 for p in visible if any(p <= g for g in groups))
        false_groups = sum(1 for g in groups if g not in planted)
        measured.append((len(distinct), search, pairs.compared))
        print(
            f"N/{share} = {len(rows):,} images: search {search:.1f} s, {pairs.compared:,} hash "
            f"pairs compared ({pairs.compared / len(distinct):.0f} per hash), {len(pairs)} "
            f"within {DEFAULT_RADIUS} bits | whole step {step:.1f} s (its search {sum(inner):.1f}"
            f" s, the rest: candidates, pixels, confirmation, table {rest:.1f} s): "
            f"{result.candidates} candidates, "
            f"{result.confirmed} confirmed, {result.rejected} rejected | planted copies found "
            f"{found} / {len(planted)} ({found_visible} / {len(visible)} of those whose hashes "
            f"are within the radius), groups that are not a plant: {false_groups}",
            flush=True,
        )
        if share == 4 and not args.skip_baseline:
            start = time.perf_counter()
            candidates, within = old_search(distinct, DEFAULT_RADIUS)
            old = time.perf_counter() - start
            print(
                f"  baseline (16 x 16-bit blocks, before issue 30) on the same {len(distinct):,}"
                f": {old:.1f} s, {candidates:,} candidates, {within} within {DEFAULT_RADIUS} "
                f"bits: {old / search:.1f}x the search's time, {candidates / pairs.compared:.1f}x "
                "its comparisons",
                flush=True,
            )
    sizes = np.array([m[0] for m in measured], dtype=np.float64)
    times = np.array([m[1] for m in measured])
    compared = np.array([m[2] for m in measured], dtype=np.float64)
    # Comparisons grow as a power of n (fitted through the three sizes). The time has a part
    # per hash (sorting, probing) and a part per comparison; at these sizes the first
    # dominates, so the time at 1,000,000 lies between N's time scaled by the hashes (all of
    # it per hash) and by the comparisons (all of it per comparison: the upper bound stated).
    exponent, offset = np.polyfit(np.log(sizes), np.log(compared), 1)
    projected_compared = float(np.exp(offset) * PROJECTED**exponent)
    by_hashes = times[2] * PROJECTED / sizes[2]
    by_comparisons = times[2] * projected_compared / compared[2]
    print(
        f"projection to {PROJECTED:,} hashes: comparisons ~ n^{exponent:.2f} (least squares "
        f"through N/4, N/2, N) -> {projected_compared:.2e}; search time between "
        f"{by_hashes:.0f} s (N's time per hash) and {by_comparisons:.0f} s = "
        f"{by_comparisons / 60:.1f} min (N's time per comparison: the upper bound)"
    )


def _timed_search(inner: list[float]):
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


def _rows_in_pairs(words: np.ndarray, rows: np.ndarray, distinct: np.ndarray, pairs) -> set[int]:
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


if __name__ == "__main__":
    main()
