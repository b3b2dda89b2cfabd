"""Resizing radiographs and masks to S×S, with the geometry recorded so that boxes follow.

Convention: continuous pixel-edge coordinates, as in `boxes.py`. Source pixel (r, c) covers
the square [r, r+1) × [c, c+1), so an image H high spans the edge interval [0, H] and a
normalized coordinate v means the edge position v·H. Resizing maps the content (the whole
source) onto a `resized_height × resized_width` area whose top-left edge sits at
(`pad_top`, `pad_left`) of the S×S output:

    y_out = pad_top + y_src · resized_height / source_height     (likewise x with left, width)

and in normalized terms y'_norm = (pad_top + y_norm · resized_height) / S. OpenCV's resize
samples pixel centres with the same half-pixel alignment, so pixels, masks and boxes agree.

Letterbox keeps the aspect ratio: the long side becomes S, the short side
round(short · S / long) (halves round up, as in `boxes.py`), centred with zero padding.
`scale` is the nominal S / long; the short side's exact factor resized / source differs
from it by the rounding (under half an output pixel across the whole side), and box mapping
uses the exact one because that is what the pixels went through. Squash stretches both sides
to S: no padding, a different scale per axis.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import cv2
import numpy as np
import numpy.typing as npt

from radharmony_pipeline.processing.annotations.boxes import float_array

if TYPE_CHECKING:
    import scipy.sparse

ArrayLike = npt.ArrayLike


@dataclass(frozen=True)
class ResizeGeometry:
    """How a `source_height × source_width` image was placed into a `size × size` frame.

    `scale_y`, `scale_x`: output pixels per source pixel. `resized_height × resized_width` is
    the content area before padding; `pad_top`, `pad_left` its offset in the output.
    """

    size: int
    source_height: int
    source_width: int
    scale_y: float
    scale_x: float
    pad_top: int
    pad_left: int
    resized_height: int
    resized_width: int

    @property
    def scale(self) -> float:
        """The single scale of an aspect-preserving (letterbox) resize, as `images` stores it.

        Raises ValueError for a squash, whose axes have different scales.
        """
        if self.scale_y != self.scale_x:
            raise ValueError(
                f"this geometry stretches the axes differently (scale_y={self.scale_y}, "
                f"scale_x={self.scale_x}); read scale_y and scale_x instead of scale"
            )
        return self.scale_x


def letterbox_geometry(source_height: int, source_width: int, size: int) -> ResizeGeometry:
    """Long side to `size`, short side in proportion, content centred in zero padding."""
    source_height, source_width, size = _pixel_counts(source_height, source_width, size)
    scale = size / max(source_height, source_width)
    resized_height = _proportional_side(source_height, scale)
    resized_width = _proportional_side(source_width, scale)
    return ResizeGeometry(
        size=size,
        source_height=source_height,
        source_width=source_width,
        scale_y=scale,
        scale_x=scale,
        pad_top=(size - resized_height) // 2,
        pad_left=(size - resized_width) // 2,
        resized_height=resized_height,
        resized_width=resized_width,
    )


def squash_geometry(source_height: int, source_width: int, size: int) -> ResizeGeometry:
    """Both sides stretched to `size`; no padding, so the aspect ratio changes."""
    source_height, source_width, size = _pixel_counts(source_height, source_width, size)
    return ResizeGeometry(
        size=size,
        source_height=source_height,
        source_width=source_width,
        scale_y=size / source_height,
        scale_x=size / source_width,
        pad_top=0,
        pad_left=0,
        resized_height=size,
        resized_width=size,
    )


def resize_image(pixels: np.ndarray, geometry: ResizeGeometry) -> np.ndarray:
    """A 2-D uint8 radiograph placed into the geometry's S×S frame (padding 0).

    `pixels` may be smaller than the source (a reduced-DCT JPEG decode): it covers the same
    field of view, so it is resized from its own shape to the content area.
    """
    _check_plane(pixels, "image")
    if pixels.dtype != np.uint8:
        raise ValueError(
            f"resize_image expects uint8 pixels, got {pixels.dtype}; convert (window) "
            "higher bit depths to 8 bits when decoding"
        )
    content = _resample(pixels, geometry.resized_height, geometry.resized_width)
    return _pad(content, geometry)


def reduce_by_area(pixels: np.ndarray, factor: int) -> np.ndarray:
    """`pixels` shrunk by a whole `factor` that divides both sides, each output pixel the
    mean of a factor×factor block (rounded to the input's integer type: uint8, uint16 or
    int16). A whole factor is OpenCV's fast area path, several times cheaper than an
    arbitrary area resize of the same pixels; halving is its fastest case, so even factors
    are taken as halvings first."""
    _check_plane(pixels, "image")
    height, width = pixels.shape
    if factor < 1 or height % factor or width % factor:
        raise ValueError(f"factor {factor} does not divide both sides of {height}x{width}")
    while factor > 1:
        step = 2 if factor % 2 == 0 else factor
        height, width, factor = height // step, width // step, factor // step
        pixels = cv2.resize(pixels, (width, height), interpolation=cv2.INTER_AREA)
    return pixels


def reduce_with_partial_blocks(pixels: np.ndarray, factor: int) -> np.ndarray:
    """`pixels` shrunk about `factor` times where `factor` need not divide the sides (e.g.
    3050 x 2539): the whole factor x factor blocks are reduced by reduce_by_area (OpenCV's
    fast path, about ten times cheaper than a general area resize of the full image), the
    leftover rows and columns become one narrower block at the end of each side, and a side
    with such a block is resampled to side // factor pixels that tile the source exactly,
    each the overlap-weighted mean of the blocks it covers. So the result covers the same
    field of view as the source, as a decode's pixels must (see resize_image)."""
    _check_plane(pixels, "image")
    if factor < 1:
        raise ValueError(f"factor must be a positive whole number, got {factor}")
    height, width = pixels.shape
    whole_rows, whole_columns = height - height % factor, width - width % factor
    if whole_rows == height and whole_columns == width:
        return reduce_by_area(pixels, factor)
    blocks = _block_means(pixels, factor, whole_rows, whole_columns)
    if whole_rows < height:
        blocks = _tile_rows_exactly(blocks, height, factor)
    if whole_columns < width:
        # As rows of the transpose (cv2.transpose: numpy's strided copy is several times slower).
        blocks = cv2.transpose(_tile_rows_exactly(cv2.transpose(blocks), width, factor))
    return np.rint(blocks).astype(pixels.dtype)


