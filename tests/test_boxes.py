"""Box normalization: round trips, clipping, degenerate rows and row order."""

from __future__ import annotations

import numpy as np
import pandas as pd

from radharmony_pipeline.processing.annotations.boxes import BOX_COLUMNS, normalize_xywh


def random_xywh_boxes(count: int, seed: int = 0) -> pd.DataFrame:
    """Boxes inside non-square frames whose sizes differ row to row, like MS-CXR's."""
    rng = np.random.default_rng(seed)
    width = rng.integers(1800, 3500, count)
    height = rng.integers(1800, 3500, count)
    w = rng.integers(1, 900, count)
    h = rng.integers(1, 900, count)
    x = (rng.random(count) * (width - w)).astype(int)
    y = (rng.random(count) * (height - h)).astype(int)
    return pd.DataFrame({"x": x, "y": y, "w": w, "h": h, "width": width, "height": height})


def test_ms_cxr_boxes_round_trip_to_their_pixels():
    boxes = random_xywh_boxes(5000)
    assert (boxes["width"] != boxes["height"]).mean() > 0.99
    result = normalize_xywh(
        boxes["x"], boxes["y"], boxes["w"], boxes["h"], boxes["width"], boxes["height"]
    )
    table = result.table
    assert list(table.columns) == list(BOX_COLUMNS)
    assert not result.clipped.any() and not result.degenerate.any()
    np.testing.assert_allclose(table["x_min"], boxes["x"] / boxes["width"])
    np.testing.assert_allclose(table["y_max"], (boxes["y"] + boxes["h"]) / boxes["height"])
    # Back to whole pixels with the test's own rounding of the normalized edges.
    left = np.rint(table["x_min"] * boxes["width"]).astype(int)
    right = np.rint(table["x_max"] * boxes["width"]).astype(int)
    top = np.rint(table["y_min"] * boxes["height"]).astype(int)
    bottom = np.rint(table["y_max"] * boxes["height"]).astype(int)
    np.testing.assert_array_equal(left, boxes["x"])
    np.testing.assert_array_equal(right - left, boxes["w"])
    np.testing.assert_array_equal(top, boxes["y"])
    np.testing.assert_array_equal(bottom - top, boxes["h"])
    for axis in ("x", "y", "w", "h"):
        np.testing.assert_array_equal(table[f"{axis}_px"].to_numpy(dtype=int), boxes[axis])


def test_a_phrase_with_several_boxes_keeps_its_rows_in_order():
    rows = pd.DataFrame(
        {
            "label_text": ["bilateral effusions"] * 3 + ["cardiomegaly"],
            "x": [100, 2000, 50, 900],
            "y": [1500, 1600, 10, 800],
            "w": [400, 300, 20, 1200],
            "h": [500, 450, 30, 900],
        },
        index=[40, 41, 42, 43],
    )
    result = normalize_xywh(rows["x"], rows["y"], rows["w"], rows["h"], 2500, 3000)
    assert list(result.table.index) == [40, 41, 42, 43]
    joined = rows.join(result.table)
    phrase = joined[joined["label_text"] == "bilateral effusions"]
    assert list(phrase["x_px"]) == [100, 2000, 50]
    np.testing.assert_allclose(phrase["x_min"], [100 / 2500, 2000 / 2500, 50 / 2500])


def test_boxes_partly_outside_are_clipped_and_flagged():
    # Left edge before 0, bottom past the frame, right past the frame, inside.
    result = normalize_xywh(
        [-30, 10, 150, 20], [5, 180, 20, 20], [60, 50, 80, 10], [10, 40, 10, 10], 200, 200
    )
    table = result.table
    assert list(result.clipped) == [True, True, True, False]
    assert not result.degenerate.any()
    assert table[["y_min", "y_max", "x_min", "x_max"]].stack().between(0, 1).all()
    assert list(table["x_px"]) == [0, 10, 150, 20]
    assert list(table["w_px"]) == [30, 50, 50, 10]
    assert list(table["h_px"]) == [10, 20, 10, 10]
    assert table.loc[2, "x_max"] == 1.0 and table.loc[1, "y_max"] == 1.0


def test_degenerate_boxes_are_flagged_and_kept():
    # Entirely right of the frame, zero width, negative height, corners swapped, missing.
    x = pd.Series([250, 10, 10, 50, np.nan])
    result = normalize_xywh(
        x, [10, 10, 10, 10, 10], [20, 0, 20, -20, 5], [20, 20, -5, 10, 5], 200, 100
    )
    assert len(result) == 5
    assert list(result.degenerate) == [True, True, True, True, True]
    assert result.clipped[0]
    assert result.table["x_px"].isna().tolist() == [False, False, False, False, True]
    finite = result.table[["y_min", "y_max", "x_min", "x_max"]].dropna().stack()
    assert finite.between(0, 1).all()


def test_a_missing_or_empty_frame_makes_the_row_degenerate():
    result = normalize_xywh(
        [1, 1, 1], [1, 1, 1], [5, 5, 5], [5, 5, 5], pd.Series([100, np.nan, 0]), [100, 100, 100]
    )
    assert result.degenerate.tolist() == [False, True, True]
    assert result.table["x_min"].isna().tolist() == [False, True, True]


def test_kept_boxes_have_min_below_max():
    boxes = random_xywh_boxes(2000, seed=3)
    boxes["x"] -= 500  # push some outside, to clip
    result = normalize_xywh(
        boxes["x"], boxes["y"], boxes["w"], boxes["h"], boxes["width"], boxes["height"]
    )
    kept = result.table[~result.degenerate]
    assert result.degenerate.any() and len(kept) > 1000
    assert (kept["y_min"] < kept["y_max"]).all()
    assert (kept["x_min"] < kept["x_max"]).all()
