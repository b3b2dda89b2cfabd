"""Measurements behind the choice of perceptual hash and of the confirmation on pixels
(docs/design-notes.md, "Near duplicates").

Generates the small synthetic datasets, decodes every image as the `images` stage does
(letterbox to 224, padding cut off), and for pHash and dHash at 64 and 256 bits prints:
the bit distances between distinct radiographs (min, 0.1 % and 1 % quantiles, median) and
between an image and its transformed copy (median / max over the sample) for each
transform the synthetic generator plants and some harsher ones.

Then, for the confirmation (`film_similarity`): renders of the project's renderer
(`synthetic/look_alikes.py`, `--film-side` pixels, resized to 224 as the stage does), each
copy kind's similarity to its original (min and median over `--films` films) and its hash
distance, against the most alike pairs of different films (the `--closest` pairs of highest
pixel correlation among `--films` × 4 renders, and pairs whose hashes are closest): the
threshold must lie between.

    .venv/bin/python benchmarks/measure_hashes.py [--images 70] [--films 40] [--only films]
"""

from __future__ import annotations

import argparse
import itertools
import tempfile
import time
from pathlib import Path

import cv2
import imagehash
import numpy as np
from common import add_smoke
from PIL import Image

from radharmony_pipeline.processing.imaging.decode import decode_grayscale
from radharmony_pipeline.processing.imaging.film_similarity import (
    SAME_FILM_MIN_CORRELATION,
    film_similarity,
    film_structure,
)
from radharmony_pipeline.processing.imaging.geometry import letterbox_geometry, resize_image
from radharmony_pipeline.processing.imaging.perceptual_hash import (
    hamming,
    hashes_to_words,
    perceptual_hash,
)
from radharmony_pipeline.synthetic import generate_datasets
from radharmony_pipeline.synthetic.look_alikes import (
    COPY_KINDS,
    look_alike_radiograph,
    resized_like_images_stage,
)

SIZE = 224
HASHES = {"phash": imagehash.phash, "dhash": imagehash.dhash}


def content(pixels: np.ndarray) -> Image.Image:
    geometry = letterbox_geometry(pixels.shape[0], pixels.shape[1], SIZE)
    resized = resize_image(pixels, geometry)
    top, left = geometry.pad_top, geometry.pad_left
    return Image.fromarray(
        resized[top : top + geometry.resized_height, left : left + geometry.resized_width]
    )


def jpeg(pixels: np.ndarray, quality: int) -> np.ndarray:
    _, encoded = cv2.imencode(".jpg", pixels, [cv2.IMWRITE_JPEG_QUALITY, quality])
    return cv2.imdecode(encoded, cv2.IMREAD_GRAYSCALE)


def shifted(pixels: np.ndarray, d: int) -> np.ndarray:
    matrix = np.float32([[1, 0, d], [0, 1, -d]])
    size = (pixels.shape[1], pixels.shape[0])
    return cv2.warpAffine(pixels, matrix, size, borderMode=cv2.BORDER_REPLICATE)


def resized(pixels: np.ndarray, factor: float) -> np.ndarray:
    size = (round(pixels.shape[1] * factor), round(pixels.shape[0] * factor))
    return cv2.resize(pixels, size, interpolation=cv2.INTER_AREA)


def brighter(pixels: np.ndarray, factor: float) -> np.ndarray:
    return np.clip(pixels.astype(np.float32) * factor, 0, 255).astype(np.uint8)


TRANSFORMS = {
    "jpeg q40": lambda p: jpeg(p, 40),
    "jpeg q20": lambda p: jpeg(p, 20),
    "resized 0.75": lambda p: resized(p, 0.75),
    "resized 0.5": lambda p: resized(p, 0.5),
    "brightness 1.15": lambda p: brighter(p, 1.15),
    "brightness 0.8": lambda p: brighter(p, 0.8),
    "shift 2 px": lambda p: shifted(p, 2),
    "shift 4 px": lambda p: shifted(p, 4),
    "shift 8 px": lambda p: shifted(p, 8),
}


