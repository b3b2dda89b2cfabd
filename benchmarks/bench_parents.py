"""Benchmark: matching ChestX-Det's 3,578 images against NIH ChestX-ray14's 112,120, and the
rate of fingerprinting NIH images against the PNG decode floor.

Matching: NIH fingerprints are generated the way radiographs spread them (clusters of
similar-looking films: each bit of a member differs from its cluster centre with probability
`--flip`); ChestX-Det fingerprints are planted among them: some the same file, some the same
pixels in another file, some re-encoded (1 to 7 bits of perceptual hash away), the rest absent
from NIH (fresh cluster members). In the same run:

- `match_to_parents` on all of them, checking every planted link is found and none invented;
- brute force (every child against every NIH hash) on a sample of children, extrapolated
  linearly to all of them;
- peak traced memory of the matching at a quarter, half and all of NIH (linear: a constant
  number of bytes per NIH fingerprint).

Fingerprinting: `--images` synthetic 1024×1024 radiograph PNGs (the NIH format) are
fingerprinted one after another in this process (decode, resize to 224, SHA-256s, dHash),
against the floor: the bytes read, and the fastest decode-only of OpenCV and Pillow.

Target: matching under 10 s on 2 cores with every planted link found and none invented.

    .venv/bin/python benchmarks/bench_parents.py [--nih 112120] [--children 3578] [--images 40]
"""

from __future__ import annotations

import argparse
import tempfile
import time
import tracemalloc
from pathlib import Path

import cv2
import numpy as np
import pandas as pd
from common import add_smoke
from PIL import Image

from radharmony_pipeline.processing.corpus.parent_fingerprints import (
    fingerprint_parent_image,
    parent_image_jobs,
)
from radharmony_pipeline.processing.corpus.parents import PARENT_MATCH_RADIUS, match_to_parents
from radharmony_pipeline.processing.imaging.perceptual_hash import hamming
from radharmony_pipeline.processing.storage.source_store import tree_states
from radharmony_pipeline.synthetic.encoding import png_bytes
from radharmony_pipeline.synthetic.radiograph import render_radiograph, to_uint8

WORDS = 4


def _flips(rng: np.random.Generator, rows: int, p: float) -> np.ndarray:
    bits = rng.random((rows, WORDS * 64)) < p
    return np.packbits(bits, axis=1).view(">u8").astype(np.uint64)


def _k_flips(rng: np.random.Generator, ks: np.ndarray) -> np.ndarray:
    bits = np.zeros((len(ks), WORDS * 64), dtype=bool)
    for row, k in enumerate(ks):
        bits[row, rng.choice(WORDS * 64, size=k, replace=False)] = True
    return np.packbits(bits, axis=1).view(">u8").astype(np.uint64)


def _hex(words: np.ndarray) -> list[str]:
    raw = words.astype(">u8").tobytes()
    step = WORDS * 8
    return [raw[i : i + step].hex() for i in range(0, len(raw), step)]


def _digests(rng: np.random.Generator, count: int) -> list[str]:
    return [bytes(row).hex() for row in rng.integers(0, 256, size=(count, 32), dtype=np.uint8)]


def planted_fingerprints(
    rng: np.random.Generator, nih: int, children: int, clusters: int, flip: float
) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, str | None]]:
    """(NIH fingerprints, ChestX-Det fingerprints, planted link of every child)."""
    centres = rng.integers(0, 2**64, size=(clusters, WORDS), dtype=np.uint64)
    words = centres[rng.integers(0, clusters, size=nih)] ^ _flips(rng, nih, flip)
    parents = pd.DataFrame(
        {
            "parent_image_id": [f"{i // 10:08d}_{i % 10:03d}.png" for i in range(nih)],
            "source_sha256": _digests(rng, nih),
            "pixels_sha256": _digests(rng, nih),
            "perceptual_hash": _hex(words),
        }
    )
    absent = children // 100 + 1
    linked = rng.choice(nih, size=children - absent, replace=False)
    kind = rng.choice(3, size=len(linked), p=[0.85, 0.05, 0.10])
    child_words = words[linked].copy()
    near = kind == 2
    child_words[near] ^= _k_flips(rng, rng.integers(1, 8, size=int(near.sum())))
    fresh = centres[rng.integers(0, clusters, size=absent)] ^ _flips(rng, absent, flip)
    source = np.where(kind == 0, parents["source_sha256"].to_numpy()[linked], None)
    pixels = np.where(kind <= 1, parents["pixels_sha256"].to_numpy()[linked], None)
    ids = [f"chestx_det/{i}" for i in range(children)]
    frame = pd.DataFrame(
        {
            "image_id": ids,
            "source_sha256": [
                *(s or d for s, d in zip(source, _digests(rng, len(linked)), strict=True)),
                *_digests(rng, absent),
            ],
            "pixels_sha256": [
                *(p or d for p, d in zip(pixels, _digests(rng, len(linked)), strict=True)),
                *_digests(rng, absent),
            ],
            "perceptual_hash": _hex(np.concatenate([child_words, fresh])),
        }
    )
    truth = dict(
        zip(
            ids,
            [*parents["parent_image_id"].to_numpy()[linked].tolist(), *[None] * absent],
            strict=True,
        )
    )
    return parents, frame, truth


