"""Perceptual hashes of resized images, and the exact search for every pair of them within a
radius, without comparing every pair.

The fingerprint is imagehash's difference hash (dHash) with 256 bits, taken over the content
of the resized image (the letterbox padding cut off); docs/design-notes.md has the measurements
that chose it over pHash and 64-bit hashes. The search is multi-index hashing over 8 blocks of
32 bits, within one set of hashes (`close_pairs`: the corpus's near duplicates) or between two
(`close_pairs_between`: children and their parents' images, processing/corpus/parents.py);
both share the blocks, their layout and the comparisons.
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


@dataclass(frozen=True)
class HashPairs:
    """Pairs of rows whose hashes lie within a radius, `bits[k]` their distance: within one
    set `left[k] < right[k]`, between two `left` is a row of the first and `right` of the
    second; `compared` counts the hash comparisons the search made to find them."""

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
    _check_radius(radius)
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


def close_pairs_between(
    queries: np.ndarray, targets: np.ndarray, radius: int = DEFAULT_RADIUS
) -> HashPairs:
    """Every (query row, target row) pair within `radius` bits, `queries` and `targets`
    being (n, 4) uint64 words (repeated hashes allowed): the pairs comparing every query with
    every target finds, by the multi-index hashing of `close_pairs`.

    The bits are dealt to the blocks by how evenly each splits the targets; per block, a
    query is compared with the targets of its own block value and, when `radius` ≥
    `SEARCH_BLOCKS`, of each value one bit away.
    """
    _check_radius(radius)
    if len(queries) == 0 or len(targets) == 0:
        empty = np.empty(0, dtype=np.int64)
        return HashPairs(empty, empty, empty, 0)
    layout = _balanced_layout(targets)
    laid_queries, laid_targets = _rearranged(queries, layout), _rearranged(targets, layout)
    found: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    compared = 0
    for block in range(SEARCH_BLOCKS):
        compared += _search_block_between(laid_queries, laid_targets, block, radius, found)
    query = np.concatenate([pair[0] for pair in found]).astype(np.int64)
    target = np.concatenate([pair[1] for pair in found]).astype(np.int64)
    bits = np.concatenate([pair[2] for pair in found]).astype(np.int64)
    # A pair close in several blocks was found once per block.
    _, once = np.unique(query * len(targets) + target, return_index=True)
    return HashPairs(query[once], target[once], bits[once], compared)


def _check_radius(radius: int) -> None:
    if not 0 <= radius <= MAX_SEARCH_RADIUS:
        raise ValueError(
            f"radius must be in 0..{MAX_SEARCH_RADIUS} for {SEARCH_BLOCKS} blocks of "
            f"{SEARCH_BLOCK_BITS} bits, got {radius}"
        )


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


def _block_values(laid: np.ndarray, block: int) -> tuple[int, np.ndarray]:
    """The word holding block `block` of rearranged words, and the block's uint32 values."""
    word, half = divmod(block, 64 // SEARCH_BLOCK_BITS)
    shift = np.uint64(64 - SEARCH_BLOCK_BITS * (half + 1))
    return word, ((laid[:, word] >> shift) & np.uint64(0xFFFFFFFF)).astype(np.uint32)


def _runs(values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """`values` sorted (the order, stable), and the start, length and value of each run."""
    order = np.argsort(values, kind="stable")
    ordered = values[order]
    starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
    lengths = np.diff(np.r_[starts, len(ordered)])
    return order, starts, lengths, ordered[starts]


def _search_block(
    laid: np.ndarray, block: int, radius: int, found: list[tuple[np.ndarray, ...]]
) -> int:
    """Compare the hashes whose block `block` is equal or one bit apart; append the pairs
    within `radius` to `found` as (row, row, bits); return how many comparisons were made.

    Sorted by block value, each value's hashes are one run. A task is a hash and a run of
    partners: the rest of its own run, and the whole run of each value one bit above its
    own (`_compare` takes the tasks).
    """
    word, values = _block_values(laid, block)
    order, starts, lengths, distinct = _runs(values)
    position = np.arange(len(order))
    rows, partners, counts = [position], [position + 1], [np.repeat(starts + lengths, lengths)]
    counts[0] = counts[0] - position - 1
    if radius >= SEARCH_BLOCKS:  # pigeonhole then needs the one-bit neighbours
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
    sorted_words = laid[order]
    mine, theirs, bits, compared = _compare(
        sorted_words,
        sorted_words,
        (np.concatenate(rows), np.concatenate(partners), np.concatenate(counts)),
        word,
        radius,
    )
    found.append((order[mine], order[theirs], bits))
    return compared


def _search_block_between(
    laid_queries: np.ndarray,
    laid_targets: np.ndarray,
    block: int,
    radius: int,
    found: list[tuple[np.ndarray, ...]],
) -> int:
    """Compare each query with the targets whose block `block` is equal to its own or one
    bit apart; append the pairs within `radius` to `found` as (query, target, bits); return
    how many comparisons were made. A task is a query and the run of targets of one value."""
    word, values = _block_values(laid_targets, block)
    _, wanted = _block_values(laid_queries, block)
    order, starts, lengths, distinct = _runs(values)
    lookups = [wanted]
    if radius >= SEARCH_BLOCKS:  # pigeonhole then needs the one-bit neighbours
        lookups += [wanted ^ np.uint32(1 << bit) for bit in range(SEARCH_BLOCK_BITS)]
    queries = np.arange(len(wanted))
    rows, partners, counts = [], [], []
    for value in lookups:
        run = np.minimum(np.searchsorted(distinct, value), len(distinct) - 1)
        hit = distinct[run] == value
        rows.append(queries[hit])
        partners.append(starts[run[hit]])
        counts.append(lengths[run[hit]])
    mine, theirs, bits, compared = _compare(
        laid_queries,
        laid_targets[order],
        (np.concatenate(rows), np.concatenate(partners), np.concatenate(counts)),
        word,
        radius,
    )
    found.append((mine, order[theirs], bits))
    return compared


def _compare(
    row_words: np.ndarray,
    partner_words: np.ndarray,
    tasks: tuple[np.ndarray, np.ndarray, np.ndarray],
    word: int,
    radius: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """(row, partner, bits) of the pairs within `radius` among the tasks, and how many
    comparisons were made. A task (row, first partner, count) compares `row_words[row]` with
    the `count` consecutive `partner_words` from the first partner on.

    Tasks are taken longest first, and the k-th partner of every task at least k + 1 long
    is compared in one vectorized step, so the work is the comparisons plus one step per
    partner rank. The words without the searched block's `word` are compared first: most
    tasks end there.
    """
    row, partner, count = tasks
    longest_first = np.flatnonzero(count > 0)
    longest_first = longest_first[np.argsort(-count[longest_first], kind="stable")]
    row = row[longest_first].astype(np.int32)
    partner = partner[longest_first].astype(np.int32)
    count = count[longest_first]
    check = [w for w in range(WORDS) if w != word] + [word]
    partner_first = np.ascontiguousarray(partner_words[:, check[0]])
    row_first = row_words[row, check[0]]
    found_rows, found_partners, found_bits = [], [], []
    compared = 0
    shorter = -count  # ascending: tasks with count > k come before -k
    for rank in range(int(count[0]) if len(count) else 0):
        active = int(np.searchsorted(shorter, -rank, side="left"))
        other = partner[:active] + rank
        bits = np.bitwise_count(partner_first[other] ^ row_first[:active])
        close = np.flatnonzero(bits <= radius)
        compared += active
        if len(close) == 0:
            continue
        mine, theirs, total = row[close], other[close], bits[close].astype(np.int64)
        for w in check[1:]:
            total += np.bitwise_count(row_words[mine, w] ^ partner_words[theirs, w])
            within = total <= radius
            mine, theirs, total = mine[within], theirs[within], total[within]
        found_rows.append(mine)
        found_partners.append(theirs)
        found_bits.append(total)
    if not found_rows:
        empty = np.empty(0, dtype=np.int64)
        return empty, empty, empty, compared
    return (
        np.concatenate(found_rows),
        np.concatenate(found_partners),
        np.concatenate(found_bits),
        compared,
    )


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
    return _gathered(left, right, bits, n * (n - 1) // 2)


def brute_force_pairs_between(
    queries: np.ndarray, targets: np.ndarray, radius: int = DEFAULT_RADIUS
) -> HashPairs:
    """The pairs of `close_pairs_between` by comparing every query with every target (the
    reference, for samples)."""
    query, target, bits = [], [], []
    for i in range(len(queries)):
        distance = hamming(targets, queries[i][None, :])
        close = np.flatnonzero(distance <= radius)
        query.append(np.full(len(close), i))
        target.append(close)
        bits.append(distance[close])
    return _gathered(query, target, bits, len(queries) * len(targets))


def _gathered(
    first: list[np.ndarray], second: list[np.ndarray], bits: list[np.ndarray], compared: int
) -> HashPairs:
    """The brute-force searches' per-row pieces as one HashPairs (none: nothing compared)."""
    if not first:
        empty = np.empty(0, dtype=np.int64)
        return HashPairs(empty, empty, empty, 0)
    return HashPairs(
        *(np.concatenate(part).astype(np.int64) for part in (first, second, bits)), compared
    )