def measure_film_similarity(films: int, closest: int, side: int) -> None:
    def content(pixels: np.ndarray) -> np.ndarray:
        return resized_like_images_stage(pixels, SIZE)[1]

    def bits(a: np.ndarray, b: np.ndarray) -> int:
        words = hashes_to_words([perceptual_hash(a), perceptual_hash(b)])
        return int(hamming(words[:1], words[1:])[0])

    print(f"film_similarity (threshold {SAME_FILM_MIN_CORRELATION}), {side} px films:")
    originals = [look_alike_radiograph(5, i, side) for i in range(films)]
    lowest_copy = 1.0
    for kind, transform in COPY_KINDS.items():
        scores, distances = [], []
        for film in originals:
            a, b = content(film), content(transform(film))
            scores.append(film_similarity(film_structure(a), film_structure(b)))
            distances.append(bits(a, b))
        inside = [s for s, d in zip(scores, distances, strict=True) if d <= 15]
        lowest_copy = min([lowest_copy, *inside])
        print(
            f"    copy {kind:<16} min {min(scores):.4f} median {np.median(scores):.4f}  "
            f"(hash bits median {np.median(distances):.0f}, max {max(distances)}; "
            f"{len(inside)} of {films} within 15)"
        )
    renders = [content(look_alike_radiograph(6, i, side)) for i in range(films * 4)]
    frames = np.array([cv2.resize(r, (64, 64), interpolation=cv2.INTER_AREA) for r in renders])
    flat = frames.reshape(len(frames), -1).astype(np.float64)
    flat -= flat.mean(axis=1, keepdims=True)
    flat /= np.linalg.norm(flat, axis=1, keepdims=True)
    upper = np.triu_indices(len(renders), 1)
    correlation = (flat @ flat.T)[upper]
    words = hashes_to_words([perceptual_hash(r) for r in renders])
    distance = hamming(words[upper[0]], words[upper[1]])
    for label, chosen in (
        ("highest pixel correlation", np.argsort(correlation)[-closest:]),
        ("closest hashes", np.argsort(distance, kind="stable")[:closest]),
    ):
        scores = [
            film_similarity(
                film_structure(renders[upper[0][k]]), film_structure(renders[upper[1][k]])
            )
            for k in chosen
        ]
        print(
            f"    different films, the {closest} pairs of {label} (pixel correlation "
            f"{correlation[chosen].min():.3f}–{correlation[chosen].max():.3f}, hash bits "
            f"{distance[chosen].min()}–{distance[chosen].max()}): similarity max "
            f"{max(scores):.4f}, median {np.median(scores):.4f}"
        )
    print(f"    lowest copy within the hash radius: {lowest_copy:.4f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=70)
    parser.add_argument("--films", type=int, default=40)
    parser.add_argument("--closest", type=int, default=40)
    parser.add_argument("--film-side", type=int, default=190)
    parser.add_argument("--only", choices=("hashes", "films"))
    add_smoke(parser)
    args = parser.parse_args()
    if args.smoke:
        args.images, args.films, args.closest = 4, 6, 3
    if args.only != "hashes":
        measure_film_similarity(args.films, args.closest, args.film_side)
    if args.only == "films":
        return
    with tempfile.TemporaryDirectory() as folder:
        generate_datasets(Path(folder), scale="tiny" if args.smoke else "small", seed=0)
        files = sorted(f for f in Path(folder).rglob("*") if f.suffix in (".png", ".jpg", ".dcm"))
        step = max(1, len(files) // args.images)
        images = [decode_grayscale(f, target_size=1 << 14).pixels for f in files[::step]]
    print(f"{len(images)} synthetic radiographs at full resolution (distances in bits)")
    for (name, function), size in itertools.product(HASHES.items(), (8, 16)):
        start = time.perf_counter()
        base = [function(content(p), hash_size=size) for p in images]
        per_image = (time.perf_counter() - start) / len(images) * 1000
        distinct = np.array([a - b for a, b in itertools.combinations(base, 2)])
        quantiles = np.percentile(distinct, [0.1, 1, 50])
        print(
            f"{name} {size * size:>3} bits ({per_image:.1f} ms/image): distinct min "
            f"{distinct.min()}, 0.1% {quantiles[0]:.0f}, 1% {quantiles[1]:.0f}, "
            f"median {quantiles[2]:.0f}"
        )
        for label, transform in TRANSFORMS.items():
            copies = np.array(
                [
                    function(content(transform(p)), hash_size=size) - b
                    for p, b in zip(images, base, strict=True)
                ]
            )
            print(f"    {label:<16} median {np.median(copies):>4.0f}  max {copies.max():>3}")


if __name__ == "__main__":
    main()
