"""Perceptual hashes of resized images, and the grouping of a whole corpus of them into
connected components within a radius, without comparing every pair.

The fingerprint is imagehash's difference hash (dHash) with 256 bits, taken over the content
of the resized image (the letterbox padding cut off); docs/design-notes.md has the measurements
that chose it over pHash and 64-bit hashes.
Grouping uses multi-index hashing: the 256 bits are cut into `BLOCKS` blocks of 16 bits, and
two hashes within `radius` ≤ `BLOCKS − 1` bits of each other agree exactly on at least one
block (pigeonhole), so only hashes that share a block value are ever compared. Equal hashes
are collapsed first, so a group of n identical images costs O(n), not n² comparisons.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pandas as pd
from PIL import Image

HASH_SIZE = 16  # 16×16 horizontal gradient signs: 256 bits
HASH_BITS = HASH_SIZE * HASH_SIZE
HASH_HEX_LENGTH = HASH_BITS // 4
BLOCK_BITS = 16
BLOCKS = HASH_BITS // BLOCK_BITS
# Tuned on planted copies vs distinct radiographs (docs/design-notes.md, "Near duplicates").
DEFAULT_RADIUS = 15
# Candidate pairs are checked this many at a time, so memory stays bounded for large buckets.
_CANDIDATE_CHUNK = 250_000


def perceptual_hash(content: np.ndarray) -> str:
    """Hex dHash (256 bits) of a uint8 grayscale image (pass the content, not the padding):
    the digits of str(imagehash.dhash(image, HASH_SIZE)), computed as imagehash does (a
    Lanczos resize to HASH_SIZE + 1 columns, then whether each pixel is brighter than its
    left neighbour) without its mode conversion, copies and bit-by-bit string building."""
    small = Image.fromarray(content).resize((HASH_SIZE + 1, HASH_SIZE), Image.Resampling.LANCZOS)
    pixels = np.asarray(small)
    return np.packbits(pixels[:, 1:] > pixels[:, :-1], axis=None).tobytes().hex()


def pixels_sha256(pixels: np.ndarray) -> str:
    """Digest of the resized pixels: equal for the same picture stored in two formats."""
    return hashlib.sha256(np.ascontiguousarray(pixels).tobytes()).hexdigest()


def hashes_to_words(hex_hashes: pd.Series | list[str]) -> np.ndarray:
    """(n, 4) uint64 words of 256-bit hex hashes (the form the search works on)."""
    strings = list(hex_hashes)
    bad = [h for h in strings if not isinstance(h, str) or len(h) != HASH_HEX_LENGTH]
    if bad:
        raise ValueError(
            f"perceptual hashes must be {HASH_HEX_LENGTH} hex digits; got {bad[0]!r} "
            f"(rematerialize `images` to compute them)"
        )
    raw = bytes.fromhex("".join(strings))
    return np.frombuffer(raw, dtype=">u8").astype(np.uint64).reshape(len(strings), HASH_BITS // 64)


def hamming(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Bit distance between rows of two (n, words) uint64 arrays."""
    return np.bitwise_count(np.bitwise_xor(a, b)).sum(axis=1, dtype=np.int64)


@dataclass(frozen=True)
class Grouping:
    """`group[i]` is the component of hash i (−1 when alone); `edges` found within radius."""

    group: np.ndarray
    candidate_pairs: int
    edges: int


def group_fingerprints(words: np.ndarray, radius: int = DEFAULT_RADIUS) -> Grouping:
    """Connected components of hashes within `radius` bits, by multi-index hashing.

    Linear in the input plus the number of hash pairs sharing a 16-bit block (the candidates),
    which for well-spread hashes is a small multiple of n.
    """
    if not 0 <= radius < BLOCKS:
        raise ValueError(f"radius must be in 0..{BLOCKS - 1} for {BLOCKS} blocks, got {radius}")
    n = len(words)
    if n == 0:
        return Grouping(np.empty(0, dtype=np.int64), 0, 0)
    unique, inverse = np.unique(words, axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)
    blocks = block_values(unique)
    sources, targets, candidates = [], [], 0
    for block in range(BLOCKS):
        for left, right in _shared_block_pairs(blocks[:, block]):
            candidates += len(left)
            close = hamming(unique[left], unique[right]) <= radius
            sources.append(left[close])
            targets.append(right[close])
    u = len(unique)
    left = np.concatenate([*sources, np.arange(u)]) if sources else np.arange(u)
    right = np.concatenate([*targets, np.arange(u)]) if targets else np.arange(u)
    unique_component = _components(left, right, u)
    component = unique_component[inverse]
    sizes = np.bincount(component)
    group = np.where(sizes[component] > 1, component, -1)
    return Grouping(group.astype(np.int64), candidates, int(sum(len(s) for s in sources)))


def block_values(words: np.ndarray) -> np.ndarray:
    """(u, BLOCKS) uint16: each 64-bit word is four 16-bit blocks."""
    shifts = np.arange(0, 64, BLOCK_BITS, dtype=np.uint64)
    parts = (words[:, :, None] >> shifts[None, None, :]) & np.uint64(0xFFFF)
    return parts.reshape(len(words), -1).astype(np.uint16)


def _shared_block_pairs(values: np.ndarray) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Index pairs (i < j in sorted order) of equal `values`, in bounded chunks.

    Sorting puts equal values in runs; pairs at distance d inside a run are produced for
    d = 1, 2, … over only the elements whose run is still longer than d, so the work is the
    number of pairs, never n × longest run.
    """
    order = np.argsort(values, kind="stable")
    ordered = values[order]
    starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
    lengths = np.diff(np.r_[starts, len(ordered)])
    in_runs = np.repeat(lengths > 1, lengths)
    positions = np.flatnonzero(in_runs)
    if len(positions) == 0:
        return
    run_end = np.repeat(starts + lengths, lengths)[positions]
    offset = 1
    pending_left: list[np.ndarray] = []
    pending_right: list[np.ndarray] = []
    pending = 0
    while len(positions):
        keep = positions + offset < run_end
        positions, run_end = positions[keep], run_end[keep]
        pending_left.append(order[positions])
        pending_right.append(order[positions + offset])
        pending += len(positions)
        if pending >= _CANDIDATE_CHUNK:
            yield np.concatenate(pending_left), np.concatenate(pending_right)
            pending_left, pending_right, pending = [], [], 0
        offset += 1
    if pending:
        yield np.concatenate(pending_left), np.concatenate(pending_right)


def brute_force_groups(words: np.ndarray, radius: int = DEFAULT_RADIUS) -> np.ndarray:
    """Components by comparing every pair (the baseline; quadratic, for samples only)."""
    n = len(words)
    left, right = [], []
    for i in range(n - 1):
        close = np.flatnonzero(hamming(words[i + 1 :], words[i][None, :]) <= radius) + i + 1
        left.append(np.full(len(close), i))
        right.append(close)
    rows = np.concatenate([*left, np.arange(n)])
    cols = np.concatenate([*right, np.arange(n)])
    component = _components(rows, cols, n)
    sizes = np.bincount(component)
    return np.where(sizes[component] > 1, component, -1)


def _components(left: np.ndarray, right: np.ndarray, count: int) -> np.ndarray:
    """Connected-component label of each of `count` nodes joined by the edges left-right."""
    # Imported here: scipy.sparse is ~4 % of loading the definitions (-X importtime), which
    # every process would otherwise pay; only the grouping of a whole corpus needs it.
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    graph = coo_matrix((np.ones(len(left), dtype=np.int8), (left, right)), shape=(count, count))
    return connected_components(graph, directed=False)[1]
