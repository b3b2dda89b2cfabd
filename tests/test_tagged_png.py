"""Tagged PNGs: encoded pixels with text chunks that Pillow reads back unchanged."""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Callable
from pathlib import Path

import cv2
import numpy as np
import pyspng
import pytest
from PIL import Image

from radharmony_pipeline.processing.imaging.tagged_png import (
    INPUT_KEY_TAG,
    leading_text_tags,
    mask_png,
    radiograph_png,
    read_leading_tags,
    read_png_tags,
    stored_input_key,
    with_text_tags,
    write_tagged_png,
)

SHAPES = [(1, 1), (1, 7), (5, 1), (224, 224), (224, 187), (33, 250), (2000, 3)]


def random_pixels(shape: tuple[int, int], seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)


def pillow_read(path: Path) -> tuple[np.ndarray, dict[str, str], str]:
    with Image.open(path) as image:
        image.load()
        tags = {k: v for k, v in image.info.items() if isinstance(v, str)}
        return np.asarray(image), tags, image.mode


@pytest.mark.parametrize("encode", [radiograph_png, mask_png])
@pytest.mark.parametrize("shape", SHAPES)
def test_pixels_and_tags_round_trip_through_pillow(
    tmp_path: Path, shape: tuple[int, int], encode: Callable[[np.ndarray], bytes]
) -> None:
    pixels = random_pixels(shape, seed=sum(shape))
    tags = {"orig_height": "2828", "scale": repr(224 / 2828), "source_sha256": "ab" * 32}
    path = tmp_path / "out.png"

    assert write_tagged_png(path, lambda: pixels, "key-1", tags, encode=encode)

    read, stored, mode = pillow_read(path)
    assert mode == "L"
    np.testing.assert_array_equal(read, pixels)
    assert stored == {INPUT_KEY_TAG: "key-1", **tags}
    assert read_png_tags(path) == stored


def test_every_chunk_checksum_is_valid(tmp_path: Path) -> None:
    path = tmp_path / "out.png"
    write_tagged_png(path, lambda: random_pixels((64, 48), 3), "k", {"a": "1", "b": "é"})
    with Image.open(path) as image:
        image.verify()  # raises on a bad CRC or a malformed chunk


def test_text_outside_latin1_is_kept_exactly(tmp_path: Path) -> None:
    path = tmp_path / "out.png"
    tags = {"note": "肺 – ∅ ✓", "latin": "Zürich café"}
    write_tagged_png(path, lambda: random_pixels((8, 8), 1), "k", tags)
    assert read_png_tags(path) == {INPUT_KEY_TAG: "k", **tags}


def test_leading_tags_are_read_from_the_head_of_the_file(tmp_path: Path) -> None:
    tags = {"orig_height": "2828", "source_sha256": "ab" * 32}
    path = tmp_path / "out.png"
    write_tagged_png(path, lambda: random_pixels((224, 224), 5), "key-2", tags)
    assert read_leading_tags(path) == {INPUT_KEY_TAG: "key-2", **tags} == read_png_tags(path)
    assert read_leading_tags(tmp_path / "missing.png") == {}
    (tmp_path / "text.png").write_text("not a png, though named like one")
    assert read_leading_tags(tmp_path / "text.png") == {}


@pytest.mark.parametrize(
    ("head", "expected"),
    # The header ends at byte 33; tag a's chunk takes bytes 33-48, tag b's 48-102.
    [(40, {}), (48, {"a": "1"}), (63, {"a": "1"}), (101, {"a": "1"}), (102, None)],
)
def test_a_tag_cut_off_by_a_short_read_is_left_out_not_shortened(
    head: int, expected: dict | None
) -> None:
    """A head read may end inside a text chunk: that tag is missing (the image is then
    checked whole), never read with a truncated value."""
    tags = {"a": "1", "b": "x" * 40}
    png = with_text_tags(radiograph_png(random_pixels((8, 8), 4)), tags)
    assert leading_text_tags(png[:head]) == (tags if expected is None else expected)


