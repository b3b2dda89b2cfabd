"""The exact hash search within one set of hashes and between two, on look-alike radiographs
and random hashes (against brute force), and the confirmation of hash matches on pixels:
copies of every kind pass, different look-alike films fail, whichever film comes first."""

from __future__ import annotations

import functools

import cv2
import numpy as np
import pandas as pd
import pytest

from radharmony_pipeline.processing.corpus.duplicates import (
    PackedContents,
    near_duplicate_members,
)
from radharmony_pipeline.processing.imaging.film_similarity import (
    GRID,
    SAME_FILM_MIN_CORRELATION,
    film_similarity,
    film_structure,
    same_film,
)
from radharmony_pipeline.processing.imaging.perceptual_hash import (
    DEFAULT_RADIUS,
    SEARCH_BLOCKS,
    brute_force_pairs,
    brute_force_pairs_between,
    close_pairs,
    close_pairs_between,
    hashes_to_words,
    perceptual_hash,
    pixels_sha256,
)
from radharmony_pipeline.processing.storage.output_layout import packed_images
from radharmony_pipeline.synthetic.look_alikes import (
    COPY_KINDS,
    cropped,
    downscaled,
    look_alike_radiograph,
    resized_like_images_stage,
    shifted,
)

# Renders small enough to make thousands in a second or two; the hash sees 17×16 pixels.
HASH_SIDE = 40
FILM_SIDE = 190
SIZE = 224
# Each render also hashed in these versions: close to it, some inside the radius, some not.
_VARIANTS = (
    lambda p: p,
    lambda p: shifted(p, 0.025),
    lambda p: shifted(p, -0.025),
    lambda p: cropped(p, 0.025),
    lambda p: downscaled(p, 0.6),
    lambda p: np.clip(p.astype(np.int16) + 12, 0, 255).astype(np.uint8),
)


@functools.cache
def look_alike_words(count: int) -> np.ndarray:
    """At least `count` distinct hashes: renders of the project's renderer and versions of
    them (7 in 8), plus planted near copies 1 to 15 bits away (cached: tests share them)."""
    rng = np.random.default_rng(count)
    hashes: set[str] = set()
    index = 0
    while len(hashes) < count * 7 // 8:
        render = look_alike_radiograph(11, index, HASH_SIDE)
        hashes.update(perceptual_hash(variant(render)) for variant in _VARIANTS)
        index += 1
    words = hashes_to_words(sorted(hashes))
    while len(words) < count:
        sources = words[rng.integers(0, len(words), count - len(words))]
        flips = np.zeros((len(sources), 256), dtype=bool)
        for row in range(len(sources)):
            bits = rng.choice(256, rng.integers(1, DEFAULT_RADIUS + 1), replace=False)
            flips[row, bits] = True
        planted = sources ^ np.packbits(flips, axis=1).view(">u8").astype(np.uint64)
        words = np.unique(np.concatenate([words, planted]), axis=0)
    return words


def _pair_set(pairs) -> set[tuple[int, int, int]]:
    return set(zip(pairs.left.tolist(), pairs.right.tolist(), pairs.bits.tolist(), strict=True))


@pytest.mark.parametrize("radius", [DEFAULT_RADIUS, 9, 7, 0])
def test_search_equals_brute_force_on_look_alike_hashes(radius):
    words = look_alike_words(3_000)
    found = close_pairs(words, radius)
    assert _pair_set(found) == _pair_set(brute_force_pairs(words, radius))
    assert (found.left < found.right).all()
    if radius == DEFAULT_RADIUS:
        assert len(found) > 300  # the set is dense near the radius: the test can fail
        assert found.compared < len(words) ** 2 // 20


@pytest.mark.build
def test_search_equals_brute_force_on_twenty_thousand_look_alike_hashes():
    words = look_alike_words(20_000)
    assert len(words) >= 20_000
    found = close_pairs(words)
    assert _pair_set(found) == _pair_set(brute_force_pairs(words))
    assert len(found) > 2_000


def test_look_alike_hashes_are_skewed_like_radiographs():
    # The reason for the balanced blocks: one 16-bit row of the hash is shared widely.
    words = look_alike_words(3_000)
    rows = words.astype(">u8").view(">u2").reshape(len(words), 16)
    widest = max(np.unique(rows[:, row], return_counts=True)[1].max() for row in range(16))
    assert widest > len(words) // 20


@pytest.mark.parametrize("radius", [DEFAULT_RADIUS, 9, 7, 0])
def test_search_between_equals_brute_force_on_look_alike_hashes(radius):
    # Children against a parent dataset: some children are in it (distance 0), repeated.
    words = look_alike_words(3_000)
    queries = np.concatenate([words[:1_000], words[:40]])
    targets = np.concatenate([words[1_000:], words[:60], words[:30]])
    found = close_pairs_between(queries, targets, radius)
    expected = brute_force_pairs_between(queries, targets, radius)
    assert _pair_set(found) == _pair_set(expected)
    assert len(expected) > 100  # the test can fail
    if radius == DEFAULT_RADIUS:
        assert found.compared < len(queries) * len(targets) // 10


