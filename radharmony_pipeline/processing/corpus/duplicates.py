"""Near-duplicate groups of a corpus (one row per member), the train/test pairs inside them,
and the manifest's `duplicate_group` with the loader's filters on it.

Candidates are the image pairs whose perceptual hashes lie within the radius (an exact
search); each is kept only when the resized pixels show the same film (identical digests,
or `film_similarity` above its threshold), since different radiographs of a large corpus
fall within the radius too.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from radharmony_pipeline.processing.corpus.union_find import UnionFind
from radharmony_pipeline.processing.imaging.film_similarity import film_structure, same_film
from radharmony_pipeline.processing.imaging.geometry import GEOMETRIES
from radharmony_pipeline.processing.imaging.perceptual_hash import (
    DEFAULT_RADIUS,
    HashPairs,
    close_pairs,
    hamming,
    hashes_to_words,
)
from radharmony_pipeline.processing.storage.output_layout import packed_images
from radharmony_pipeline.processing.storage.packed_rows import PackedRowReader, read_layout
from radharmony_pipeline.processing.storage.store import OutputPath
from radharmony_pipeline.processing.tables.table_schemas import NEAR_DUPLICATES, pandas_dtype

KINDS = ("identical_file", "identical_pixels", "near")

NEAR_DUPLICATE_COLUMNS: tuple[str, ...] = tuple(NEAR_DUPLICATES.names)
# Counts every member has (never null): plain integers, empty table or not.
_COUNTS = {"group_size": "int64", "distance_to_representative": "int64"}
# Films whose structure is kept for further comparisons (16 KiB each: at most 64 MiB).
_KEPT_STRUCTURES = 4096
# Candidate pairs whose pixels are read at once.
_PAIRS_AT_ONCE = 1024

# Reads the content (padding cut off) of each row of an `images`-like table, in row order.
ContentReader = Callable[[pd.DataFrame], list[np.ndarray]]


@dataclass(frozen=True)
class NearDuplicateSearch:
    """The groups found and what finding them took: hash comparisons the search made,
    image pairs within the radius (`candidates`), and how many of those the pixels
    confirmed or rejected (pairs already joined through others are not compared)."""

    members: pd.DataFrame
    hashes_compared: int
    candidates: int
    confirmed: int
    rejected: int


def near_duplicate_members(
    images: pd.DataFrame, read_contents: ContentReader, radius: int = DEFAULT_RADIUS
) -> NearDuplicateSearch:
    """One row per image that has a near duplicate: its group and how it relates to it.

    `images` needs `image_id, dataset, split, image_path, perceptual_hash, pixels_sha256,
    source_sha256` and what `read_contents` reads (rows of usable images). Two images are
    joined when they are the same file or the same pixels, or their hashes lie within
    `radius` bits and their pixels show the same film; groups are the connected components.
    The representative is the group's smallest `image_id`; `group_splits` lists
    `<dataset>.<split>` keys. A member's `kind` is the strongest tie it has inside its group:
    `identical_file` (same source bytes as another member), `identical_pixels` (same resized
    pixels), else `near`.
    """
    usable = images.dropna(subset=["perceptual_hash"]).reset_index(drop=True)
    words = hashes_to_words(usable["perceptual_hash"])
    distinct, hash_of_row = np.unique(words, axis=0, return_inverse=True)
    hash_pairs = close_pairs(distinct, radius)
    film = _identical_films(usable)
    candidates = _candidate_film_pairs(hash_of_row.reshape(-1), film, hash_pairs)
    joined = _FilmJoins(usable, film, read_contents)
    joined.confirm(candidates)
    group = joined.groups()
    return NearDuplicateSearch(
        _members(usable, group),
        hash_pairs.compared,
        len(candidates),
        joined.confirmed,
        joined.rejected,
    )


def _identical_films(usable: pd.DataFrame) -> np.ndarray:
    """A label per row shared by rows with the same source file or the same pixels."""
    films = UnionFind(len(usable))
    for column in ("source_sha256", "pixels_sha256"):
        codes, _ = pd.factorize(usable[column])
        known = np.flatnonzero(codes >= 0)
        first = pd.Series(known).groupby(codes[known]).transform("first").to_numpy()
        films.union_pairs(known, first)
    return films.labels()


def _candidate_film_pairs(
    hash_of_row: np.ndarray, film: np.ndarray, hash_pairs: HashPairs
) -> pd.DataFrame:
    """(first, second, bits) film pairs to compare, closest hashes first: the films of each
    hash pair, and the different films sharing one hash."""
    films = pd.DataFrame({"hash": hash_of_row, "film": film}).drop_duplicates()
    close = pd.DataFrame(
        {"hash": hash_pairs.left, "other": hash_pairs.right, "bits": hash_pairs.bits}
    )
    across = close.merge(films, on="hash").merge(
        films.rename(columns={"hash": "other", "film": "other_film"}), on="other"
    )
    shared = films.merge(films.rename(columns={"film": "other_film"}), on="hash")
    shared = shared[shared["film"] < shared["other_film"]].assign(bits=0)
    pairs = pd.concat(
        [across[["film", "other_film", "bits"]], shared[["film", "other_film", "bits"]]],
        ignore_index=True,
    )
    pairs = pairs[pairs["film"] != pairs["other_film"]]
    first = np.minimum(pairs["film"], pairs["other_film"])
    second = np.maximum(pairs["film"], pairs["other_film"])
    pairs = pd.DataFrame({"first": first, "second": second, "bits": pairs["bits"]})
    pairs = pairs.sort_values(["bits", "first", "second"]).drop_duplicates(["first", "second"])
    return pairs.reset_index(drop=True)


class _FilmJoins:
    """Sets of films, joining a candidate pair when its pixels show one film."""

    def __init__(self, usable: pd.DataFrame, film: np.ndarray, read_contents: ContentReader):
        self.joined = UnionFind(int(film.max()) + 1 if len(film) else 0)
        self.film = film
        # One row stands for each film (its pixels are the film's, or the same file).
        self.row_of_film = pd.Series(np.arange(len(film))).groupby(film).first().to_numpy()
        self.usable = usable
        self.read_contents = read_contents
        self.structures: OrderedDict[int, np.ndarray] = OrderedDict()
        self.confirmed = 0
        self.rejected = 0

    def confirm(self, candidates: pd.DataFrame) -> None:
        pairs = candidates[["first", "second"]].to_numpy()
        for start in range(0, len(pairs), _PAIRS_AT_ONCE):
            chunk = pairs[start : start + _PAIRS_AT_ONCE]
            open_pairs = [(a, b) for a, b in chunk.tolist() if not self.joined.connected(a, b)]
            self._load({film for pair in open_pairs for film in pair})
            for a, b in open_pairs:
                if self.joined.connected(a, b):
                    continue
                if same_film(self._structure(a), self._structure(b)):
                    self.joined.union(a, b)
                    self.confirmed += 1
                else:
                    self.rejected += 1

    def groups(self) -> np.ndarray:
        """Each row's group (a film root), −1 when the row is alone."""
        roots = self.joined.roots()
        group = roots[self.film] if len(self.film) else np.empty(0, dtype=np.int64)
        sizes = np.bincount(group, minlength=len(roots)) if len(group) else group
        return np.where(sizes[group] > 1, group, -1) if len(group) else group

    def _load(self, films: set[int]) -> None:
        missing = sorted(film for film in films if film not in self.structures)
        if not missing:
            return
        rows = self.usable.iloc[self.row_of_film[missing]]
        for film, content in zip(missing, self.read_contents(rows), strict=True):
            self.structures[film] = film_structure(content)
        while len(self.structures) > max(_KEPT_STRUCTURES, len(films)):
            self.structures.popitem(last=False)

    def _structure(self, film: int) -> np.ndarray:
        if film not in self.structures:
            self._load({film})
        self.structures.move_to_end(film)
        return self.structures[film]