def test_tags_precede_the_image_data() -> None:
    png = with_text_tags(radiograph_png(random_pixels((16, 16), 2)), {"a": "b"})
    assert png.index(b"tEXt") < png.index(b"IDAT")


@pytest.mark.parametrize(
    "name",
    ["", "x" * 80, "nul\0inside", "ключ", " lead", "trail ", "double  space", "tab\there"],
)
def test_unusable_tag_names_are_refused(tmp_path: Path, name: str) -> None:
    path = tmp_path / "out.png"
    with pytest.raises(ValueError, match="PNG tag name"):
        write_tagged_png(path, lambda: random_pixels((4, 4), 0), "k", {name: "v"})
    assert not path.exists()


@pytest.mark.parametrize(
    "pixels",
    [
        np.zeros((4, 4, 3), np.uint8),
        np.zeros((4, 4), np.uint16),
        np.zeros(4, np.uint8),
        np.zeros((0, 5), np.uint8),
    ],
)
@pytest.mark.parametrize("encode", [radiograph_png, mask_png])
def test_only_non_empty_2d_uint8_pixels_are_encoded(
    pixels: np.ndarray, encode: Callable[[np.ndarray], bytes]
) -> None:
    with pytest.raises(ValueError, match="non-empty 2-D uint8"):
        encode(pixels)


def test_a_nul_in_a_tag_value_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="NUL"):
        write_tagged_png(tmp_path / "out.png", lambda: random_pixels((4, 4), 0), "k", {"a": "x\0"})


def row_filters(png: bytes) -> set[int]:
    """The filter byte that starts each row of an 8-bit grayscale PNG's image data."""
    width, height = struct.unpack(">II", png[16:24])
    position, data = 8, b""
    while position < len(png):
        (length,) = struct.unpack(">I", png[position : position + 4])
        if png[position + 4 : position + 8] == b"IDAT":
            data += png[position + 8 : position + 8 + length]
        position += 12 + length
    raw = zlib.decompress(data)
    assert len(raw) == height * (width + 1)
    return {raw[row * (width + 1)] for row in range(height)}


def test_radiographs_use_average_and_masks_no_filter_on_every_row() -> None:
    pixels = random_pixels((40, 30), 5)
    assert row_filters(radiograph_png(pixels)) == {3}  # Average
    assert row_filters(mask_png(pixels)) == {0}  # None


def test_radiograph_png_decodes_to_the_same_pixels_in_every_reader() -> None:
    # Smooth content with edges and the extremes, where the Average filter's carries and
    # wrap-around modulo 256 matter (random pixels hardly exercise them).
    ramp = np.add.outer(np.arange(97), np.arange(131)) * 3 % 256
    pixels = np.where(ramp > 200, 255, ramp).astype(np.uint8)
    pixels[::7] = 0
    png = radiograph_png(pixels)
    np.testing.assert_array_equal(pyspng.load(png), pixels)
    np.testing.assert_array_equal(cv2.imdecode(np.frombuffer(png, np.uint8), -1), pixels)
    assert png == radiograph_png(pixels.copy())  # deterministic


def test_not_a_png_is_refused() -> None:
    with pytest.raises(ValueError, match="IHDR"):
        with_text_tags(b"GIF89a" + b"\0" * 40, {"a": "b"})


def test_same_key_leaves_the_file_untouched(tmp_path: Path) -> None:
    path = tmp_path / "out.png"
    write_tagged_png(path, lambda: random_pixels((8, 8), 1), "key-1")
    os.utime(path, ns=(1_000_000_000, 1_000_000_000))
    built = []

    def pixels() -> np.ndarray:
        built.append(True)
        return random_pixels((8, 8), 9)

    assert not write_tagged_png(path, pixels, "key-1")
    assert built == [] and path.stat().st_mtime_ns == 1_000_000_000
    assert write_tagged_png(path, pixels, "key-2")
    assert stored_input_key(path) == "key-2"
    np.testing.assert_array_equal(pillow_read(path)[0], random_pixels((8, 8), 9))
