"""Perceptual hashes of resized images, and the exact search for every pair of a whole
corpus of them within a radius, without comparing every pair.

The fingerprint is imagehash's difference hash (dHash) with 256 bits, taken over the content
of the resized image (the letterbox padding cut off); docs/design-notes.md has the measurements
that chose it over pHash and 64-bit hashes. The search is multi-index hashing over 8 blocks of
32 bits (`close_pairs`); `BLOCKS` of 16 bits are the index of the parents' cross search
(processing/corpus/parents.py).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import pandas as pd
from PIL import Image

HASH_SIZE = 16  # 16×16 horizontal gradient signs: 256 bits
HASH_BITS = HASH_SIZE * HASH_SIZE
HASH_HEX_LENGTH = HASH_BITS // 4
WORDS = HASH_BITS // 64
BLOCK_BITS = 16
BLOCKS = HASH_BITS // BLOCK_BITS
# Tuned on planted copies vs distinct radiographs (docs/design-notes.md, "Near duplicates").
DEFAULT_RADIUS = 15
# Two hashes within 2 × SEARCH_BLOCKS − 1 bits are within one bit of each other in at least
# one of the blocks (pigeonhole): each value is looked up with its 32 one-bit neighbours.
SEARCH_BLOCKS = 8
SEARCH_BLOCK_BITS = HASH_BITS // SEARCH_BLOCKS
MAX_SEARCH_RADIUS = 2 * SEARCH_BLOCKS - 1
# Hashes turned into bits this many at a time (8 MiB of bits), so memory stays bounded.
_ROWS_AT_ONCE = 32_768


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


def block_values(words: np.ndarray) -> np.ndarray:
    """(u, BLOCKS) uint16: each 64-bit word is four 16-bit blocks."""
    shifts = np.arange(0, 64, BLOCK_BITS, dtype=np.uint64)
    parts = (words[:, :, None] >> shifts[None, None, :]) & np.uint64(0xFFFF)
    return parts.reshape(len(words), -1).astype(np.uint16)


@dataclass(frozen=True)
class HashPairs:
    """Pairs of rows whose hashes lie within a radius: `left[k] < right[k]`, `bits[k]` their
    distance; `compared` counts the hash comparisons the search made to find them."""

    left: np.ndarray
    right: np.ndarray
    bits: np.ndarray
    compared: int

    def __len__(self) -> int:
        return len(self.left)


def close_pairs(words: np.ndarray, radius: int = DEFAULT_RADIUS) -> HashPairs:
    """Every pair of rows of `words` ((n, 4) uint64, distinct hashes) within `radius` bits:
    the pairs comparing every pair finds, by multi-index hashing over `SEARCH_BLOCKS` blocks.

    The bits are dealt to the blocks by how evenly each splits `words` (radiographs share
    structure: in blocks of neighbouring bits, thousands of images share a value), so every
    block separates the hashes about as well as the others. Per block, a hash is compared
    with those of its own block value and, when `radius` ≥ `SEARCH_BLOCKS`, of each value one
    bit away; `compared` counts these comparisons.
    """
    if not 0 <= radius <= MAX_SEARCH_RADIUS:
        raise ValueError(
            f"radius must be in 0..{MAX_SEARCH_RADIUS} for {SEARCH_BLOCKS} blocks of "
            f"{SEARCH_BLOCK_BITS} bits, got {radius}"
        )
    n = len(words)
    found: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    compared = 0
    if n > 1:
        laid = _rearranged(words, _balanced_layout(words))
        for block in range(SEARCH_BLOCKS):
            compared += _search_block(laid, block, radius, found)
    if not found:
        empty = np.empty(0, dtype=np.int64)
        return HashPairs(empty, empty, empty, compared)
    first = np.concatenate([pair[0] for pair in found]).astype(np.int64)
    second = np.concatenate([pair[1] for pair in found]).astype(np.int64)
    bits = np.concatenate([pair[2] for pair in found]).astype(np.int64)
    left, right = np.minimum(first, second), np.maximum(first, second)
    # A pair close in several blocks was found once per block.
    _, once = np.unique(left * n + right, return_index=True)
    return HashPairs(left[once], right[once], bits[once], compared)


def _balanced_layout(words: np.ndarray) -> np.ndarray:
    """The 256 bit positions in block order: sorted by how evenly each bit splits the
    hashes, dealt back and forth over the blocks (0..7, 7..0, …)."""
    ones = np.zeros(HASH_BITS, dtype=np.int64)
    for start in range(0, len(words), _ROWS_AT_ONCE):
        ones += _bits(words[start : start + _ROWS_AT_ONCE]).sum(axis=0, dtype=np.int64)
    share = ones / len(words)
    order = np.argsort(-np.minimum(share, 1.0 - share), kind="stable")
    layout = np.empty((SEARCH_BLOCKS, SEARCH_BLOCK_BITS), dtype=np.int64)
    for rank, bit in enumerate(order):
        lap, place = divmod(rank, SEARCH_BLOCKS)
        layout[place if lap % 2 == 0 else SEARCH_BLOCKS - 1 - place, lap] = bit
    return layout.reshape(-1)


def _bits(words: np.ndarray) -> np.ndarray:
    """(rows, 256) uint8 bits of (rows, 4) uint64 words, most significant first."""
    return np.unpackbits(words.astype(">u8").view(np.uint8), axis=1)


def _rearranged(words: np.ndarray, layout: np.ndarray) -> np.ndarray:
    """`words` with bit i moved from position layout[i] (distances are unchanged): block b
    is then bits 32b..32b+31, the high or low half of word b // 2."""
    out = np.empty_like(words)
    for start in range(0, len(words), _ROWS_AT_ONCE):
        chosen = _bits(words[start : start + _ROWS_AT_ONCE])[:, layout]
        packed = np.ascontiguousarray(np.packbits(chosen, axis=1))
        out[start : start + len(packed)] = packed.view(">u8")
    return out


