"""Image sizes come from headers and grayscale PNGs are accepted only when lossless."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest
from PIL import Image
from pydicom.uid import UID, ExplicitVRLittleEndian, JPEG2000Lossless, RLELossless

from radharmony_pipeline.processing.imaging.image_files import (
    ImageFileError,
    header_image_size,
    read_grayscale_png,
)
from radharmony_pipeline.synthetic.dicom import DicomIdentity, DicomVariant, dicom_bytes

HEIGHT, WIDTH = 37, 53  # unequal, so a swapped (width, height) shows


def gradient(dtype: type = np.uint8, top: int = 255) -> np.ndarray:
    values = np.linspace(0, top, HEIGHT * WIDTH).reshape(HEIGHT, WIDTH)
    return values.astype(dtype)


def write_dicom(path: Path, transfer_syntax: UID) -> None:
    """The gradient as a 12-bit DX For Presentation file, written as the synthetic data are."""
    variant = DicomVariant(transfer_syntax, "MONOCHROME2", 12, windowed=False, rescale=None)
    identity = DicomIdentity("p1", "1.2.3", "1.2.3.4", "1.2.3.4.5", "PA")
    path.write_bytes(dicom_bytes(gradient(np.float64, 1), variant, identity))


# --- header_image_size ------------------------------------------------------------------


@pytest.mark.parametrize("suffix", [".jpg", ".jpeg", ".JPG"])
def test_jpeg_size(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"view1_frontal{suffix}"
    Image.fromarray(gradient()).save(path, format="JPEG")
    assert header_image_size(path) == (HEIGHT, WIDTH)


def test_png_sizes_8_and_16_bit(tmp_path: Path) -> None:
    eight = tmp_path / "eight.png"
    sixteen = tmp_path / "sixteen.PNG"
    Image.fromarray(gradient()).save(eight)
    Image.fromarray(gradient(np.uint16, 65535)).save(sixteen)
    assert header_image_size(eight) == (HEIGHT, WIDTH)
    assert header_image_size(sixteen) == (HEIGHT, WIDTH)


@pytest.mark.parametrize(
    "transfer_syntax",
    [ExplicitVRLittleEndian, RLELossless, JPEG2000Lossless],
    ids=["uncompressed", "rle-lossless", "jpeg2000-lossless"],
)
def test_dicom_size(tmp_path: Path, transfer_syntax: UID) -> None:
    path = tmp_path / "image.dcm"
    write_dicom(path, transfer_syntax)
    assert header_image_size(path) == (HEIGHT, WIDTH)


def test_size_does_not_decode_pixels(tmp_path: Path) -> None:
    # A PNG whose header is intact but whose image data is cut off still reports its size.
    path = tmp_path / "truncated.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (HEIGHT, WIDTH), np.uint8)).save(path)
    data = path.read_bytes()
    path.write_bytes(data[: data.index(b"IDAT") + 20])
    assert header_image_size(path) == (HEIGHT, WIDTH)


def test_missing_file_error_names_the_path(tmp_path: Path) -> None:
    path = tmp_path / "absent.jpg"
    with pytest.raises(ImageFileError, match="not found") as raised:
        header_image_size(path)
    assert str(path) in str(raised.value)
    assert isinstance(raised.value, ValueError)


@pytest.mark.parametrize("name", ["broken.png", "broken.jpg", "broken.dcm"])
def test_unreadable_file_error_names_the_path(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    path.write_bytes(b"this is not an image at all")
    with pytest.raises(ImageFileError) as raised:
        header_image_size(path)
    assert str(path) in str(raised.value)


def test_unsupported_extension_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "image.tif"
    Image.fromarray(gradient()).save(path)
    with pytest.raises(ImageFileError, match="unsupported extension"):
        header_image_size(path)


# --- read_grayscale_png --------------------------------------------------------------------


def test_mode_l_is_returned_as_is(tmp_path: Path) -> None:
    path = tmp_path / "gray.png"
    Image.fromarray(gradient()).save(path)
    pixels, mode = read_grayscale_png(path)
    assert mode == "L"
    assert pixels.dtype == np.uint8
    np.testing.assert_array_equal(pixels, gradient())


def test_16_bit_is_returned_as_uint16(tmp_path: Path) -> None:
    path = tmp_path / "deep.png"
    expected = gradient(np.uint16, 65535)
    Image.fromarray(expected).save(path)
    pixels, mode = read_grayscale_png(path)
    assert mode.startswith("I")
    assert pixels.dtype == np.uint16
    np.testing.assert_array_equal(pixels, expected)


def test_rgba_grayscale_with_opaque_alpha_is_accepted_losslessly(tmp_path: Path) -> None:
    gray = gradient()
    path = tmp_path / "rgba.png"
    rgba = np.stack([gray, gray, gray, np.full_like(gray, 255)], axis=-1)
    Image.fromarray(rgba, mode="RGBA").save(path)
    pixels, mode = read_grayscale_png(path)
    assert mode == "RGBA"
    assert pixels.shape == (HEIGHT, WIDTH)
    assert pixels.dtype == np.uint8
    np.testing.assert_array_equal(pixels, gray)


def test_rgb_grayscale_is_accepted(tmp_path: Path) -> None:
    gray = gradient()
    path = tmp_path / "rgb.png"
    Image.fromarray(np.stack([gray, gray, gray], axis=-1)).save(path)
    pixels, mode = read_grayscale_png(path)
    assert mode == "RGB"
    np.testing.assert_array_equal(pixels, gray)


def test_rgba_with_alpha_254_somewhere_is_rejected(tmp_path: Path) -> None:
    gray = gradient()
    alpha = np.full_like(gray, 255)
    alpha[3, 7] = 254
    path = tmp_path / "translucent.png"
    Image.fromarray(np.stack([gray, gray, gray, alpha], axis=-1), mode="RGBA").save(path)
    with pytest.raises(ImageFileError, match=r"alpha != 255 in 1 pixels") as raised:
        read_grayscale_png(path)
    assert str(path) in str(raised.value)


def test_rgb_with_channel_differences_is_rejected(tmp_path: Path) -> None:
    gray = gradient()
    green = gray.copy()
    green[:2, :] ^= 1  # two full rows differ in the green channel
    path = tmp_path / "colour.png"
    Image.fromarray(np.stack([gray, green, gray], axis=-1)).save(path)
    with pytest.raises(ImageFileError, match=rf"channels differ in {2 * WIDTH} pixels"):
        read_grayscale_png(path)


def write_16_bit_colour_png(path: Path, planes: list[np.ndarray]) -> None:
    """A 16-bit RGB or RGBA PNG (OpenCV writes them; Pillow cannot), planes given as R, G,
    B(, A): OpenCV takes B, G, R(, A)."""
    red, green, blue, *alpha = planes
    assert cv2.imwrite(str(path), np.dstack([blue, green, red, *alpha]))


@pytest.mark.parametrize("with_alpha", [False, True])
def test_16_bit_grey_rgb_keeps_all_16_bits(tmp_path: Path, with_alpha: bool) -> None:
    # Values 16 apart below the top byte: cut to 8 bits (as Pillow reads such files) they
    # would collapse, and still look grey.
    grey = gradient(np.uint16, top=4095) * 16 + 3
    opaque = [np.full_like(grey, 65535)] if with_alpha else []
    path = tmp_path / "rgb16.png"
    write_16_bit_colour_png(path, [grey, grey, grey, *opaque])
    pixels, mode = read_grayscale_png(path)
    assert mode == ("RGBA" if with_alpha else "RGB")
    assert pixels.dtype == np.uint16 and pixels.flags.c_contiguous
    np.testing.assert_array_equal(pixels, grey)


def test_16_bit_rgba_with_alpha_below_65535_is_rejected(tmp_path: Path) -> None:
    grey = gradient(np.uint16, top=65535)
    alpha = np.full_like(grey, 65535)
    alpha[5, 9] = 65279  # 255 in its top byte: opaque if cut to 8 bits
    path = tmp_path / "translucent16.png"
    write_16_bit_colour_png(path, [grey, grey, grey, alpha])
    with pytest.raises(ImageFileError, match=r"alpha != 65535 in 1 pixels"):
        read_grayscale_png(path)


def test_16_bit_rgb_differing_only_in_the_low_byte_is_rejected(tmp_path: Path) -> None:
    grey = gradient(np.uint16, top=65535)
    blue = grey.copy()
    blue[0, :] ^= 1  # one row differs in the blue channel's lowest bit
    path = tmp_path / "colour16.png"
    write_16_bit_colour_png(path, [grey, grey, blue])
    with pytest.raises(ImageFileError, match=rf"channels differ in {WIDTH} pixels"):
        read_grayscale_png(path)


def test_missing_png_error_names_the_path(tmp_path: Path) -> None:
    path = tmp_path / "absent.png"
    with pytest.raises(ImageFileError) as raised:
        read_grayscale_png(path)
    assert str(path) in str(raised.value)
