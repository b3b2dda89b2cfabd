"""Random but realistic identifiers: MIMIC dicom ids, ReXGradient GRDN codes, DICOM UIDs."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

REXGRADIENT_UID_ROOT = "1.2.826.0.1.3680043.8.498."
# UUID-derived UIDs (PS3.5 B.2): what de-identified MIMIC-CXR DICOMs carry.
UUID_UID_ROOT = "2.25."

_UPPER_ALNUM = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
_LOWER_HEX = b"0123456789abcdef"
_DIGITS = b"0123456789"


def random_strings(rng: np.random.Generator, count: int, length: int, alphabet: bytes) -> list[str]:
    """`count` strings of `length` characters drawn from `alphabet`, built in one array."""
    letters = np.frombuffer(alphabet, dtype=np.uint8)
    codes = np.ascontiguousarray(letters[rng.integers(0, len(letters), (count, length))])
    return codes.view(f"S{length}").ravel().astype(str).tolist()


def unique(make: Callable[[int], list[str]], count: int) -> list[str]:
    """Draw from `make` until `count` distinct values exist; keeps the first-drawn order."""
    seen: dict[str, None] = {}
    while len(seen) < count:
        seen.update(dict.fromkeys(make(count - len(seen))))
    return list(seen)


def grdn_codes(rng: np.random.Generator, count: int) -> list[str]:
    """Distinct ReXGradient PatientID/AccessionNumber codes: `GRDN` + 12 of [A-Z0-9]."""
    return unique(lambda n: ["GRDN" + s for s in random_strings(rng, n, 12, _UPPER_ALNUM)], count)


def dicom_uids(
    rng: np.random.Generator, count: int, root: str = REXGRADIENT_UID_ROOT, digits: int = 36
) -> list[str]:
    """Distinct UIDs under `root`: a decimal suffix without a leading zero (PS3.5 9.1)."""
    if len(root) + digits > 64:
        raise ValueError(f"a UID is at most 64 characters; {root!r} + {digits} digits is longer")

    def make(n: int) -> list[str]:
        heads = random_strings(rng, n, 1, b"123456789")
        tails = random_strings(rng, n, digits - 1, _DIGITS)
        return [root + head + tail for head, tail in zip(heads, tails, strict=True)]

    return unique(make, count)


def mimic_dicom_ids(rng: np.random.Generator, count: int) -> list[str]:
    """Distinct MIMIC-CXR dicom_ids: five groups of eight lowercase hex digits."""

    def make(n: int) -> list[str]:
        flat = random_strings(rng, n, 40, _LOWER_HEX)
        return ["-".join(s[i : i + 8] for i in range(0, 40, 8)) for s in flat]

    return unique(make, count)


def distinct_integers(rng: np.random.Generator, count: int, low: int, high: int) -> list[int]:
    """`count` distinct integers in [low, high), in random order."""
    return [int(v) + low for v in rng.choice(high - low, size=count, replace=False)]
