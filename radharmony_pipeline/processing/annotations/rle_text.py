"""Validation of COCO compressed RLE text before pycocotools sees it.

pycocotools trusts its input: counts that are not valid compressed-RLE text, or whose runs do
not add up to height × width, make `merge` loop forever at full CPU (negative runs wrap to
huge unsigned values). Checking the text is one vectorized pass over its bytes.

The format (pycocotools `rleToString`): each run is a little-endian sequence of 5-bit groups,
one character per group (`chr(group + 48)`, bit 0x20 set while more groups follow, bit 0x10
of the last group the sign); from the fourth run on, a run is stored as the difference to
the run two places before it.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

_FIRST_CHARACTER = 48  # "0"
_LAST_CHARACTER = _FIRST_CHARACTER + 63  # "o"
_MORE = 0x20
_SIGN = 0x10
_DATA = 0x1F
# Eight groups hold 40 bits, far more than any image's pixel count; a longer run is corrupt
# (and keeps the sums below exact in the float64 weights of np.bincount).
_MAX_GROUPS = 8


class RleTextError(ValueError):
    """RLE text that pycocotools would misread; the message says which rule it breaks and
    `field` which part of the RLE (`size`, `counts`, or `rle` for the whole)."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


def rle_size(rle: object) -> tuple[int, int]:
    """The RLE's (height, width), both positive integers."""
    if not isinstance(rle, Mapping):
        raise RleTextError(
            "rle", f"expected an object with 'size' and 'counts', got {type(rle).__name__}"
        )
    size = rle.get("size")
    if (
        not isinstance(size, (list, tuple))
        or len(size) != 2
        or not all(
            isinstance(side, (int, np.integer)) and not isinstance(side, bool) for side in size
        )
        or min(size) < 1
    ):
        raise RleTextError(
            "size", f"'size' must be [height, width] of positive integers, got {size!r}"
        )
    return int(size[0]), int(size[1])


def decoded_runs(counts: str | bytes) -> np.ndarray:
    """The run lengths a compressed counts string encodes, as int64; raises RleTextError."""
    data = counts.encode("ascii", "replace") if isinstance(counts, str) else bytes(counts)
    codes = np.frombuffer(data, dtype=np.uint8).astype(np.int64)
    if codes.size == 0:
        raise RleTextError("counts", "'counts' is empty")
    outside = (codes < _FIRST_CHARACTER) | (codes > _LAST_CHARACTER)
    if outside.any():
        position = int(np.flatnonzero(outside)[0])
        raise RleTextError(
            "counts",
            f"'counts' has character {chr(data[position])!r} at position {position}; "
            "compressed COCO RLE uses only '0'..'o'",
        )
    groups = codes - _FIRST_CHARACTER
    last = (groups & _MORE) == 0
    if not last[-1]:
        raise RleTextError("counts", "'counts' ends in the middle of a run (truncated text)")
    ends = np.flatnonzero(last)
    starts = np.concatenate(([0], ends[:-1] + 1))
    lengths = ends - starts + 1
    if lengths.max() > _MAX_GROUPS:
        raise RleTextError(
            "counts", f"'counts' has a run of {int(lengths.max())} characters (corrupt)"
        )
    run_of = np.repeat(np.arange(len(ends)), lengths)
    shift = 5 * (np.arange(len(groups)) - starts[run_of])
    values = np.bincount(run_of, weights=(groups & _DATA) << shift, minlength=len(ends))
    values = values.astype(np.int64)
    negative = (groups[ends] & _SIGN) != 0
    values[negative] -= np.left_shift(1, 5 * lengths[negative])
    runs = values.copy()
    # Runs 3, 4, ... are differences to the run two places before: undo with running sums.
    runs[1::2] = np.cumsum(values[1::2])
    runs[2::2] = np.cumsum(values[2::2])
    return runs


def validate_rle(rle: object) -> tuple[int, int]:
    """Raise RleTextError unless `rle` is a compressed COCO RLE whose runs are non-negative
    and cover exactly height × width pixels; returns (height, width)."""
    height, width = rle_size(rle)
    counts = rle.get("counts")  # type: ignore[union-attr]
    if not isinstance(counts, (str, bytes)):
        raise RleTextError(
            "counts",
            f"'counts' must be compressed RLE text, got a {type(counts).__name__} "
            "(uncompressed list counts are not used by CheXlocalize)",
        )
    runs = decoded_runs(counts)
    if (runs < 0).any():
        position = int(np.flatnonzero(runs < 0)[0])
        raise RleTextError(
            "counts",
            f"'counts' decodes to a negative run ({int(runs[position])}) at run {position}",
        )
    total = int(runs.sum())
    if total != height * width:
        raise RleTextError(
            "counts",
            f"'counts' runs cover {total} pixels but size {height}x{width} has {height * width}",
        )
    return height, width