def _search_block(
    laid: np.ndarray, block: int, radius: int, found: list[tuple[np.ndarray, ...]]
) -> int:
    """Compare the hashes whose block `block` is equal or one bit apart; append the pairs
    within `radius` to `found` as (row, row, bits); return how many comparisons were made.

    Sorted by block value, each value's hashes are one run. A task is a hash and a run of
    partners: the rest of its own run, and the whole run of each value one bit above its
    own. Tasks are taken longest first, and the k-th partner of every task at least k + 1
    long is compared in one vectorized step, so the work is the comparisons plus one step
    per partner rank. The word without this block is compared first: most tasks end there.
    """
    word, half = divmod(block, 64 // SEARCH_BLOCK_BITS)
    shift = np.uint64(64 - SEARCH_BLOCK_BITS * (half + 1))
    values = ((laid[:, word] >> shift) & np.uint64(0xFFFFFFFF)).astype(np.uint32)
    order = np.argsort(values, kind="stable")
    ordered = values[order]
    starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
    lengths = np.diff(np.r_[starts, len(ordered)])
    position = np.arange(len(ordered))
    rows, partners, counts = [position], [position + 1], [np.repeat(starts + lengths, lengths)]
    counts[0] = counts[0] - position - 1
    if radius >= SEARCH_BLOCKS:  # pigeonhole then needs the one-bit neighbours
        distinct = ordered[starts]
        for bit in range(SEARCH_BLOCK_BITS):
            flag = np.uint32(1 << bit)
            lower = np.flatnonzero((distinct & flag) == 0)
            upper = np.minimum(np.searchsorted(distinct, distinct[lower] | flag), len(distinct) - 1)
            hit = distinct[upper] == (distinct[lower] | flag)
            lower, upper = lower[hit], upper[hit]
            size = lengths[lower]
            offsets = np.arange(int(size.sum())) - np.repeat(np.cumsum(size) - size, size)
            rows.append(np.repeat(starts[lower], size) + offsets)
            partners.append(np.repeat(starts[upper], size))
            counts.append(np.repeat(lengths[upper], size))
    count = np.concatenate(counts)
    longest_first = np.flatnonzero(count > 0)
    longest_first = longest_first[np.argsort(-count[longest_first], kind="stable")]
    row = np.concatenate(rows)[longest_first].astype(np.int32)
    partner = np.concatenate(partners)[longest_first].astype(np.int32)
    count = count[longest_first]
    sorted_words = laid[order]
    check = [w for w in range(WORDS) if w != word] + [word]
    first_word = np.ascontiguousarray(sorted_words[:, check[0]])
    row_first = first_word[row]
    compared = 0
    shorter = -count  # ascending: tasks with count > k come before -k
    for rank in range(int(count[0]) if len(count) else 0):
        active = int(np.searchsorted(shorter, -rank, side="left"))
        other = partner[:active] + rank
        bits = np.bitwise_count(first_word[other] ^ row_first[:active])
        close = np.flatnonzero(bits <= radius)
        compared += active
        if len(close) == 0:
            continue
        mine, theirs, total = row[close], other[close], bits[close].astype(np.int64)
        for w in check[1:]:
            column = sorted_words[:, w]
            total += np.bitwise_count(column[mine] ^ column[theirs])
            within = total <= radius
            mine, theirs, total = mine[within], theirs[within], total[within]
        found.append((order[mine], order[theirs], total))
    return compared


def brute_force_pairs(words: np.ndarray, radius: int = DEFAULT_RADIUS) -> HashPairs:
    """The same pairs by comparing every pair (quadratic: the reference, for samples)."""
    n = len(words)
    left, right, bits = [], [], []
    for i in range(n - 1):
        distance = hamming(words[i + 1 :], words[i][None, :])
        close = np.flatnonzero(distance <= radius)
        left.append(np.full(len(close), i))
        right.append(close + i + 1)
        bits.append(distance[close])
    if not left:
        empty = np.empty(0, dtype=np.int64)
        return HashPairs(empty, empty, empty, 0)
    return HashPairs(
        np.concatenate(left).astype(np.int64),
        np.concatenate(right).astype(np.int64),
        np.concatenate(bits).astype(np.int64),
        n * (n - 1) // 2,
    )


def components(left: np.ndarray, right: np.ndarray, count: int) -> np.ndarray:
    """Connected-component label of each of `count` nodes joined by the edges left-right."""
    # Imported here: scipy.sparse is ~4 % of loading the definitions (-X importtime), which
    # every process would otherwise pay; only the grouping of a whole corpus needs it.
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    graph = coo_matrix((np.ones(len(left), dtype=np.int8), (left, right)), shape=(count, count))
    return connected_components(graph, directed=False)[1]
