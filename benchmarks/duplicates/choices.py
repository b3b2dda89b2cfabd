"""The measurements behind the choices of bench_duplicates.py's question: the perceptual hash
(`hashes`), the confirmation threshold on pixels (`films`; docs/design-notes.md, "Near
duplicates"), and the searches the exact one was chosen over (the one before issue 30,
faiss-cpu's binary indexes)."""

from __future__ import annotations

import itertools
import tempfile
import time
from pathlib import Path

import cv2
import imagehash
import numpy as np
from common import Table
from PIL import Image

from radharmony_pipeline.processing.imaging.decode import decode_grayscale
from radharmony_pipeline.processing.imaging.film_similarity import (
    SAME_FILM_MIN_CORRELATION,
    film_similarity,
    film_structure,
)
from radharmony_pipeline.processing.imaging.perceptual_hash import (
    close_pairs,
    hamming,
    hashes_to_words,
    perceptual_hash,
)
from radharmony_pipeline.synthetic import generate_datasets
from radharmony_pipeline.synthetic.look_alikes import (
    COPY_KINDS,
    brightened,
    downscaled,
    jpeg_round_trip,
    look_alike_radiograph,
    resized_like_images_stage,
)

SIZE = 224
RADIUS = 15
HASHES = {"phash": imagehash.phash, "dhash": imagehash.dhash}


def shifted_pixels(pixels: np.ndarray, d: int) -> np.ndarray:
    """Moved right and up by `d` pixels, the edge repeated into the gap."""
    matrix = np.float32([[1, 0, d], [0, 1, -d]])
    size = (pixels.shape[1], pixels.shape[0])
    return cv2.warpAffine(pixels, matrix, size, borderMode=cv2.BORDER_REPLICATE)


# Each copy the synthetic generator plants, and harsher ones; the table shows the marked.
TRANSFORMS = {
    "jpeg q40": lambda p: jpeg_round_trip(p, 40),
    "JPEG q20": lambda p: jpeg_round_trip(p, 20),
    "resized ×0.75": lambda p: downscaled(p, 0.75),
    "resized ×0.5": lambda p: downscaled(p, 0.5),
    "brightness ×1.15": lambda p: brightened(p, 1.15),
    "brightness ×0.8": lambda p: brightened(p, 0.8),
    "shift 2 px": lambda p: shifted_pixels(p, 2),
    "shift 4 px": lambda p: shifted_pixels(p, 4),
    "shift 8 px": lambda p: shifted_pixels(p, 8),
}
SHOWN = ("JPEG q20", "resized ×0.5", "brightness ×1.15", "shift 2 px", "shift 4 px", "shift 8 px")


def content(pixels: np.ndarray) -> Image.Image:
    return Image.fromarray(resized_like_images_stage(pixels, SIZE)[1])


