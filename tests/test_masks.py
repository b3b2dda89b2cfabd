"""Masks from RLEs and polygons agree with independent references; mask PNGs skip unchanged."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageDraw
from pycocotools import mask as coco_mask

from radharmony_pipeline.processing.annotations.masks import (
    MaskSizeError,
    area_fraction,
    decode_rle,
    mask_input_key,
    rasterize_polygons,
    read_mask_png,
    rle_area,
    union_rle_masks,
    write_mask_png,
)
from radharmony_pipeline.processing.imaging.tagged_png import stored_input_key
from radharmony_pipeline.processing.jobs.mask_jobs import UNION_CLASS, MaskTarget, PolygonMaskJob
from radharmony_pipeline.processing.storage import output_layout as layout
from radharmony_pipeline.processing.storage.atomic import TEMP_MARKER

# pycocotools 2.0.11's Cython decode trips a NumPy 2 DeprecationWarning on every call; it is
# theirs, harmless, and would bury our own warnings.
pytestmark = pytest.mark.filterwarnings(
    "ignore:__array__ implementation doesn't accept a copy keyword:DeprecationWarning"
)

HEIGHT, WIDTH = 61, 47  # unequal and odd, so a transposed or Fortran/C mix-up shows


def random_blobs(rng: np.random.Generator, count: int) -> np.ndarray:
    """A 0/1 mask of `count` random axis-aligned ellipses (possibly overlapping)."""
    rows, columns = np.mgrid[:HEIGHT, :WIDTH]
    mask = np.zeros((HEIGHT, WIDTH), dtype=np.uint8)
    for _ in range(count):
        centre_row, centre_column = rng.uniform(0, HEIGHT), rng.uniform(0, WIDTH)
        radius_row, radius_column = rng.uniform(3, HEIGHT / 2), rng.uniform(3, WIDTH / 2)
        inside = ((rows - centre_row) / radius_row) ** 2 + (
            (columns - centre_column) / radius_column
        ) ** 2 <= 1
        mask[inside] = 1
    return mask


def json_rle(mask: np.ndarray) -> dict:
    """An RLE as CheXlocalize stores it: pycocotools encoding with counts decoded to str."""
    rle = coco_mask.encode(np.asfortranarray(mask))
    return {"size": list(rle["size"]), "counts": rle["counts"].decode("ascii")}


def reference_union(rles: list[dict]) -> np.ndarray:
    """Decode each RLE on its own with pycocotools and OR them."""
    union = np.zeros((HEIGHT, WIDTH), dtype=np.uint8)
    for rle in rles:
        union |= coco_mask.decode({"size": rle["size"], "counts": rle["counts"].encode()})
    return union


# --- RLE -----------------------------------------------------------------------------------


def test_decode_rle_round_trips_str_and_bytes_counts() -> None:
    mask = random_blobs(np.random.default_rng(1), 3)
    rle = json_rle(mask)
    as_bytes = {"size": rle["size"], "counts": rle["counts"].encode()}
    for encoded in (rle, as_bytes):
        decoded = decode_rle(encoded)
        assert decoded.shape == (HEIGHT, WIDTH)
        assert decoded.dtype == np.uint8
        np.testing.assert_array_equal(decoded, mask)
    assert rle_area(rle) == int(mask.sum())


@pytest.mark.parametrize("seed", range(6))
def test_union_equals_decode_each_then_or(seed: int) -> None:
    rng = np.random.default_rng(seed)
    # Ten pathologies per image as in CheXlocalize: several blobs each, some empty.
    masks = [random_blobs(rng, int(rng.integers(0, 4))) for _ in range(10)]
    rles = [json_rle(mask) for mask in masks]
    expected = reference_union(rles)
    union = union_rle_masks(rles, HEIGHT, WIDTH)
    assert union.dtype == np.uint8
    assert union.shape == (HEIGHT, WIDTH)
    np.testing.assert_array_equal(union, expected)
    assert expected.any(), "the generated shapes should not all be empty"


def test_union_of_overlapping_masks_counts_overlap_once() -> None:
    left = np.zeros((HEIGHT, WIDTH), dtype=np.uint8)
    right = np.zeros((HEIGHT, WIDTH), dtype=np.uint8)
    left[10:30, 5:25] = 1
    right[20:40, 15:35] = 1
    union = union_rle_masks([json_rle(left), json_rle(right)], HEIGHT, WIDTH)
    np.testing.assert_array_equal(union, left | right)
    assert union.sum() == 400 + 400 - 100


def test_union_of_empty_rles_is_all_zero() -> None:
    empty = json_rle(np.zeros((HEIGHT, WIDTH), dtype=np.uint8))
    union = union_rle_masks([empty, empty, empty], HEIGHT, WIDTH)
    assert union.shape == (HEIGHT, WIDTH)
    assert not union.any()


def test_union_of_no_rles_is_all_zero() -> None:
    union = union_rle_masks([], HEIGHT, WIDTH)
    assert union.shape == (HEIGHT, WIDTH)
    assert union.dtype == np.uint8
    assert not union.any()


def test_union_rejects_a_size_mismatch_naming_both_sizes() -> None:
    good = json_rle(np.ones((HEIGHT, WIDTH), dtype=np.uint8))
    wrong = json_rle(np.ones((WIDTH, HEIGHT), dtype=np.uint8))
    with pytest.raises(MaskSizeError) as raised:
        union_rle_masks([good, wrong], HEIGHT, WIDTH)
    message = str(raised.value)
    assert f"({WIDTH}, {HEIGHT})" in message
    assert f"({HEIGHT}, {WIDTH})" in message
    assert isinstance(raised.value, ValueError)


def test_union_rejects_a_size_mismatch_even_when_alone() -> None:
    wrong = json_rle(np.zeros((HEIGHT + 1, WIDTH), dtype=np.uint8))
    with pytest.raises(MaskSizeError, match=rf"\({HEIGHT + 1}, {WIDTH}\)"):
        union_rle_masks([wrong], HEIGHT, WIDTH)


def test_area_fraction() -> None:
    mask = np.zeros((10, 20), dtype=np.uint8)
    mask[:5, :4] = 1
    assert area_fraction(mask) == pytest.approx(20 / 200)


# --- polygons ------------------------------------------------------------------------------


def reference_polygons(polygons: list[list[list[int]]]) -> np.ndarray:
    """Fill each polygon (interior and outline) with PIL and OR the results."""
    union = np.zeros((HEIGHT, WIDTH), dtype=np.uint8)
    for polygon in polygons:
        canvas = Image.new("L", (WIDTH, HEIGHT), 0)
        ImageDraw.Draw(canvas).polygon([tuple(point) for point in polygon], fill=1, outline=1)
        union |= np.asarray(canvas)
    return union


def rectangle(x0: int, y0: int, x1: int, y1: int) -> list[list[int]]:
    return [[x0, y0], [x1, y0], [x1, y1], [x0, y1]]


# Shapes whose edges are axis-aligned or at 45 degrees with integer vertices: every boundary
# pixel lies exactly on an edge, so PIL and OpenCV agree pixel for pixel (no tolerance).
EXACT_SHAPES = {
    "rectangle": [rectangle(3, 4, 20, 30)],
    "right triangle": [[[5, 5], [25, 5], [5, 25]]],
    "diamond": [[[20, 5], [35, 20], [20, 35], [5, 20]]],
    "overlapping instances": [rectangle(2, 2, 20, 20), rectangle(10, 10, 30, 40)],
    "nested instances": [rectangle(2, 2, 40, 50), rectangle(10, 10, 20, 20)],
}


@pytest.mark.parametrize("name", EXACT_SHAPES)
def test_rasterize_polygons_matches_pil_exactly(name: str) -> None:
    polygons = EXACT_SHAPES[name]
    mask = rasterize_polygons(polygons, HEIGHT, WIDTH)
    assert mask.dtype == np.uint8
    assert mask.shape == (HEIGHT, WIDTH)
    np.testing.assert_array_equal(mask, reference_polygons(polygons))


def test_rasterize_polygons_pixel_convention() -> None:
    mask = rasterize_polygons([rectangle(3, 4, 20, 30)], HEIGHT, WIDTH)
    rows, columns = np.nonzero(mask)
    assert (columns.min(), columns.max()) == (3, 20)  # x is the column, inclusive
    assert (rows.min(), rows.max()) == (4, 30)  # y is the row, inclusive
    assert mask.sum() == 18 * 27


def test_overlapping_instances_leave_no_hole() -> None:
    mask = rasterize_polygons([rectangle(2, 2, 20, 20), rectangle(10, 10, 30, 40)], HEIGHT, WIDTH)
    assert mask[10:21, 10:21].all()


def test_overlapping_classes_both_contain_the_overlap() -> None:
    effusion = rasterize_polygons([rectangle(5, 5, 25, 25)], HEIGHT, WIDTH)
    atelectasis = rasterize_polygons([[[15, 15], [40, 15], [15, 40]]], HEIGHT, WIDTH)
    overlap = reference_polygons([rectangle(5, 5, 25, 25)]) & reference_polygons(
        [[[15, 15], [40, 15], [15, 40]]]
    )
    assert overlap.sum() > 50
    assert effusion[overlap == 1].all()
    assert atelectasis[overlap == 1].all()


def test_random_polygons_differ_from_pil_only_on_the_outline() -> None:
    # For slanted edges PIL and OpenCV may round boundary pixels differently, so any
    # disagreement must lie within one pixel of PIL's outline; interiors must agree.
    rng = np.random.default_rng(3)
    for _ in range(20):
        centre = rng.uniform([15, 15], [WIDTH - 15, HEIGHT - 15])
        angles = np.sort(rng.uniform(0, 2 * np.pi, size=int(rng.integers(3, 9))))
        radii = rng.uniform(4, 14, size=len(angles))
        points = centre + np.stack([np.cos(angles), np.sin(angles)], axis=1) * radii[:, None]
        polygon = np.rint(points).astype(int).tolist()
        mask = rasterize_polygons([polygon], HEIGHT, WIDTH)
        outline = Image.new("L", (WIDTH, HEIGHT), 0)
        ImageDraw.Draw(outline).polygon([tuple(p) for p in polygon], outline=1)
        near_outline = _dilate(np.asarray(outline))
        differs = mask != reference_polygons([polygon])
        assert not (differs & ~near_outline.astype(bool)).any()


def _dilate(mask: np.ndarray) -> np.ndarray:
    """3x3 dilation in numpy (an independent reference, no OpenCV)."""
    padded = np.pad(mask, 1)
    shifted = [
        padded[1 + dy : 1 + dy + HEIGHT, 1 + dx : 1 + dx + WIDTH]
        for dy in (-1, 0, 1)
        for dx in (-1, 0, 1)
    ]
    return np.maximum.reduce(shifted)


def test_no_polygons_is_all_zero() -> None:
    mask = rasterize_polygons([], HEIGHT, WIDTH)
    assert mask.shape == (HEIGHT, WIDTH)
    assert not mask.any()


def test_degenerate_polygon_is_rejected_with_its_index() -> None:
    with pytest.raises(ValueError, match="polygon 1 has 2 points"):
        rasterize_polygons([rectangle(1, 1, 5, 5), [[1, 1], [5, 5]]], HEIGHT, WIDTH)


# --- mask PNGs -----------------------------------------------------------------------------


def png_chunk_types(path: Path) -> list[bytes]:
    data = path.read_bytes()
    types, offset = [], 8
    while offset < len(data):
        (length,) = struct.unpack(">I", data[offset : offset + 4])
        types.append(data[offset + 4 : offset + 8])
        offset += 12 + length
    return types


def test_write_mask_png_is_0_255_mode_l_and_round_trips(tmp_path: Path) -> None:
    mask = random_blobs(np.random.default_rng(5), 3)
    path = tmp_path / "masks" / "effusion.png"
    assert write_mask_png(path, mask, "key-1") is True
    with Image.open(path) as image:
        assert image.mode == "L"
        assert image.size == (WIDTH, HEIGHT)
        values = set(np.unique(np.asarray(image)).tolist())
    assert values == {0, 255}
    np.testing.assert_array_equal(read_mask_png(path), mask)
    assert stored_input_key(path) == "key-1"


def test_input_key_is_written_before_the_pixels(tmp_path: Path) -> None:
    path = tmp_path / "mask.png"
    write_mask_png(path, np.ones((HEIGHT, WIDTH), dtype=np.uint8), "key-1")
    chunks = png_chunk_types(path)
    assert chunks.index(b"tEXt") < chunks.index(b"IDAT")


def test_same_key_does_not_touch_the_file_and_new_key_rewrites(tmp_path: Path) -> None:
    path = tmp_path / "mask.png"
    first = np.zeros((HEIGHT, WIDTH), dtype=np.uint8)
    first[5:10, 5:10] = 1
    assert write_mask_png(path, first, "key-1") is True
    past = 1_000_000_000_000_000_000  # a fixed old mtime, so a rewrite cannot keep it
    os.utime(path, ns=(past, past))

    assert write_mask_png(path, 1 - first, "key-1") is False
    assert path.stat().st_mtime_ns == past
    np.testing.assert_array_equal(read_mask_png(path), first)

    assert write_mask_png(path, 1 - first, "key-2") is True
    assert path.stat().st_mtime_ns != past
    np.testing.assert_array_equal(read_mask_png(path), 1 - first)
    assert stored_input_key(path) == "key-2"


def test_failed_write_leaves_no_temp_file_and_keeps_the_old_mask(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "mask.png"
    old = np.eye(HEIGHT, WIDTH, dtype=np.uint8)
    write_mask_png(path, old, "key-1")

    def disk_fills_up(self: Path, data: bytes) -> int:
        with open(self, "wb") as handle:
            handle.write(bytes(data)[: len(data) // 2])
        raise OSError("disk full")

    # The storage layer writes the temporary file in one call; half the PNG lands, then it
    # fails.
    monkeypatch.setattr(Path, "write_bytes", disk_fills_up)
    with pytest.raises(OSError, match="disk full"):
        write_mask_png(path, 1 - old, "key-2")
    monkeypatch.undo()

    assert [p.name for p in tmp_path.iterdir()] == ["mask.png"]
    assert not any(TEMP_MARKER in p.name for p in tmp_path.iterdir())
    np.testing.assert_array_equal(read_mask_png(path), old)
    assert stored_input_key(path) == "key-1"


def test_stored_input_key_of_missing_or_corrupt_file_is_none(tmp_path: Path) -> None:
    assert stored_input_key(tmp_path / "absent.png") is None
    corrupt = tmp_path / "corrupt.png"
    corrupt.write_bytes(b"not a png")
    assert stored_input_key(corrupt) is None


def test_write_mask_png_rejects_non_binary_masks(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="0 and 1 only"):
        write_mask_png(tmp_path / "mask.png", np.full((4, 4), 7, dtype=np.uint8), "key")
    assert not (tmp_path / "mask.png").exists()


def test_mask_input_key_is_short_stable_and_separates_parts() -> None:
    key = mask_input_key("rle-counts", b"threshold=0.5")
    assert key == mask_input_key("rle-counts", b"threshold=0.5")
    assert len(key) <= 32
    int(key, 16)
    assert key != mask_input_key("rle-counts", b"threshold=0.6")
    assert mask_input_key("ab", "c") != mask_input_key("a", "bc")


# --- ChestX-Det polygon jobs: the PNG gives the frame ----------------------------------------


# The test image's mask folder below the output root (`masks/img`: no partition level here).
IMAGE_MASKS = f"{layout.MASKS}/img"


def _polygon_job(image: Path, output: Path, frame: tuple[int, int]) -> PolygonMaskJob:
    square = [[[2.0, 2.0], [10.0, 2.0], [10.0, 8.0], [2.0, 8.0]]]
    return PolygonMaskJob("img", image, MaskTarget(output, IMAGE_MASKS), frame, {"Nodule": square})


def test_polygon_job_draws_the_instances_in_the_png_frame(tmp_path: Path) -> None:
    image = tmp_path / "img.png"
    Image.fromarray(np.full((12, 16), 90, np.uint8)).save(image)

    rows = _polygon_job(image, tmp_path / "out", (12, 16)).run()

    assert [row.status for row in rows] == ["ok", "ok"]
    assert {(row.mask_class, row.height, row.width) for row in rows} == {
        ("Nodule", 12, 16),
        (UNION_CLASS, 12, 16),
    }
    written = np.asarray(Image.open(tmp_path / "out" / IMAGE_MASKS / "Nodule.png"))
    assert written.shape == (12, 16) and written[2:8, 2:10].all() and not written[9:].any()


def test_polygon_job_reports_a_png_whose_pixel_data_is_cut_short(tmp_path: Path) -> None:
    image = tmp_path / "img.png"
    Image.fromarray(np.full((12, 16), 90, np.uint8)).save(image)
    content = image.read_bytes()
    image.write_bytes(content[: content.index(b"IDAT") + 6])  # header intact, pixels cut

    rows = _polygon_job(image, tmp_path / "out", (12, 16)).run()

    assert len(rows) == 1 and rows[0].status == "error"
    assert str(image) in rows[0].error
    assert not (tmp_path / "out" / IMAGE_MASKS / "Nodule.png").exists()


def test_polygon_job_names_a_frame_that_differs_from_the_png_header(tmp_path: Path) -> None:
    image = tmp_path / "img.png"
    Image.fromarray(np.zeros((12, 16), np.uint8)).save(image)

    rows = _polygon_job(image, tmp_path / "out", (16, 12)).run()

    assert len(rows) == 1 and rows[0].status == "error"
    assert "image is 12x16, annotations are in a 16x12 frame" in rows[0].error


def test_polygon_job_reports_a_file_that_is_not_a_png(tmp_path: Path) -> None:
    image = tmp_path / "img.png"
    image.write_bytes(b"not a png at all")

    rows = _polygon_job(image, tmp_path / "out", (12, 16)).run()

    assert len(rows) == 1 and rows[0].status == "error"
    assert str(image) in rows[0].error
