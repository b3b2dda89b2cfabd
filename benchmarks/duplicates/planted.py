"""The inputs of bench_duplicates.py's searches, with known answers: look-alike radiographs'
hashes with planted copies of every kind (the corpus search), and NIH-like fingerprints in
clusters with ChestX-Det children planted among them (the parent links)."""

from __future__ import annotations

from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd

from radharmony_pipeline.processing.imaging.perceptual_hash import hashes_to_words, perceptual_hash
from radharmony_pipeline.processing.storage.output_layout import packed_images
from radharmony_pipeline.synthetic.look_alikes import (
    COPY_KINDS,
    look_alike_radiograph,
    resized_like_images_stage,
)

SIZE = 224
PARTITION = "rexgradient.train"
WORDS = 4  # 64-bit words in a 256-bit hash

# --- look-alike radiographs with planted copies ---------------------------------------------


def _hash_chunk(seed: int, side: int, start: int, stop: int) -> np.ndarray:
    hashes = [perceptual_hash(look_alike_radiograph(seed, i, side)) for i in range(start, stop)]
    return hashes_to_words(hashes)


def look_alike_words(cache: Path, seed: int, side: int, count: int, chunk: int) -> np.ndarray:
    """Hashes of renders 0..count-1, from the cache (files of `chunk` renders) or rendered
    on 2 processes (in this one for a single chunk: a pool's start costs more)."""
    cache.mkdir(parents=True, exist_ok=True)
    starts = range(0, count, chunk)
    files = {s: cache / f"h{side}_seed{seed}_{s}.npy" for s in starts}
    missing = [s for s in starts if not files[s].exists()]
    if len(missing) == 1:
        np.save(files[missing[0]], _hash_chunk(seed, side, missing[0], missing[0] + chunk))
    elif missing:
        print(f"rendering {len(missing) * chunk:,} look-alike radiographs at {side} px …")
        with ProcessPoolExecutor(2) as pool:
            futures = {s: pool.submit(_hash_chunk, seed, side, s, s + chunk) for s in missing}
            for s, future in futures.items():
                np.save(files[s], future.result())
    return np.concatenate([np.load(files[s]) for s in starts])[:count]


def content_hash(pixels: np.ndarray) -> tuple[np.ndarray, str]:
    framed, content = resized_like_images_stage(pixels, SIZE)
    return framed, perceptual_hash(content)


def plant_copies(
    words: np.ndarray, planted: int, film_side: int, seed: int
) -> tuple[np.ndarray, list[tuple[int, int, str]], dict[int, np.ndarray]]:
    """Copies appended after the look-alikes, their originals' hashes taken from the same
    pixels: (words, [(original, copy, kind)], framed pixels of every planted row)."""
    rng = np.random.default_rng(seed)
    originals = rng.choice(len(words), size=planted, replace=False)
    kinds = sorted(COPY_KINDS)
    words = words.copy()
    extra, truth, pixels = [], [], {}
    for k, original in enumerate(originals.tolist()):
        kind = kinds[k % len(kinds)]
        film = look_alike_radiograph(seed, original, film_side)
        pixels[original], words_hex = content_hash(film)
        words[original] = hashes_to_words([words_hex])[0]
        framed, copy_hex = content_hash(COPY_KINDS[kind](film))
        copy_row = len(words) + k
        pixels[copy_row] = framed
        extra.append(copy_hex)
        truth.append((original, copy_row, kind))
    return np.concatenate([words, hashes_to_words(extra)]), truth, pixels


def images_table(words: np.ndarray, rows: np.ndarray, film_side: int) -> pd.DataFrame:
    """The `images` table's rows the step reads, for these rows of `words`."""
    return pd.DataFrame(
        {
            "image_id": [f"rexgradient/{r:07d}" for r in rows],
            "dataset": "rexgradient",
            "split": "train",
            "image_path": [f"images/{PARTITION}/{r:07d}.png" for r in rows],
            "perceptual_hash": [w.astype(">u8").tobytes().hex() for w in words[rows]],
            "source_sha256": [f"source-{r}" for r in rows],
            "pixels_sha256": [f"pixels-{r}" for r in rows],
            "tensor_index": rows,
            "resize": "letterbox",
            "orig_height": film_side,
            "orig_width": film_side,
            "size": SIZE,
        }
    )