def hashes_section(images: int, smoke: bool) -> Table:
    """Bit distances between distinct radiographs and between each and its copies, for pHash
    and dHash at 64 and 256 bits, on the synthetic datasets decoded as the stage does."""
    with tempfile.TemporaryDirectory() as folder:
        # A smoke run decodes one tiny dataset's films: enough to run every line below.
        chosen = ["chexlocalize"] if smoke else None
        generate_datasets(Path(folder), "tiny" if smoke else "small", 0, datasets=chosen)
        files = sorted(f for f in Path(folder).rglob("*") if f.suffix in (".png", ".jpg", ".dcm"))
        step = max(1, len(files) // images)
        films = [decode_grayscale(f, target_size=1 << 14).pixels for f in files[::step]]
    print(f"{len(films)} synthetic radiographs at full resolution (distances in bits)")
    rows, figures = [], {}
    for (name, function), size in itertools.product(HASHES.items(), (8, 16)):
        start = time.perf_counter()
        base = [function(content(p), hash_size=size) for p in films]
        per_image = (time.perf_counter() - start) / len(films) * 1000
        distinct = np.array([a - b for a, b in itertools.combinations(base, 2)])
        quantiles = np.percentile(distinct, [0.1, 1, 50])
        label = f"{'pHash' if name == 'phash' else 'dHash'} {size * size}"
        print(
            f"{label} bits ({per_image:.1f} ms/image): distinct min {distinct.min()}, 0.1% "
            f"{quantiles[0]:.0f}, 1% {quantiles[1]:.0f}, median {quantiles[2]:.0f}"
        )
        copies = {}
        for kind, transform in TRANSFORMS.items():
            bits = [
                function(content(transform(p)), hash_size=size) - b
                for p, b in zip(films, base, strict=True)
            ]
            copies[kind] = {"median": float(np.median(bits)), "max": int(max(bits))}
            print(f"    {kind:<16} median {np.median(bits):>4.0f}  max {max(bits):>3}")
        figures[label] = {
            "ms_per_image": per_image,
            "distinct": [int(distinct.min()), *quantiles.tolist()],
            "copies": copies,
        }
        chosen = f" (chosen, radius {RADIUS})" if label == "dHash 256" else ""
        spread = f"{distinct.min()} / {quantiles[0]:.0f} / {quantiles[2]:.0f}"
        rows.append([label + chosen, spread, *(f"≤ {copies[kind]['max']}" for kind in SHOWN)])
    columns = ["hash", "distinct: min / 0.1 % / median", *SHOWN]
    figures["films"] = len(films)
    return Table("hash_choice", "The hash choice", columns, rows, figures, "", "--section hashes")


def films_section(films: int, closest: int, side: int) -> Table:
    """film_similarity of each copy kind to its original against the most alike pairs of
    different films: the threshold must lie between."""

    def pixels(film: np.ndarray) -> np.ndarray:
        return resized_like_images_stage(film, SIZE)[1]

    def bits(a: np.ndarray, b: np.ndarray) -> int:
        words = hashes_to_words([perceptual_hash(a), perceptual_hash(b)])
        return int(hamming(words[:1], words[1:])[0])

    print(f"film_similarity (threshold {SAME_FILM_MIN_CORRELATION}), {side} px films:")
    originals = [look_alike_radiograph(5, i, side) for i in range(films)]
    rows, lowest_copy = [], 1.0
    for kind, transform in COPY_KINDS.items():
        scores, distances = [], []
        for film in originals:
            a, b = pixels(film), pixels(transform(film))
            scores.append(film_similarity(film_structure(a), film_structure(b)))
            distances.append(bits(a, b))
        inside = [s for s, d in zip(scores, distances, strict=True) if d <= RADIUS]
        lowest_copy = min([lowest_copy, *inside])
        rows.append(
            [
                f"copy: {kind}",
                f"{min(scores):.4f}",
                f"{np.median(scores):.4f}",
                f"median {np.median(distances):.0f}, max {max(distances)}",
            ]
        )
    renders = [pixels(look_alike_radiograph(6, i, side)) for i in range(films * 4)]
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
        rows.append(
            [
                f"different films: the {closest} pairs of {label}",
                "",
                f"max {max(scores):.4f}, median {np.median(scores):.4f}",
                f"{distance[chosen].min()}–{distance[chosen].max()}",
            ]
        )
    for row in rows:
        print("    " + " | ".join(row))
    print(f"    lowest copy within the hash radius: {lowest_copy:.4f}")
    return Table(
        "film_similarity",
        f"Copies and different films by pixels (threshold {SAME_FILM_MIN_CORRELATION})",
        ["pair", "similarity min", "similarity", "hash bits"],
        rows,
        {"films": films, "lowest_copy_within_radius": lowest_copy},
        f"Lowest copy within the hash radius: {lowest_copy:.4f}.",
        "--section films",
    )


def old_search(words: np.ndarray, radius: int) -> tuple[int, int]:
    """The search before issue 30: 16 blocks of 16 bits, pairs sharing a block value
    compared in NumPy (offset by offset in each run). Returns (candidates, pairs found)."""
    shifts = np.arange(0, 64, 16, dtype=np.uint64)
    blocks = ((words[:, :, None] >> shifts[None, None, :]) & np.uint64(0xFFFF)).reshape(
        len(words), -1
    )
    candidates, found = 0, set()
    for block in range(blocks.shape[1]):
        order = np.argsort(blocks[:, block], kind="stable")
        ordered = blocks[order, block]
        starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
        lengths = np.diff(np.r_[starts, len(ordered)])
        positions = np.flatnonzero(np.repeat(lengths > 1, lengths))
        run_end = np.repeat(starts + lengths, lengths)[positions]
        offset = 1
        while len(positions):
            keep = positions + offset < run_end
            positions, run_end = positions[keep], run_end[keep]
            for start in range(0, len(positions), 250_000):
                left = order[positions[start : start + 250_000]]
                right = order[positions[start : start + 250_000] + offset]
                candidates += len(left)
                close = hamming(words[left], words[right]) <= radius
                found.update(zip(left[close].tolist(), right[close].tolist(), strict=True))
            offset += 1
    return candidates, len({(min(a, b), max(a, b)) for a, b in found})


def faiss_comparison(words: np.ndarray, radius: int) -> None:
    """faiss-cpu's multi-index hashing (8 x 32 bits, one flip) and flat range search against
    close_pairs on the same hashes."""
    try:
        import faiss
    except ImportError:
        print("faiss-cpu is not installed: `.venv/bin/pip install 'faiss-cpu>=1.15,<1.16'`")
        return
    codes = np.ascontiguousarray(words.astype(">u8").view(np.uint8))
    start = time.perf_counter()
    ours = len(close_pairs(words, radius))
    line = f"close_pairs {time.perf_counter() - start:.1f} s ({ours} pairs)"
    multi = faiss.IndexBinaryMultiHash(256, 8, 32)
    multi.nflip = 1
    for name, index in (
        ("IndexBinaryMultiHash 8x32 nflip 1", multi),
        ("IndexBinaryFlat range_search", faiss.IndexBinaryFlat(256)),
    ):
        start = time.perf_counter()
        index.add(codes)
        limits, _, found = index.range_search(codes, radius + 1)
        query = np.repeat(np.arange(len(words)), np.diff(limits).astype(np.int64))
        line += f"; {name} {time.perf_counter() - start:.1f} s ({int((query < found).sum())} pairs)"
    print(f"faiss on {len(words):,} hashes ({faiss.omp_get_max_threads()} threads): {line}")
