"""Boxes into the normalized `[y_min, y_max, x_min, x_max]` convention, vectorized over rows.

Convention: pixel boxes use continuous pixel-edge coordinates. A box at x, y with width w and
height h covers columns x … x+w−1 and rows y … y+h−1, i.e. the edge intervals [x, x+w) and
[y, y+h). In an image W pixels wide and H pixels high it normalizes to
x_min = x / W, x_max = (x + w) / W, y_min = y / H, y_max = (y + h) / H, all in [0, 1].
MS-CXR's `x, y, w, h` are such boxes in `image_width × image_height`; ChestX-Det's
`[x1, y1, x2, y2]` corners are read as edges in its 1024×1024 frame: the reader turns them
into x = x1, w = x2 − x1, so x_max = x2 / W. Boxes are clipped to [0, W] × [0, H] in pixel
space before normalizing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeAlias

import numpy as np
import pandas as pd

NORMALIZED_COLUMNS: tuple[str, ...] = ("y_min", "y_max", "x_min", "x_max")
PIXEL_COLUMNS: tuple[str, ...] = ("x_px", "y_px", "w_px", "h_px")
BOX_COLUMNS: tuple[str, ...] = NORMALIZED_COLUMNS + PIXEL_COLUMNS

Values: TypeAlias = "np.ndarray | pd.Series | Sequence[float] | float"


@dataclass(frozen=True)
class BoxConversion:
    """Normalized boxes (`BOX_COLUMNS`) with per-row flags, in the order of the input rows.

    `table` keeps the index of the first coordinate when it is a pandas Series, so it lines up
    with the caller's frame. Pixel columns are nullable Int64: <NA> where a coordinate or the
    frame size is missing. `clipped`: the box reached outside the frame and was cut to it.
    `degenerate`: after clipping the box has no area, or its coordinates or frame size are
    missing or not positive; such rows are kept so the caller can report them.
    """

    table: pd.DataFrame
    clipped: np.ndarray
    degenerate: np.ndarray

    def __len__(self) -> int:
        return len(self.table)


def normalize_xywh(
    x: Values, y: Values, w: Values, h: Values, width: Values, height: Values
) -> BoxConversion:
    """Top-left + size boxes (MS-CXR) in frames of `width × height` (scalars or per row)."""
    left, top = float_array(x), float_array(y)
    return _normalize_edges(
        left, top, left + float_array(w), top + float_array(h), width, height, index=_index_of(x)
    )


def _normalize_edges(left, top, right, bottom, width, height, index) -> BoxConversion:
    left, top, right, bottom, frame_w, frame_h = np.broadcast_arrays(
        *np.atleast_1d(left, top, right, bottom, float_array(width), float_array(height))
    )
    usable = _usable(left, top, right, bottom, frame_w, frame_h)
    # Unusable rows get a harmless frame so the arithmetic below raises no warnings; their
    # results are masked out afterwards.
    frame_w = np.where(usable, frame_w, 1.0)
    frame_h = np.where(usable, frame_h, 1.0)
    left, right, clipped_x = _clip_interval(left, right, frame_w)
    top, bottom, clipped_y = _clip_interval(top, bottom, frame_h)
    degenerate = ~usable | (right <= left) | (bottom <= top)
    normalized = {
        "y_min": top / frame_h,
        "y_max": bottom / frame_h,
        "x_min": left / frame_w,
        "x_max": right / frame_w,
    }
    table = pd.DataFrame(
        {name: np.where(usable, values, np.nan) for name, values in normalized.items()},
        index=index if index is not None else pd.RangeIndex(len(left)),
    )
    for name, values in _pixel_columns(left, top, right, bottom).items():
        table[name] = pd.arrays.IntegerArray(np.where(usable, values, 0), mask=~usable)
    return BoxConversion(
        table=table, clipped=(clipped_x | clipped_y) & usable, degenerate=degenerate
    )


def _usable(left, top, right, bottom, frame_w, frame_h) -> np.ndarray:
    """Rows whose coordinates are present and whose frame has a positive size."""
    finite = np.isfinite(left) & np.isfinite(top) & np.isfinite(right) & np.isfinite(bottom)
    # NaN compares False, so a missing frame size is unusable too.
    return finite & (frame_w > 0) & (frame_h > 0)


def _clip_interval(low, high, size) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Cut the edge interval [low, high) to [0, size]; also say which rows were cut."""
    outside = (low < 0) | (low > size) | (high < 0) | (high > size)
    return np.clip(low, 0, size), np.clip(high, 0, size), outside


def _pixel_columns(left, top, right, bottom) -> dict[str, np.ndarray]:
    """Integer x, y, w, h; sizes come from rounded edges so x + w is the rounded right edge."""
    left, top, right, bottom = (_round_half_up(edge) for edge in (left, top, right, bottom))
    return {"x_px": left, "y_px": top, "w_px": right - left, "h_px": bottom - top}


def _round_half_up(values: np.ndarray) -> np.ndarray:
    # Not np.rint: round-half-to-even would move .5 edges by parity, not by position.
    return np.floor(np.nan_to_num(values) + 0.5).astype(np.int64)


def float_array(values: Values) -> np.ndarray:
    """Float64 array; pandas missing values (NA, None) become NaN."""
    if isinstance(values, (pd.Series, pd.Index)):
        return pd.to_numeric(values, errors="coerce").to_numpy(dtype="float64", na_value=np.nan)
    return np.asarray(values, dtype="float64")


def _index_of(values: Values) -> pd.Index | None:
    return values.index if isinstance(values, pd.Series) else None
