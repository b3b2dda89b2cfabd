"""Resize geometry: letterbox placement, squash scales, and masks and boxes that stay aligned."""

from __future__ import annotations

import cv2
import numpy as np
import pandas as pd
import pytest

from radharmony_pipeline.processing.imaging.geometry import (
    ResizeGeometry,
    boxes_to_resized_frame,
    letterbox_geometry,
    resize_image,
    resize_mask,
    shrink_by_area,
    squash_geometry,
)

S = 224

# source (height, width) → letterbox (resized_height, resized_width, pad_top, pad_left),
# worked out by hand: short side = round(short · 224 / long), padding = (224 − side) // 2.
LETTERBOX_CASES = {
    (2828, 2320): (224, 184, 0, 20),  # 2320 · 224 / 2828 = 183.76
    (2320, 2828): (184, 224, 20, 0),
    (300, 1000): (67, 224, 78, 0),  # 300 · 224 / 1000 = 67.2
    (1000, 300): (224, 67, 0, 78),
}
SOURCES = list(LETTERBOX_CASES)
GEOMETRIES = {"letterbox": letterbox_geometry, "squash": squash_geometry}


def rectangle_mask(
    height: int, width: int, top: int, left: int, bottom: int, right: int, on: int = 1
) -> np.ndarray:
    """Foreground on rows top … bottom−1 and columns left … right−1 (edges [top, bottom))."""
    mask = np.zeros((height, width), dtype=np.uint8)
    mask[top:bottom, left:right] = on
    return mask


def known_rectangle(height: int, width: int) -> tuple[int, int, int, int]:
    """A lesion-sized rectangle at odd, off-centre pixel edges of the source frame."""
    return (
        int(height * 0.31) + 1,
        int(width * 0.17) + 3,
        int(height * 0.58) + 1,
        int(width * 0.49) + 3,
    )


def rasterize_box(y_min: float, y_max: float, x_min: float, x_max: float, size: int) -> np.ndarray:
    """Output pixels whose centres lie inside the normalized box's edge interval."""
    centres = (np.arange(size) + 0.5) / size
    rows = (centres >= y_min) & (centres < y_max)
    cols = (centres >= x_min) & (centres < x_max)
    return rows[:, None] & cols[None, :]


def iou(a: np.ndarray, b: np.ndarray) -> float:
    return float((a & b).sum() / (a | b).sum())


def foreground_edges(mask: np.ndarray) -> tuple[int, int, int, int]:
    rows = np.flatnonzero(mask.any(axis=1))
    cols = np.flatnonzero(mask.any(axis=0))
    return rows[0], rows[-1] + 1, cols[0], cols[-1] + 1


@pytest.mark.parametrize("source", SOURCES)
def test_letterbox_puts_the_long_side_at_s_and_centres_the_content(source):
    height, width = source
    geometry = letterbox_geometry(height, width, S)
    placement = (
        geometry.resized_height,
        geometry.resized_width,
        geometry.pad_top,
        geometry.pad_left,
    )
    assert placement == LETTERBOX_CASES[source]
    assert max(geometry.resized_height, geometry.resized_width) == S
    assert geometry.scale == geometry.scale_y == geometry.scale_x == S / max(height, width)
    pad_bottom = S - geometry.pad_top - geometry.resized_height
    pad_right = S - geometry.pad_left - geometry.resized_width
    assert abs(geometry.pad_top - pad_bottom) <= 1
    assert abs(geometry.pad_left - pad_right) <= 1


@pytest.mark.parametrize("source", SOURCES)
def test_squash_fills_the_frame_with_a_scale_per_axis(source):
    height, width = source
    geometry = squash_geometry(height, width, S)
    assert (geometry.pad_top, geometry.pad_left) == (0, 0)
    assert (geometry.resized_height, geometry.resized_width) == (S, S)
    assert geometry.scale_y == S / height and geometry.scale_x == S / width
    assert geometry.scale_y != geometry.scale_x
    with pytest.raises(ValueError, match="scale_y"):
        _ = geometry.scale


def test_square_source_letterboxes_without_padding():
    geometry = letterbox_geometry(1024, 1024, S)
    assert (geometry.resized_height, geometry.resized_width) == (S, S)
    assert (geometry.pad_top, geometry.pad_left) == (0, 0)


@pytest.mark.parametrize(
    "bad", [(0, 100, S), (100, -1, S), (100, 100, 0), (np.nan, 100, S), (100.5, 100, S)]
)
def test_impossible_sizes_are_rejected(bad):
    with pytest.raises(ValueError, match="positive whole"):
        letterbox_geometry(*bad)


