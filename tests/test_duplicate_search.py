"""The exact hash search on look-alike radiographs (against brute force) and the confirmation
of hash matches on pixels: copies of every kind pass, different look-alike films fail."""

from __future__ import annotations

import functools

import numpy as np
import pandas as pd
import pytest

from radharmony_pipeline.processing.corpus.duplicates import (
    PackedContents,
    near_duplicate_members,
)
from radharmony_pipeline.processing.imaging.film_similarity import (
    SAME_FILM_MIN_CORRELATION,
    film_similarity,
    film_structure,
    same_film,
)
from radharmony_pipeline.processing.imaging.perceptual_hash import (
    DEFAULT_RADIUS,
    brute_force_pairs,
    close_pairs,
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


def test_radius_beyond_the_search_is_refused():
    with pytest.raises(ValueError, match="radius"):
        close_pairs(np.zeros((2, 4), dtype=np.uint64), radius=16)


def test_fewer_than_two_hashes_have_no_pairs():
    assert len(close_pairs(np.zeros((1, 4), dtype=np.uint64))) == 0
    assert len(close_pairs(np.zeros((0, 4), dtype=np.uint64))) == 0


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