def _block_means(pixels: np.ndarray, factor: int, rows: int, columns: int) -> np.ndarray:
    """Means of factor x factor blocks over the first `rows` x `columns` pixels, plus one
    row and one column of narrower blocks over the pixels left over, as float32."""
    top_left = reduce_by_area(pixels[:rows, :columns], factor).astype(np.float32)
    parts = [[top_left]]
    if columns < pixels.shape[1]:
        right = pixels[:rows, columns:].astype(np.float32)
        parts[0].append(right.reshape(rows // factor, factor, -1).mean(axis=(1, 2))[:, None])
    if rows < pixels.shape[0]:
        bottom = pixels[rows:, :columns].astype(np.float32)
        bottom_row = [bottom.reshape(len(bottom), -1, factor).mean(axis=(0, 2))[None, :]]
        if columns < pixels.shape[1]:
            bottom_row.append(np.array([[pixels[rows:, columns:].mean()]], np.float32))
        parts.append(bottom_row)
    return np.block(parts)


def _tile_rows_exactly(blocks: np.ndarray, side: int, factor: int) -> np.ndarray:
    """float32 means of `factor`-row blocks (the last one narrower) resampled to
    side // factor rows of side / (side // factor) source rows each: an area resize between
    the two grids, in source coordinates."""
    return _block_tiling_weights(side, factor) @ blocks


@functools.lru_cache(maxsize=256)
def _block_tiling_weights(side: int, factor: int) -> scipy.sparse.csr_matrix:
    """From `factor`-wide blocks over `side` (the last one narrower) to side // factor
    equal cells tiling the same span."""
    block_edges = np.minimum(np.arange(math.ceil(side / factor) + 1) * factor, side)
    count = side // factor
    return _overlap_weights(block_edges, np.arange(count + 1) * (side / count))


def resize_mask(mask: np.ndarray, geometry: ResizeGeometry) -> np.ndarray:
    """A 2-D binary mask through the same geometry by nearest neighbour; values stay as given.

    {0, 1} stays {0, 1}, {0, 255} stays {0, 255}, bool stays bool; padding is 0 (background).
    """
    _check_plane(mask, "mask")
    # OpenCV cannot resize bool arrays; uint8 holds every binary encoding we accept.
    as_uint8 = mask.astype(np.uint8, copy=False)
    # NEAREST_EXACT samples at pixel centres like the image resize; plain NEAREST is shifted
    # by up to half a source pixel towards the top-left.
    content = cv2.resize(
        as_uint8,
        (geometry.resized_width, geometry.resized_height),
        interpolation=cv2.INTER_NEAREST_EXACT,
    )
    return _pad(content, geometry).astype(mask.dtype, copy=False)


def boxes_to_resized_frame(
    y_min: ArrayLike,
    y_max: ArrayLike,
    x_min: ArrayLike,
    x_max: ArrayLike,
    geometry: ResizeGeometry,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Normalized boxes in the source frame → normalized boxes in the S×S output frame."""
    return (
        _to_output_axis(y_min, geometry.pad_top, geometry.resized_height, geometry.size),
        _to_output_axis(y_max, geometry.pad_top, geometry.resized_height, geometry.size),
        _to_output_axis(x_min, geometry.pad_left, geometry.resized_width, geometry.size),
        _to_output_axis(x_max, geometry.pad_left, geometry.resized_width, geometry.size),
    )


def _to_output_axis(values: ArrayLike, pad: int, resized: int, size: int) -> np.ndarray:
    return (pad + float_array(values) * resized) / size


def _proportional_side(source: int, scale: float) -> int:
    # Half up, not Python's half-to-even round, so equal inputs never round by parity; at
    # least one pixel so an extreme aspect ratio still leaves content.
    return max(1, int(np.floor(source * scale + 0.5)))


def _resample(pixels: np.ndarray, height: int, width: int) -> np.ndarray:
    """Area averaging along shrinking axes, then bilinear along enlarging ones.

    OpenCV's INTER_AREA only averages when both axes shrink; on a mixed resize (a squash of a
    wide, short image) it interpolates instead and aliases, hence the two passes.
    """
    in_height, in_width = pixels.shape
    shrunk_height, shrunk_width = min(in_height, height), min(in_width, width)
    if (shrunk_height, shrunk_width) != (in_height, in_width):
        pixels = shrink_by_area(pixels, shrunk_height, shrunk_width)
    if (shrunk_height, shrunk_width) != (height, width):
        pixels = cv2.resize(pixels, (width, height), interpolation=cv2.INTER_LINEAR)
    return pixels


def shrink_by_area(pixels: np.ndarray, height: int, width: int) -> np.ndarray:
    """`pixels` shrunk to height x width, each output pixel the overlap-weighted mean of the
    source pixels it covers (OpenCV's INTER_AREA, to within one grey level of rounding).

    Whole factors on both sides go to OpenCV's fast block-mean path. Any other ratio is two
    sparse products with precomputed overlap weights, rows then columns: OpenCV's general
    area resize revisits every source pixel for each output pixel it touches and costs
    several times more than the products (`benchmarks/bench_images.py --sections formats`).
    """
    in_height, in_width = pixels.shape
    if height > in_height or width > in_width:
        raise ValueError(f"cannot shrink {in_height}x{in_width} to {height}x{width}")
    if in_height % height == 0 and in_width % width == 0:
        return cv2.resize(pixels, (width, height), interpolation=cv2.INTER_AREA)
    values = _area_weights(in_height, height) @ pixels  # float32
    if width != in_width:
        # cv2.transpose: numpy's strided copy of the transpose is several times slower.
        values = cv2.transpose(_area_weights(in_width, width) @ cv2.transpose(values))
    return np.rint(values).astype(pixels.dtype)


@functools.lru_cache(maxsize=256)
def _area_weights(source: int, target: int) -> scipy.sparse.csr_matrix:
    """From `source` pixels to `target` equal cells tiling the same span."""
    return _overlap_weights(np.arange(source + 1), np.arange(target + 1) * (source / target))


def _overlap_weights(source_edges: np.ndarray, target_edges: np.ndarray) -> scipy.sparse.csr_matrix:
    """float32 weights resampling values on one grid of cells to another over the same span:
    entry (i, j) is the share of target cell i that source cell j covers (rows sum to 1).
    Both grids are increasing edge positions, first and last equal."""
    # Imported here: scipy.sparse is a noticeable part of loading the definitions, which
    # every CLI command, webserver and step pays, and only resizing needs it.
    import scipy.sparse

    low, high = target_edges[:-1, None], target_edges[1:, None]
    first = np.searchsorted(source_edges, target_edges[:-1], side="right") - 1
    last = np.searchsorted(source_edges, target_edges[1:], side="left") - 1
    index = first[:, None] + np.arange(int((last - first).max()) + 1)
    cells = len(source_edges) - 1
    clamped = np.minimum(index, cells - 1)
    overlap = np.minimum(high, source_edges[clamped + 1]) - np.maximum(low, source_edges[clamped])
    covered = (overlap > 0) & (index < cells)
    rows = np.broadcast_to(np.arange(len(low))[:, None], index.shape)[covered]
    weights = (overlap / (high - low))[covered].astype(np.float32)
    shape = (len(low), cells)
    return scipy.sparse.csr_matrix((weights, (rows, index[covered])), shape=shape)


def _pad(content: np.ndarray, geometry: ResizeGeometry) -> np.ndarray:
    frame = np.zeros((geometry.size, geometry.size), dtype=content.dtype)
    top, left = geometry.pad_top, geometry.pad_left
    frame[top : top + geometry.resized_height, left : left + geometry.resized_width] = content
    return frame


def _check_plane(array: np.ndarray, what: str) -> None:
    if array.ndim != 2 or 0 in array.shape:
        raise ValueError(f"{what} must be a non-empty 2-D array, got shape {array.shape}")


def _pixel_counts(source_height, source_width, size) -> tuple[int, int, int]:
    """Plain positive ints; tables often hand sizes over as floats or numpy integers."""
    counts = (source_height, source_width, size)
    # Checked in this order so NaN and infinity are reported, not raised by int().
    if any(not np.isfinite(count) or count <= 0 or count != int(count) for count in counts):
        raise ValueError(
            f"sizes must be positive whole numbers: source {source_height}×{source_width}, "
            f"target {size}"
        )
    return int(source_height), int(source_width), int(size)


# The resize modes by the name the `images` config and the images table's `resize` column use.
GEOMETRIES = {"letterbox": letterbox_geometry, "squash": squash_geometry}