@pytest.mark.parametrize("mode", GEOMETRIES)
@pytest.mark.parametrize("source", SOURCES)
def test_box_follows_the_mask_through_the_resize(mode, source):
    height, width = source
    geometry = GEOMETRIES[mode](height, width, S)
    top, left, bottom, right = known_rectangle(height, width)
    mask = rectangle_mask(height, width, top, left, bottom, right)
    # The tight box in the pixel-edge convention of boxes.py.
    box = boxes_to_resized_frame(
        top / height, bottom / height, left / width, right / width, geometry
    )

    resized = resize_mask(mask, geometry).astype(bool)
    box_pixels = rasterize_box(*(float(edge) for edge in box), S)

    assert iou(box_pixels, resized) >= 0.9
    expected_edges = np.array(box) * S
    np.testing.assert_allclose(foreground_edges(resized), expected_edges, atol=1.0)


def test_boxes_map_through_the_padding_formula_vectorized():
    geometry = letterbox_geometry(300, 1000, S)  # resized 67 high, 78 rows of top padding
    y_min = np.array([0.0, 0.25, 1.0])
    x_min = np.array([0.0, 0.5, 1.0])
    y_out, y_out_max, x_out, _ = boxes_to_resized_frame(y_min, y_min, x_min, x_min, geometry)
    np.testing.assert_allclose(y_out, (78 + y_min * 67) / S)
    np.testing.assert_allclose(x_out, x_min)  # the long side has no padding
    np.testing.assert_array_equal(y_out, y_out_max)
    assert y_out.shape == (3,) and y_out.dtype == np.float64


def test_boxes_accept_series_with_missing_values():
    geometry = letterbox_geometry(2828, 2320, S)
    column = pd.Series([0.5, None], dtype="Float64")
    y_out, _, x_out, _ = boxes_to_resized_frame(column, column, column, column, geometry)
    assert y_out[0] == 0.5 and np.isnan(y_out[1])
    assert x_out[0] == pytest.approx((20 + 0.5 * 184) / S)


@pytest.mark.parametrize("source", SOURCES)
def test_resized_image_is_s_by_s_uint8_with_zero_padding_bands(source):
    height, width = source
    geometry = letterbox_geometry(height, width, S)
    pixels = np.full((height, width), 200, dtype=np.uint8)

    resized = resize_image(pixels, geometry)

    assert resized.shape == (S, S) and resized.dtype == np.uint8
    content = content_area(resized, geometry)
    assert (content == 200).all()
    assert resized.sum() == content.sum()  # everything outside the content area is 0
    assert geometry.pad_top + geometry.pad_left > 0


def content_area(frame: np.ndarray, geometry: ResizeGeometry) -> np.ndarray:
    top, left = geometry.pad_top, geometry.pad_left
    return frame[top : top + geometry.resized_height, left : left + geometry.resized_width]


def test_reduced_dct_decode_fills_the_same_content_area():
    geometry = letterbox_geometry(2828, 2320, S)
    # A 1/8-scale JPEG decode of the 2828×2320 source: ceil(2828 / 8) × ceil(2320 / 8).
    eighth = np.full((354, 290), 90, dtype=np.uint8)
    resized = resize_image(eighth, geometry)
    assert resized.shape == (S, S)
    assert (content_area(resized, geometry) == 90).all()
    assert (resized[:, : geometry.pad_left] == 0).all()


def test_small_source_is_enlarged():
    geometry = letterbox_geometry(60, 100, S)
    pixels = np.tile(np.linspace(0, 255, 100).astype(np.uint8), (60, 1))
    resized = resize_image(pixels, geometry)
    row = content_area(resized, geometry)[10]
    assert np.all(np.diff(row.astype(int)) >= 0)  # a smooth ramp stays monotonic


@pytest.mark.parametrize("source", [(1000, 1000), (100, 1000)])
def test_shrinking_averages_instead_of_aliasing(source):
    # Stripes one pixel wide cannot be represented at 224 pixels: an area average turns them
    # into flat mid-grey, while point sampling (linear, nearest) keeps stray black and white.
    # (100, 1000) squashed enlarges rows while shrinking columns.
    height, width = source
    stripes = np.zeros(source, dtype=np.uint8)
    stripes[:, ::2] = 255
    resized = resize_image(stripes, squash_geometry(height, width, S))
    assert resized.min() >= 100 and resized.max() <= 155