def peak_bytes(children: pd.DataFrame, parents: pd.DataFrame) -> int:
    tracemalloc.start()
    match_to_parents(children, parents)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak


def brute_force_seconds(children: pd.DataFrame, parents: pd.DataFrame) -> float:
    """Every child hash against every parent hash (the baseline)."""
    from radharmony_pipeline.processing.imaging.perceptual_hash import hashes_to_words

    start = time.perf_counter()
    parent_words = hashes_to_words(parents["perceptual_hash"])
    for row in hashes_to_words(children["perceptual_hash"]):
        np.flatnonzero(hamming(parent_words, row[None, :]) <= PARENT_MATCH_RADIUS)
    return time.perf_counter() - start


def matching(args: argparse.Namespace) -> None:
    rng = np.random.default_rng(args.seed)
    parents, children, truth = planted_fingerprints(
        rng, args.nih, args.children, args.clusters, args.flip
    )
    print(
        f"{len(parents):,} NIH fingerprints in {args.clusters:,} clusters (flip {args.flip}); "
        f"{len(children):,} ChestX-Det fingerprints, {sum(v is None for v in truth.values())} "
        f"absent from NIH; radius {PARENT_MATCH_RADIUS} bits"
    )
    start = time.perf_counter()
    links = match_to_parents(children, parents)
    elapsed = time.perf_counter() - start
    found = dict(zip(links["image_id"], links["parent_image_id"].astype(object), strict=True))
    recovered = sum(1 for k, v in truth.items() if v is not None and found[k] == v)
    invented = sum(1 for k, v in found.items() if not pd.isna(v) and truth[k] != v)
    print(
        f"match_to_parents: {elapsed:.2f} s; kinds {links['match'].value_counts().to_dict()}; "
        f"planted links recovered {recovered:,} / {sum(v is not None for v in truth.values()):,}, "
        f"invented {invented}"
    )
    sample = children.sample(n=min(args.sample, len(children)), random_state=args.seed)
    brute = brute_force_seconds(sample, parents) * len(children) / len(sample)
    print(
        f"brute force (every child against every NIH hash), extrapolated from {len(sample)} "
        f"children: {brute:.1f} s ({brute / elapsed:.1f}x the multi-index time)"
    )
    for share in (4, 2, 1):
        part = parents.iloc[: len(parents) // share]
        peak = peak_bytes(children, part)
        print(
            f"peak traced memory against {len(part):,} NIH fingerprints: {peak / 2**20:.1f} MiB "
            f"({peak / len(part):.0f} bytes per NIH fingerprint)"
        )
    target = (
        "met"
        if elapsed < 10
        and invented == 0
        and recovered == len(children) - sum(v is None for v in truth.values())
        else "MISSED"
    )
    print(f"target (< 10 s, every planted link, none invented): {target}")


def fingerprinting(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        for number in range(args.images):
            rng = np.random.default_rng([args.seed, number])
            pixels = to_uint8(render_radiograph(rng, 1024, 1024).pixels)
            path = root / "images" / f"{number:08d}_000.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(png_bytes(pixels))
        jobs = parent_image_jobs(root, tree_states(root, (".png",)), 224, "letterbox")
        files = [job.source_file for job in jobs]
        for path in files:  # warm the page cache so every method reads from memory
            path.read_bytes()
        read = _per_image(lambda p: p.read_bytes(), files)
        opencv = _per_image(
            lambda p: cv2.imdecode(np.frombuffer(p.read_bytes(), np.uint8), cv2.IMREAD_GRAYSCALE),
            files,
        )
        pillow = _per_image(lambda p: np.asarray(Image.open(p).convert("L")), files)
        start = time.perf_counter()
        rows = [fingerprint_parent_image(job) for job in jobs]
        full = (time.perf_counter() - start) / len(jobs)
    assert all(row["status"] == "ok" for row in rows)
    floor = min(opencv, pillow)
    print(
        f"fingerprinting {len(jobs)} 1024×1024 PNGs in one process: {full * 1e3:.1f} ms per "
        f"image ({1 / full:.0f} images/s); bare read {read * 1e3:.2f} ms, decode only: "
        f"OpenCV {opencv * 1e3:.1f} ms, Pillow {pillow * 1e3:.1f} ms; "
        f"{full / floor:.2f}x the decode floor"
    )
    print(
        f"projected for 112,120 NIH images: {112_120 * full / 60:.0f} min in one process "
        f"(per image re-use: once, not per run)"
    )


def _per_image(function, paths: list[Path]) -> float:
    start = time.perf_counter()
    for path in paths:
        function(path)
    return (time.perf_counter() - start) / len(paths)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nih", type=int, default=112_120)
    parser.add_argument("--children", type=int, default=3_578)
    parser.add_argument("--clusters", type=int, default=3_000)
    parser.add_argument("--flip", type=float, default=0.15)
    parser.add_argument("--sample", type=int, default=200)
    parser.add_argument("--images", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    add_smoke(parser)
    args = parser.parse_args()
    if args.smoke:
        args.nih, args.children, args.clusters, args.sample, args.images = 2000, 120, 100, 20, 4
    matching(args)
    fingerprinting(args)


if __name__ == "__main__":
    main()