def _members(usable: pd.DataFrame, group: np.ndarray) -> pd.DataFrame:
    members = usable.loc[group >= 0].copy()
    if members.empty:
        return _empty_members()
    members["component"] = group[group >= 0]
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
    return ordered[list(NEAR_DUPLICATE_COLUMNS)].astype(_COUNTS)


class PackedContents:
    """Reads the content of `images` rows from their partitions' packed arrays under an
    output root, a row at a time (never a whole array): `tensor_index` is the row, the
    geometry (`resize`, `orig_height`, `orig_width`, `size`) says where the padding is."""

    def __init__(self, root: OutputPath) -> None:
        self.root = root

    def __call__(self, rows: pd.DataFrame) -> list[np.ndarray]:
        contents: list[np.ndarray | None] = [None] * len(rows)
        partition = (rows["dataset"] + "." + rows["split"]).to_numpy()
        for key in sorted(set(partition)):
            path = self.root / packed_images(key)
            positions = np.flatnonzero(partition == key)
            positions = positions[np.argsort(rows["tensor_index"].to_numpy()[positions])]
            with PackedRowReader(read_layout(path)) as reader:
                for position in positions.tolist():
                    row = rows.iloc[position]
                    contents[position] = _content(reader, row, path)
        return contents  # type: ignore[return-value]


def _content(reader: PackedRowReader, row: pd.Series, path: OutputPath) -> np.ndarray:
    index = int(row["tensor_index"])
    if not 0 <= index < reader.layout.rows:
        raise ValueError(
            f"{path}: image {row['image_id']} has tensor_index {index}, the array holds "
            f"{reader.layout.rows} rows; rematerialize `images` for {row['dataset']}."
            f"{row['split']}"
        )
    framed = reader.read(index, index + 1)[0]
    geometry = GEOMETRIES[str(row["resize"])](
        int(row["orig_height"]), int(row["orig_width"]), int(row["size"])
    )
    top, left = geometry.pad_top, geometry.pad_left
    return framed[top : top + geometry.resized_height, left : left + geometry.resized_width]


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
    frame = pd.DataFrame({column: pd.Series([], dtype=object) for column in NEAR_DUPLICATE_COLUMNS})
    return frame.astype({c.name: pandas_dtype(c.type) for c in NEAR_DUPLICATES.columns} | _COUNTS)


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