def _radiograph_like(rng: np.random.Generator, shape, top: int, dtype) -> np.ndarray:
    """Smooth content plus detector noise, as real sources have (flat images hide rounding)."""
    height, width = shape
    coarse = rng.uniform(0, top, (height // 16 + 2, width // 16 + 2)).astype(np.float32)
    smooth = cv2.resize(coarse, (width, height), interpolation=cv2.INTER_LINEAR)
    return np.clip(smooth + rng.normal(0, top / 30, shape), 0, top).astype(dtype)


def _exact_area_shrink(pixels: np.ndarray, height: int, width: int) -> np.ndarray:
    """Area resize in float64 from its definition: output pixel (i, j) is the mean of the
    source over [i, i+1) x [j, j+1) scaled to source edges, pixel by pixel overlap."""

    def weights(source: int, target: int) -> np.ndarray:
        span = source / target
        matrix = np.zeros((target, source))
        for i in range(target):
            low, high = i * span, (i + 1) * span
            for k in range(int(np.floor(low)), min(source, int(np.ceil(high)))):
                matrix[i, k] = (min(high, k + 1) - max(low, k)) / span
        return matrix

    in_height, in_width = pixels.shape
    return weights(in_height, height) @ pixels.astype(np.float64) @ weights(in_width, width).T


AREA_SHAPES = [
    ((742, 730), (224, 220)),
    ((1024, 1024), (224, 224)),
    ((3056, 2544), (224, 186)),
    ((1000, 300), (224, 67)),
    ((513, 2049), (56, 224)),
    ((400, 224), (223, 224)),  # one side kept as it is
    ((448, 448), (224, 224)),  # whole ratios: OpenCV's block means
    ((900, 600), (300, 200)),
    ((5, 4000), (1, 224)),
    ((2469, 1709), (1690, 1534)),  # under 2x: OpenCV's own weights drift here
]


@pytest.mark.slow
@pytest.mark.parametrize("dtype, top", [(np.uint8, 255), (np.uint16, 4095)])
def test_area_shrink_is_the_area_mean_rounded(dtype, top):
    rng = np.random.default_rng(7)
    shapes = list(AREA_SHAPES)
    for _ in range(8):
        source = tuple(int(v) for v in rng.integers(225, 1200, 2))
        shapes.append((source, tuple(int(rng.integers(1, side + 1)) for side in source)))
    for (height, width), (out_height, out_width) in shapes:
        pixels = _radiograph_like(rng, (height, width), top, dtype)
        shrunk = shrink_by_area(pixels, out_height, out_width)
        assert shrunk.dtype == pixels.dtype and shrunk.shape == (out_height, out_width)
        exact = _exact_area_shrink(pixels, out_height, out_width)
        # Rounding to the nearest integer, up to float32's error in the products.
        assert np.abs(shrunk - exact).max() <= 0.5 + top * 1e-6, ((height, width), shrunk.shape)


def test_area_shrink_agrees_with_what_resize_image_used_before():
    # OpenCV's INTER_AREA on 8-bit images: within one grey level, and equal but for a few
    # near-halves rounded the other way (differing float32 sums).
    rng = np.random.default_rng(11)
    differing = compared = 0
    for (height, width), (out_height, out_width) in AREA_SHAPES:
        pixels = _radiograph_like(rng, (height, width), 255, np.uint8)
        before = cv2.resize(pixels, (out_width, out_height), interpolation=cv2.INTER_AREA)
        difference = np.abs(shrink_by_area(pixels, out_height, out_width) - before.astype(int))
        assert difference.max() <= 1, ((height, width), (out_height, out_width))
        differing += int((difference > 0).sum())
        compared += difference.size
    assert differing / compared < 1e-3


def test_area_shrink_refuses_to_enlarge():
    with pytest.raises(ValueError, match="cannot shrink 10x10 to 20x5"):
        shrink_by_area(np.zeros((10, 10), np.uint8), 20, 5)


def test_resize_image_rejects_other_bit_depths():
    with pytest.raises(ValueError, match="uint8"):
        resize_image(np.zeros((10, 10), dtype=np.uint16), letterbox_geometry(10, 10, S))


@pytest.mark.parametrize("on", [1, 255])
@pytest.mark.parametrize("mode", GEOMETRIES)
def test_masks_stay_binary_in_their_own_encoding(mode, on):
    geometry = GEOMETRIES[mode](2828, 2320, S)
    rng = np.random.default_rng(3)
    mask = (rng.random((2828, 2320)) < 0.3).astype(np.uint8) * on
    resized = resize_mask(mask, geometry)
    assert resized.shape == (S, S) and resized.dtype == np.uint8
    assert set(np.unique(resized)) == {0, on}


def test_bool_mask_stays_bool():
    mask = rectangle_mask(300, 1000, 100, 250, 180, 700).astype(bool)
    resized = resize_mask(mask, letterbox_geometry(300, 1000, S))
    assert resized.dtype == bool and resized.any()
