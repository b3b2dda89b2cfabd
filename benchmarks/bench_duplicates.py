"""Benchmark: grouping 300,000 perceptual hashes into near-duplicate groups.

Generates 256-bit fingerprints the way a corpus of radiographs spreads them: clusters of
similar-looking images (each bit of a cluster member differs from its centre with
probability `--flip`, far beyond the search radius, so clusters share block values more often
than random hashes do), planted near pairs (1 to radius bits apart), and one group of 5,000
identical hashes (a broken download). Then, in the same run:

- multi-index hashing (`group_fingerprints`) on all of them, checking every planted pair and
  the identical group land in one group and nothing else is grouped;
- brute force (every pair compared) on a random sample, whose time is extrapolated
  quadratically to the whole input, and the two groupings compared on that sample;
- peak traced memory of the grouping at a quarter, half and all of the input (linear means
  a constant number of bytes per fingerprint).

Target: the whole 300,000 in under 30 s on 2 cores, every planted pair grouped.

    .venv/bin/python benchmarks/bench_duplicates.py [--count 300000] [--sample 4000] [--seed 0]
"""

from __future__ import annotations

import argparse
import time
import tracemalloc

import numpy as np

from radharmony_pipeline.processing.imaging.perceptual_hash import (
    DEFAULT_RADIUS,
    brute_force_groups,
    group_fingerprints,
)

WORDS = 4  # 256 bits


def clustered_fingerprints(
    rng: np.random.Generator,
    count: int,
    clusters: int,
    flip: float,
    near_pairs: int,
    identical: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(fingerprints, planted pair indexes (p, 2), indexes of the identical group)."""
    background = count - 2 * near_pairs - identical
    centres = rng.integers(0, 2**64, size=(clusters, WORDS), dtype=np.uint64)
    members = centres[rng.integers(0, clusters, size=background)]
    members ^= _bits_with_probability(rng, background, flip)
    originals = centres[rng.integers(0, clusters, size=near_pairs)]
    originals ^= _bits_with_probability(rng, near_pairs, flip)
    copies = originals ^ _exactly_k_bits(rng, rng.integers(1, DEFAULT_RADIUS + 1, near_pairs))
    same = np.repeat(rng.integers(0, 2**64, size=(1, WORDS), dtype=np.uint64), identical, axis=0)
    words = np.concatenate([members, originals, copies, same])
    order = rng.permutation(len(words))
    position = np.empty_like(order)
    position[order] = np.arange(len(order))
    pairs = np.column_stack(
        [
            position[background : background + near_pairs],
            position[background + near_pairs :][:near_pairs],
        ]
    )
    group = position[background + 2 * near_pairs :]
    return words[order], pairs, group


def _bits_with_probability(rng: np.random.Generator, rows: int, p: float) -> np.ndarray:
    bits = rng.random((rows, WORDS * 64)) < p
    return np.packbits(bits, axis=1).view(">u8").astype(np.uint64)


def _exactly_k_bits(rng: np.random.Generator, ks: np.ndarray) -> np.ndarray:
    bits = np.zeros((len(ks), WORDS * 64), dtype=bool)
    for row, k in enumerate(ks):
        bits[row, rng.choice(WORDS * 64, size=k, replace=False)] = True
    return np.packbits(bits, axis=1).view(">u8").astype(np.uint64)


def peak_bytes(words: np.ndarray) -> int:
    tracemalloc.start()
    group_fingerprints(words)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=300_000)
    parser.add_argument("--clusters", type=int, default=3_000)
    parser.add_argument("--flip", type=float, default=0.15)
    parser.add_argument("--near-pairs", type=int, default=10_000)
    parser.add_argument("--identical", type=int, default=5_000)
    parser.add_argument("--sample", type=int, default=4_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    words, pairs, identical = clustered_fingerprints(
        rng, args.count, args.clusters, args.flip, args.near_pairs, args.identical
    )
    print(
        f"{len(words):,} fingerprints: {args.clusters:,} clusters (flip {args.flip}), "
        f"{len(pairs):,} planted near pairs, one group of {len(identical):,} identical; "
        f"radius {DEFAULT_RADIUS} bits"
    )

    start = time.perf_counter()
    grouping = group_fingerprints(words)
    elapsed = time.perf_counter() - start
    group = grouping.group
    grouped_pairs = int(
        ((group[pairs[:, 0]] >= 0) & (group[pairs[:, 0]] == group[pairs[:, 1]])).sum()
    )
    identical_together = len(set(group[identical].tolist())) == 1 and group[identical[0]] >= 0
    planted = set(pairs.ravel().tolist()) | set(identical.tolist())
    extra = int(sum(1 for i in np.flatnonzero(group >= 0) if i not in planted))
    print(
        f"multi-index hashing: {elapsed:.2f} s for all; {grouping.candidate_pairs:,} candidate "
        f"pairs compared ({grouping.candidate_pairs / len(words):.1f} per fingerprint), "
        f"{grouping.edges:,} within radius (a pair counts once per block it shares)"
    )
    print(
        f"  planted pairs grouped: {grouped_pairs:,} / {len(pairs):,}; identical group in one "
        f"group: {identical_together}; other fingerprints grouped: {extra:,}"
    )

    sample = rng.choice(len(words), size=min(args.sample, len(words)), replace=False)
    start = time.perf_counter()
    slow = brute_force_groups(words[sample])
    brute = time.perf_counter() - start
    fast_sample = group_fingerprints(words[sample]).group
    same = bool(
        ((slow >= 0) == (fast_sample >= 0)).all()
        and ((slow[:, None] == slow[None, :]) == (fast_sample[:, None] == fast_sample[None, :]))[
            slow >= 0
        ][:, slow >= 0].all()
    )
    projected = brute * (len(words) / len(sample)) ** 2
    print(
        f"brute force on a sample of {len(sample):,}: {brute:.2f} s, same groups as multi-index "
        f"hashing: {same}; projected to {len(words):,}: {projected:,.0f} s "
        f"({projected / elapsed:,.0f}x the multi-index time)"
    )

    for share in (4, 2, 1):
        part = words[: len(words) // share]
        peak = peak_bytes(part)
        print(
            f"peak traced memory for {len(part):,}: {peak / 2**20:.1f} MiB "
            f"({peak / len(part):.0f} bytes per fingerprint)"
        )
    target = (
        "met" if elapsed < 30 and grouped_pairs == len(pairs) and identical_together else "MISSED"
    )
    print(f"target (< 30 s, every planted pair grouped): {target}")


if __name__ == "__main__":
    main()
