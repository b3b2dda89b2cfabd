"""Near-duplicate images by perceptual hash: the fingerprint of a resized image, and the
grouping of a whole corpus of fingerprints into connected components without comparing every
pair.

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

import imagehash
import numpy as np
import pandas as pd
from PIL import Image
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

HASH_SIZE = 16  # 16×16 horizontal gradient signs: 256 bits
HASH_BITS = HASH_SIZE * HASH_SIZE
HASH_HEX_LENGTH = HASH_BITS // 4
BLOCK_BITS = 16
BLOCKS = HASH_BITS // BLOCK_BITS
# Tuned on planted copies vs distinct radiographs (docs/design-notes.md, "Near duplicates").
DEFAULT_RADIUS = 15
# Candidate pairs are checked this many at a time, so memory stays bounded for large buckets.
_CANDIDATE_CHUNK = 250_000

KINDS = ("identical_file", "identical_pixels", "near")


def perceptual_hash(content: np.ndarray) -> str:
    """Hex dHash (256 bits) of a uint8 grayscale image (pass the content, not the padding)."""
    return str(imagehash.dhash(Image.fromarray(content), hash_size=HASH_SIZE))


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
    blocks = _block_values(unique)
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
    graph = coo_matrix((np.ones(len(left), dtype=np.int8), (left, right)), shape=(u, u))
    _, unique_component = connected_components(graph, directed=False)
    component = unique_component[inverse]
    sizes = np.bincount(component)
    group = np.where(sizes[component] > 1, component, -1)
    return Grouping(group.astype(np.int64), candidates, int(sum(len(s) for s in sources)))


def _block_values(words: np.ndarray) -> np.ndarray:
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
    graph = coo_matrix((np.ones(len(rows), dtype=np.int8), (rows, cols)), shape=(n, n))
    _, component = connected_components(graph, directed=False)
    sizes = np.bincount(component)
    return np.where(sizes[component] > 1, component, -1)


NEAR_DUPLICATE_COLUMNS = (
    "image_id",
    "dataset",
    "split",
    "image_path",
    "group_id",
    "group_size",
    "group_datasets",
    "group_splits",
    "representative_id",
    "distance_to_representative",
    "kind",
    "source_sha256",
    "pixels_sha256",
)


def near_duplicate_members(images: pd.DataFrame, radius: int = DEFAULT_RADIUS) -> pd.DataFrame:
    """One row per image that has a near duplicate: its group and how it relates to it.

    `images` needs `image_id, dataset, split, image_path, perceptual_hash, pixels_sha256,
    source_sha256` (rows of usable images). The representative is the group's smallest
    `image_id`; `group_splits` lists `<dataset>.<split>` keys. A member's `kind` is the
    strongest tie it has inside its group: `identical_file` (same source bytes as another
    member), `identical_pixels` (same resized pixels), else `near`.
    """
    usable = images.dropna(subset=["perceptual_hash"]).reset_index(drop=True)
    grouping = group_fingerprints(hashes_to_words(usable["perceptual_hash"]), radius)
    members = usable.loc[grouping.group >= 0].copy()
    if members.empty:
        return _empty_members()
    members["component"] = grouping.group[grouping.group >= 0]
    members["partition"] = members["dataset"] + "." + members["split"]
    members = members.sort_values(["component", "image_id"]).reset_index(drop=True)
    by_component = members.groupby("component", sort=False)
    first = by_component["image_id"].transform("first")
    representative_hash = by_component["perceptual_hash"].transform("first")
    members["representative_id"] = first
    members["group_id"] = [_group_id(image_id) for image_id in first]
    members["group_size"] = by_component["image_id"].transform("size").astype("int64")
    spans = by_component.agg(
        group_datasets=("dataset", lambda s: sorted(set(s))),
        group_splits=("partition", lambda s: sorted(set(s))),
    )
    members = members.join(spans, on="component")
    members["distance_to_representative"] = hamming(
        hashes_to_words(members["perceptual_hash"]), hashes_to_words(representative_hash)
    )
    members["kind"] = _kinds(members)
    ordered = members.sort_values(["group_id", "image_id"]).reset_index(drop=True)
    return ordered[list(NEAR_DUPLICATE_COLUMNS)].astype(
        {"group_size": "int64", "distance_to_representative": "int64"}
    )


def _kinds(members: pd.DataFrame) -> list[str]:
    same_file = members.groupby(["component", "source_sha256"])["image_id"].transform("size") > 1
    same_pixels = members.groupby(["component", "pixels_sha256"])["image_id"].transform("size") > 1
    return [
        "identical_file" if file else "identical_pixels" if pixels else "near"
        for file, pixels in zip(same_file, same_pixels, strict=True)
    ]


def _group_id(representative_id: str) -> str:
    # Named after its representative so a group keeps its id when unrelated images change.
    return "dup-" + hashlib.sha1(representative_id.encode()).hexdigest()[:12]


def _empty_members() -> pd.DataFrame:
    frame = pd.DataFrame({column: [] for column in NEAR_DUPLICATE_COLUMNS})
    return frame.astype(
        {
            "image_id": "string",
            "dataset": "string",
            "split": "string",
            "image_path": "string",
            "group_id": "string",
            "group_size": "int64",
            "representative_id": "string",
            "distance_to_representative": "int64",
            "kind": "string",
            "source_sha256": "string",
            "pixels_sha256": "string",
        }
    )


@dataclass(frozen=True)
class SplitLeak:
    """Two images of one group, one in a train split and one in a test split."""

    train_id: str
    test_id: str
    group_id: str
    identical: bool


def train_test_leaks(members: pd.DataFrame) -> list[SplitLeak]:
    """Train/test pairs inside groups; `identical` when both are the same file or pixels.

    One pair per (group, test image): the train member it is identical to if any (looked up
    by digest), else the group's first train member, so a group of n costs O(n), never n².
    """
    leaks = []
    for group_id, group in members.groupby("group_id", sort=True):
        train = group[group["split"] == "train"]
        test = group[group["split"] == "test"]
        if train.empty or test.empty:
            continue
        by_file = dict(zip(train["source_sha256"][::-1], train["image_id"][::-1], strict=True))
        by_pixels = dict(zip(train["pixels_sha256"][::-1], train["image_id"][::-1], strict=True))
        first_train = str(train["image_id"].iloc[0])
        for test_id, source_sha, pixels_sha in zip(
            test["image_id"], test["source_sha256"], test["pixels_sha256"], strict=True
        ):
            twin = by_file.get(source_sha) or by_pixels.get(pixels_sha)
            leaks.append(
                SplitLeak(str(twin or first_train), str(test_id), str(group_id), twin is not None)
            )
    return leaks


def partition_pair_counts(members: pd.DataFrame) -> dict[str, int]:
    """Groups spanning more than one partition, counted per pair of partitions they join."""
    counts: dict[str, int] = {}
    for splits in members.drop_duplicates("group_id")["group_splits"]:
        keys = sorted(splits)
        for i, left in enumerate(keys):
            for right in keys[i + 1 :]:
                pair = f"{left} ~ {right}"
                counts[pair] = counts.get(pair, 0) + 1
    return dict(sorted(counts.items()))


def count_test_images_with_train_duplicate(members: pd.DataFrame, dataset: str) -> int:
    """Test images of `dataset` whose group also holds a train image of the same dataset."""
    own = members[members["dataset"] == dataset]
    train_groups = set(own.loc[own["split"] == "train", "group_id"])
    return int(((own["split"] == "test") & own["group_id"].isin(train_groups)).sum())


def with_duplicate_groups(manifest: pd.DataFrame, members: pd.DataFrame) -> pd.DataFrame:
    """The manifest with `duplicate_group`: the image's near-duplicate group id, else null."""
    groups = dict(zip(members["image_id"], members["group_id"], strict=True))
    return manifest.assign(
        duplicate_group=pd.Series(manifest["image_id"].map(groups), dtype="string")
    )


def without_cross_split_groups(manifest: pd.DataFrame) -> pd.DataFrame:
    """Rows whose duplicate group has no member in another split (of any dataset)."""
    grouped = manifest.dropna(subset=["duplicate_group"])
    splits = grouped.groupby("duplicate_group")["split"].nunique()
    spanning = set(splits[splits > 1].index)
    return manifest[~manifest["duplicate_group"].isin(spanning).fillna(False).to_numpy(bool)]


def one_per_duplicate_group(manifest: pd.DataFrame) -> pd.DataFrame:
    """Rows with each duplicate group reduced to its smallest `image_id` (others untouched)."""
    keep = np.array(manifest["duplicate_group"].isna(), dtype=bool)
    grouped = manifest.loc[~keep].sort_values("image_id")
    first = grouped.drop_duplicates("duplicate_group").index
    keep[manifest.index.get_indexer(first)] = True
    return manifest[keep]