def _random_with_copies(rng: np.random.Generator, originals: int, copies: int) -> np.ndarray:
    """Uniform random hashes and copies of them 0 to 15 bits away, shuffled."""
    words = rng.integers(0, 2**64, size=(originals, 4), dtype=np.uint64)
    sources = words[rng.integers(0, originals, copies)]
    flips = np.zeros((copies, 256), dtype=bool)
    for row in range(copies):
        flips[row, rng.choice(256, rng.integers(0, DEFAULT_RADIUS + 1), replace=False)] = True
    planted = sources ^ np.packbits(flips, axis=1).view(">u8").astype(np.uint64)
    return rng.permutation(np.concatenate([words, planted]))


@pytest.mark.parametrize("radius", [0, 3, SEARCH_BLOCKS - 1, SEARCH_BLOCKS, 12, DEFAULT_RADIUS])
def test_both_searches_equal_brute_force_on_random_hashes(radius):
    rng = np.random.default_rng(radius)
    words = _random_with_copies(rng, 300, 700)
    distinct = np.unique(words, axis=0)
    within = brute_force_pairs(distinct, radius)
    assert _pair_set(close_pairs(distinct, radius)) == _pair_set(within)
    queries, targets = words[:400], words[400:]
    between = brute_force_pairs_between(queries, targets, radius)
    assert _pair_set(close_pairs_between(queries, targets, radius)) == _pair_set(between)
    assert len(between) > 20 and (radius == 0 or len(within) > 20)  # the test can fail
    if radius >= SEARCH_BLOCKS:  # pairs only the one-bit neighbouring block values find
        assert (between.bits >= SEARCH_BLOCKS).any() and (within.bits >= SEARCH_BLOCKS).any()


def test_radius_beyond_the_search_is_refused():
    with pytest.raises(ValueError, match="radius"):
        close_pairs(np.zeros((2, 4), dtype=np.uint64), radius=16)
    with pytest.raises(ValueError, match="radius"):
        close_pairs_between(np.zeros((2, 4), np.uint64), np.zeros((2, 4), np.uint64), radius=16)


def test_fewer_than_two_hashes_have_no_pairs():
    assert len(close_pairs(np.zeros((1, 4), dtype=np.uint64))) == 0
    assert len(close_pairs(np.zeros((0, 4), dtype=np.uint64))) == 0


def test_no_queries_or_no_targets_have_no_pairs():
    one, none = np.zeros((1, 4), dtype=np.uint64), np.zeros((0, 4), dtype=np.uint64)
    assert len(close_pairs_between(none, one)) == len(close_pairs_between(one, none)) == 0
    assert len(close_pairs_between(one, one)) == 1


@functools.cache
def _film(index: int) -> np.ndarray:
    return look_alike_radiograph(23, index, FILM_SIDE)


def _content(pixels: np.ndarray) -> np.ndarray:
    return resized_like_images_stage(pixels, SIZE)[1]


@pytest.mark.parametrize("kind", sorted(COPY_KINDS))
def test_every_copy_kind_is_the_same_film(kind):
    for index in range(3):
        original = _film(index)
        copy = COPY_KINDS[kind](original)
        similarity = film_similarity(
            film_structure(_content(original)), film_structure(_content(copy))
        )
        assert similarity >= SAME_FILM_MIN_CORRELATION, (kind, index, similarity)


@functools.cache
def _closest_different_films(count: int, pairs: int) -> list[tuple[int, int, float]]:
    """The `pairs` most correlated pairs among `count` different renders (raw pixels)."""
    frames = np.array([_content(_film(i)).astype(np.float32).ravel() for i in range(count)])
    frames -= frames.mean(axis=1, keepdims=True)
    frames /= np.linalg.norm(frames, axis=1, keepdims=True)
    correlation = frames @ frames.T
    upper = np.triu_indices(count, 1)
    best = np.argsort(correlation[upper])[-pairs:]
    return [(int(upper[0][k]), int(upper[1][k]), float(correlation[upper][k])) for k in best]


def test_different_look_alike_films_are_not_the_same_film():
    closest = _closest_different_films(60, 12)
    assert min(c for _, _, c in closest) > 0.85  # they do look alike
    for first, second, _ in closest:
        a, b = film_structure(_content(_film(first))), film_structure(_content(_film(second)))
        assert not same_film(a, b), (first, second, film_similarity(a, b))


