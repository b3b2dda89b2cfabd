"""Deterministic random streams: one per (seed, dataset, purpose), independent of run order."""

from __future__ import annotations

import zlib

import numpy as np


def dataset_rng(seed: int, dataset: str, *stream: int) -> np.random.Generator:
    """A generator for `dataset` under `seed`; `stream` separates independent uses."""
    if seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed}")
    # crc32, not hash(): Python salts str hashes per process.
    return np.random.default_rng([seed, zlib.crc32(dataset.encode()), *stream])


def image_rngs(seed: int, dataset: str, count: int) -> list[np.random.Generator]:
    """One generator per image, so an image's pixels do not depend on the images before it."""
    return [dataset_rng(seed, dataset, 1, index) for index in range(count)]