def write_packed(
    root: Path, total: int, needed: set[int], pixels: dict[int, np.ndarray], seed: int, side: int
) -> None:
    """A packed array of `total` rows (sparse on disk) holding the rows the run reads."""
    path = root / packed_images(PARTITION)
    path.parent.mkdir(parents=True, exist_ok=True)
    array = np.lib.format.open_memmap(path, mode="w+", dtype=np.uint8, shape=(total, SIZE, SIZE))
    for row in sorted(needed):
        if row not in pixels:
            pixels[row] = content_hash(look_alike_radiograph(seed, row, side))[0]
        array[row] = pixels[row]
    array.flush()
    del array


# --- NIH-like fingerprints with ChestX-Det children planted among them -----------------------


def _flips(rng: np.random.Generator, rows: int, p: float) -> np.ndarray:
    bits = rng.random((rows, WORDS * 64)) < p
    return np.packbits(bits, axis=1).view(">u8").astype(np.uint64)


def _k_flips(rng: np.random.Generator, ks: np.ndarray) -> np.ndarray:
    bits = np.zeros((len(ks), WORDS * 64), dtype=bool)
    for row, k in enumerate(ks):
        bits[row, rng.choice(WORDS * 64, size=k, replace=False)] = True
    return np.packbits(bits, axis=1).view(">u8").astype(np.uint64)


def _hex(words: np.ndarray) -> list[str]:
    raw = words.astype(">u8").tobytes()
    step = WORDS * 8
    return [raw[i : i + step].hex() for i in range(0, len(raw), step)]


def _digests(rng: np.random.Generator, count: int) -> list[str]:
    return [bytes(row).hex() for row in rng.integers(0, 256, size=(count, 32), dtype=np.uint8)]


def planted_fingerprints(
    rng: np.random.Generator, nih: int, children: int, clusters: int, flip: float
) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, str | None]]:
    """(NIH fingerprints, ChestX-Det fingerprints, planted link of every child). NIH films
    spread as radiographs do: clusters of look-alikes, each bit of a member off its cluster's
    centre with probability `flip`. Children: the same file, the same pixels in another file,
    re-encoded (1 to 7 hash bits away), or absent from NIH (fresh cluster members)."""
    centres = rng.integers(0, 2**64, size=(clusters, WORDS), dtype=np.uint64)
    words = centres[rng.integers(0, clusters, size=nih)] ^ _flips(rng, nih, flip)
    parents = pd.DataFrame(
        {
            "parent_image_id": [f"{i // 10:08d}_{i % 10:03d}.png" for i in range(nih)],
            "source_sha256": _digests(rng, nih),
            "pixels_sha256": _digests(rng, nih),
            "perceptual_hash": _hex(words),
        }
    )
    absent = children // 100 + 1
    linked = rng.choice(nih, size=children - absent, replace=False)
    kind = rng.choice(3, size=len(linked), p=[0.85, 0.05, 0.10])
    child_words = words[linked].copy()
    near = kind == 2
    child_words[near] ^= _k_flips(rng, rng.integers(1, 8, size=int(near.sum())))
    fresh = centres[rng.integers(0, clusters, size=absent)] ^ _flips(rng, absent, flip)
    source = np.where(kind == 0, parents["source_sha256"].to_numpy()[linked], None)
    pixels = np.where(kind <= 1, parents["pixels_sha256"].to_numpy()[linked], None)
    ids = [f"chestx_det/{i}" for i in range(children)]
    frame = pd.DataFrame(
        {
            "image_id": ids,
            "source_sha256": [
                *(s or d for s, d in zip(source, _digests(rng, len(linked)), strict=True)),
                *_digests(rng, absent),
            ],
            "pixels_sha256": [
                *(p or d for p, d in zip(pixels, _digests(rng, len(linked)), strict=True)),
                *_digests(rng, absent),
            ],
            "perceptual_hash": _hex(np.concatenate([child_words, fresh])),
        }
    )
    links = [*parents["parent_image_id"].to_numpy()[linked].tolist(), *[None] * absent]
    return parents, frame, dict(zip(ids, links, strict=True))