def _near_copy(structure: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """The structure rescaled and shifted about the warp's bounds, with a little noise."""
    scale = rng.uniform(0.86, 1.14)
    warp = np.array([[scale, 0, 0], [0, scale, 0]], dtype=np.float32)
    warp[:, 2] = GRID / 2 * (1 - scale) + rng.uniform(-8, 8, 2)
    moved = cv2.warpAffine(structure, warp, (GRID, GRID), borderMode=cv2.BORDER_REFLECT)
    return (moved + rng.normal(0, rng.uniform(0, 0.02), moved.shape)).astype(np.float32)


def test_same_film_is_the_same_either_way_round():
    # A seeded property test (hypothesis is not a dependency): random pairs of different
    # films, of a film and itself, of a film and noise, and many near-identical pairs.
    rng = np.random.default_rng(2024)
    films = [film_structure(_content(_film(i))) for i in range(8)]
    disagreeing = 0
    for _ in range(200):
        first = films[rng.integers(len(films))]
        kind = rng.integers(5)
        if kind == 0:
            second = films[rng.integers(len(films))]
        elif kind == 1:
            second = rng.normal(0, first.std(), first.shape).astype(np.float32)
        else:
            second = _near_copy(first, rng)
        forward = film_similarity(first, second) >= SAME_FILM_MIN_CORRELATION
        backward = film_similarity(second, first) >= SAME_FILM_MIN_CORRELATION
        assert same_film(first, second) == same_film(second, first)
        if forward == backward:  # the answer stays where the two directions agree
            assert same_film(first, second) == forward
        disagreeing += forward != backward
    # The sample holds pairs the one-way comparison answered two ways: the test can fail.
    assert disagreeing > 0


def test_a_flat_image_is_no_film():
    flat = film_structure(np.full((50, 40), 9, np.uint8))
    assert film_similarity(flat, flat) < SAME_FILM_MIN_CORRELATION


class _Contents:
    """An in-memory reader of contents by image id, counting what it read."""

    def __init__(self, contents: dict[str, np.ndarray]) -> None:
        self.contents = contents
        self.read: list[str] = []

    def __call__(self, rows: pd.DataFrame) -> list[np.ndarray]:
        self.read += list(rows["image_id"])
        return [self.contents[image_id] for image_id in rows["image_id"]]


def _rows(images: dict[str, np.ndarray], hashes: dict[str, str]) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "image_id": list(images),
            "dataset": "rexgradient",
            "split": ["train" if i % 2 else "test" for i in range(len(images))],
            "image_path": "x.png",
            "perceptual_hash": [hashes[i] for i in images],
            "source_sha256": [f"file-{i}" for i in images],
            "pixels_sha256": [pixels_sha256(images[i]) for i in images],
        }
    )


def test_hash_matches_of_different_films_form_no_group_and_copies_do():
    # Every hash is forced within the radius: only the pixels can tell copies apart.
    different = {f"rexgradient/{i}": _content(_film(i)) for i in range(8)}
    copies = {
        "rexgradient/copy-jpeg": _content(COPY_KINDS["jpeg_quality"](_film(0))),
        "rexgradient/copy-shift": _content(COPY_KINDS["shifted"](_film(3))),
    }
    images = different | copies
    near = "0" * 63
    hashes = {image_id: near + "0123456789ab"[k] for k, image_id in enumerate(images)}
    hashes["rexgradient/copy-jpeg"] = hashes["rexgradient/0"]  # one hash, two films
    reader = _Contents(images)
    search = near_duplicate_members(_rows(images, hashes), reader)
    groups = search.members.groupby("group_id")["image_id"].apply(set).tolist()
    assert sorted(map(sorted, groups)) == [
        ["rexgradient/0", "rexgradient/copy-jpeg"],
        ["rexgradient/3", "rexgradient/copy-shift"],
    ]
    assert search.candidates == len(images) * (len(images) - 1) // 2
    assert search.confirmed == 2 and search.rejected > 0
    assert sorted(set(reader.read)) == sorted(images)  # each film read once
    assert len(reader.read) == len(images)


def test_identical_images_are_grouped_without_reading_pixels():
    pixels = _content(_film(1))
    images = {f"rexgradient/{i}": pixels for i in range(4)}
    hashes = dict.fromkeys(images, perceptual_hash(pixels))
    reader = _Contents(images)
    search = near_duplicate_members(_rows(images, hashes), reader)
    assert search.members["group_id"].nunique() == 1 and len(search.members) == 4
    assert set(search.members["kind"]) == {"identical_pixels"}
    assert reader.read == [] and search.candidates == 0


def test_packed_contents_reads_the_rows_without_padding(tmp_path):
    tall = _film(4)[:, 30:150]  # 190 × 120: letterboxed with columns of padding
    framed, content = resized_like_images_stage(tall, SIZE)
    other, _ = resized_like_images_stage(_film(5), SIZE)
    packed = tmp_path / packed_images("rexgradient.train")
    packed.parent.mkdir(parents=True)
    np.save(packed, np.stack([other, framed]))
    rows = pd.DataFrame(
        {
            "image_id": ["rexgradient/a"],
            "dataset": ["rexgradient"],
            "split": ["train"],
            "tensor_index": [1],
            "resize": ["letterbox"],
            "orig_height": [190],
            "orig_width": [120],
            "size": [SIZE],
        }
    )
    (read,) = PackedContents(tmp_path)(rows)
    assert np.array_equal(read, content) and read.shape[1] < SIZE
    with pytest.raises(ValueError, match="tensor_index 5"):
        PackedContents(tmp_path)(rows.assign(tensor_index=5))
