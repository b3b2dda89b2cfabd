"""decode_grayscale turns JPEG, PNG and DICOM radiographs into bone-bright uint8 arrays."""

from __future__ import annotations

import io
from pathlib import Path

import cv2
import numpy as np
import pydicom
import pytest
from PIL import Image
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.encaps import encapsulate
from pydicom.uid import (
    MPEG2MPML,
    UID,
    ExplicitVRLittleEndian,
    JPEG2000Lossless,
    JPEGLosslessSV1,
    JPEGLSLossless,
    RLELossless,
)

from radharmony_pipeline.processing.imaging.decode import DecodeError, decode_grayscale
from radharmony_pipeline.synthetic.dicom import COVERING_VARIANTS, DicomIdentity, dicom_bytes
from radharmony_pipeline.synthetic.radiograph import render_radiograph

DX_FOR_PRESENTATION = UID("1.2.840.10008.5.1.4.1.1.1.1")
ROWS, COLS = 48, 64  # unequal, so a transposed array shows
SQUARE = (slice(12, 30), slice(20, 44))
ENCODINGS = [ExplicitVRLittleEndian, RLELossless, JPEG2000Lossless, JPEGLosslessSV1]
ENCODING_IDS = ["uncompressed", "rle-lossless", "jpeg2000-lossless", "jpeg-lossless-sv1"]


# --- pixel patterns -------------------------------------------------------------------------


def square_on_ramp(bits: int) -> np.ndarray:
    """A bright square on a dark, slightly graded background, in [0, 2**bits - 1]."""
    top = (1 << bits) - 1
    pixels = np.tile(np.linspace(0.05, 0.3, COLS), (ROWS, 1))
    pixels[SQUARE] = 0.9
    pixels[0, 0], pixels[-1, -1] = 0.0, 1.0  # full stored range, so bit depth is visible
    return np.round(pixels * top).astype(np.uint16)


def ramp_4096() -> np.ndarray:
    """Every 12-bit value once, row by row."""
    return np.arange(4096, dtype=np.uint16).reshape(64, 64)


# --- a minimal JPEG Lossless (Process 14, SV1) encoder -------------------------------------
# pydicom 3 cannot encode JPEG Lossless, so these tests carry a tiny ITU-T T.81 Annex H
# encoder: predictor 1, one Huffman table giving all 17 difference categories a 5-bit code.
# libjpeg (via pylibjpeg) decodes it independently, so an exact round trip is a real check.


def _marker_segment(marker: int, body: bytes) -> bytes:
    return bytes([0xFF, marker]) + (len(body) + 2).to_bytes(2, "big") + body


def _predictions(pixels: np.ndarray, precision: int) -> np.ndarray:
    predicted = np.empty(pixels.shape, dtype=np.int64)
    predicted[:, 1:] = pixels[:, :-1]  # Ra, the left neighbour
    predicted[1:, 0] = pixels[:-1, 0]  # first column: Rb, the pixel above
    predicted[0, 0] = 1 << (precision - 1)
    return predicted


def _entropy_coded(pixels: np.ndarray, precision: int) -> bytes:
    differences = (pixels.astype(np.int64) - _predictions(pixels, precision)) % 65536
    differences = np.where(differences >= 32768, differences - 65536, differences)
    bits = []
    for difference in differences.ravel().tolist():
        category = abs(difference).bit_length()
        bits.append(format(category, "05b"))
        if 0 < category < 16:  # category 16 (difference 32768) carries no extra bits
            extra = difference if difference > 0 else difference + (1 << category) - 1
            bits.append(format(extra, f"0{category}b"))
    stream = "".join(bits)
    stream += "1" * (-len(stream) % 8)  # pad with 1-bits, as T.81 F.1.2.3 requires
    data = int(stream, 2).to_bytes(len(stream) // 8, "big")
    return data.replace(b"\xff", b"\xff\x00")


def lossless_jpeg(pixels: np.ndarray, precision: int = 16) -> bytes:
    rows, cols = pixels.shape
    frame = bytes([precision]) + rows.to_bytes(2, "big") + cols.to_bytes(2, "big")
    frame += bytes([1, 1, 0x11, 0])
    code_lengths = bytes([0, 0, 0, 0, 17] + [0] * 11)
    huffman = bytes([0x00]) + code_lengths + bytes(range(17))
    scan = bytes([1, 1, 0x00, 1, 0, 0])  # one component, predictor 1, point transform 0
    return (
        b"\xff\xd8"
        + _marker_segment(0xC3, frame)
        + _marker_segment(0xC4, huffman)
        + _marker_segment(0xDA, scan)
        + _entropy_coded(pixels, precision)
        + b"\xff\xd9"
    )


# --- DICOM files ----------------------------------------------------------------------------


def _dataset(stored: np.ndarray, photometric: str, bits_stored: int) -> Dataset:
    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = DX_FOR_PRESENTATION
    meta.MediaStorageSOPInstanceUID = UID("1.2.826.0.1.3680043.8.498.1")
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds = Dataset()
    ds.file_meta = meta
    ds.SOPClassUID = DX_FOR_PRESENTATION
    ds.SOPInstanceUID = meta.MediaStorageSOPInstanceUID
    ds.Modality = "DX"
    ds.SamplesPerPixel = 1
    ds.PhotometricInterpretation = photometric
    ds.Rows, ds.Columns = stored.shape
    ds.BitsAllocated = 16
    ds.BitsStored = bits_stored
    ds.HighBit = bits_stored - 1
    ds.PixelRepresentation = 0
    ds.PixelData = stored.astype("<u2").tobytes()
    return ds


def _encapsulate(ds: Dataset, frame: bytes, syntax: UID) -> None:
    ds.file_meta.TransferSyntaxUID = syntax
    ds.PixelData = encapsulate([frame])
    ds["PixelData"].VR = "OB"
    ds["PixelData"].is_undefined_length = True


def write_dicom(
    path: Path,
    stored: np.ndarray,
    *,
    photometric: str = "MONOCHROME2",
    bits_stored: int = 12,
    syntax: UID = ExplicitVRLittleEndian,
    **tags: object,
) -> Path:
    ds = _dataset(stored, photometric, bits_stored)
    for keyword, value in tags.items():
        setattr(ds, keyword, value)
    if syntax == JPEGLosslessSV1:
        _encapsulate(ds, lossless_jpeg(stored), syntax)
    elif syntax != ExplicitVRLittleEndian:
        ds.compress(syntax, generate_instance_uid=False)
    ds.save_as(path, enforce_file_format=True)
    return path


def mean_abs_difference(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a.astype(np.float64) - b.astype(np.float64)).mean())


# --- DICOM polarity, windowing, bit depth, encodings ---------------------------------------


def test_monochrome1_and_monochrome2_decode_to_the_same_polarity(tmp_path: Path) -> None:
    pattern = square_on_ramp(12)
    mono2 = write_dicom(tmp_path / "mono2.dcm", pattern, photometric="MONOCHROME2")
    # MONOCHROME1 displays low values bright, so the same picture stores the complement.
    mono1 = write_dicom(tmp_path / "mono1.dcm", 4095 - pattern, photometric="MONOCHROME1")

    for decoded in (decode_grayscale(mono1), decode_grayscale(mono2)):
        background = np.ones(pattern.shape, bool)
        background[SQUARE] = False
        assert decoded.pixels[SQUARE].mean() > decoded.pixels[background].mean() + 100
    assert mean_abs_difference(decode_grayscale(mono1).pixels, decode_grayscale(mono2).pixels) <= 1


def test_output_is_2d_uint8_with_the_source_size(tmp_path: Path) -> None:
    decoded = decode_grayscale(write_dicom(tmp_path / "x.DCM", square_on_ramp(12)))
    assert decoded.pixels.dtype == np.uint8
    assert decoded.pixels.shape == (ROWS, COLS)
    assert (decoded.source_height, decoded.source_width, decoded.reduction) == (ROWS, COLS, 1)


def test_narrow_window_saturates_outside_and_differs_from_min_max(tmp_path: Path) -> None:
    ramp = ramp_4096()
    plain = decode_grayscale(write_dicom(tmp_path / "plain.dcm", ramp)).pixels
    windowed = decode_grayscale(
        write_dicom(tmp_path / "window.dcm", ramp, WindowCenter="2048", WindowWidth="512")
    ).pixels

    assert np.all(windowed[ramp < 1792] == 0)
    assert np.all(windowed[ramp > 2304] == 255)
    assert abs(int(windowed[ramp == 2048][0]) - 128) <= 1  # linear across the window
    assert np.all(np.diff(windowed.ravel().astype(int)) >= 0)
    assert mean_abs_difference(windowed, plain) > 50


def test_first_of_several_windows_is_used(tmp_path: Path) -> None:
    ramp = ramp_4096()
    several = decode_grayscale(
        write_dicom(
            tmp_path / "two.dcm", ramp, WindowCenter=["1000", "3000"], WindowWidth=["200", "400"]
        )
    ).pixels
    assert np.all(several[ramp > 1100] == 255)
    assert np.all(several[ramp < 900] == 0)


def test_voi_lut_sequence_is_applied_and_stretched_over_its_own_range(tmp_path: Path) -> None:
    ramp = ramp_4096()
    # A LUT declared 16 bits deep but filling only 12, as some modalities write them.
    lut = np.clip((np.arange(4096) - 1000) * 2, 0, 4095).astype(np.uint16)
    item = Dataset()
    item.LUTDescriptor = [4096, 0, 16]
    item.add_new("LUTData", "OW", lut.astype("<u2").tobytes())
    path = write_dicom(tmp_path / "lut.dcm", ramp, VOILUTSequence=[item])
    pixels = decode_grayscale(path).pixels

    assert np.all(pixels[ramp <= 1000] == 0)
    assert np.all(pixels[ramp >= 3048] == 255)  # not 255 * 4095 / 65535: the LUT's range
    assert abs(int(pixels[ramp == 2024][0]) - 128) <= 1


def test_rescale_is_applied_before_the_window(tmp_path: Path) -> None:
    stored = ramp_4096()
    # Rescaled value = 2 * stored - 1024; the window 800..1200 in rescaled units is stored
    # 912..1112. Windowing the raw stored values instead would put it at stored 800..1200.
    path = write_dicom(
        tmp_path / "rescaled.dcm",
        stored,
        RescaleSlope="2",
        RescaleIntercept="-1024",
        WindowCenter="1000",
        WindowWidth="400",
    )
    pixels = decode_grayscale(path).pixels

    assert np.all(pixels[stored <= 910] == 0)
    assert np.all(pixels[stored >= 1114] == 255)
    assert abs(int(pixels[stored == 1012][0]) - 128) <= 2


def test_without_window_a_few_outliers_do_not_flatten_the_image(tmp_path: Path) -> None:
    pattern = np.tile(np.linspace(1000, 2000, COLS), (ROWS, 1)).astype(np.uint16)
    pattern[0, :3] = 4095  # a few hot pixels, as from a burned-in marker
    pixels = decode_grayscale(write_dicom(tmp_path / "hot.dcm", pattern)).pixels
    assert pixels[:, -1].mean() > 240  # plain min-max would stop near 255 * 1000 / 4095


@pytest.mark.parametrize("bits_stored", [12, 15])
def test_bits_stored_12_and_15_decode_to_the_full_grey_range(
    tmp_path: Path, bits_stored: int
) -> None:
    pattern = square_on_ramp(bits_stored)
    expected = decode_grayscale(write_dicom(tmp_path / "ref.dcm", square_on_ramp(12))).pixels
    decoded = decode_grayscale(
        write_dicom(tmp_path / "bits.dcm", pattern, bits_stored=bits_stored)
    ).pixels
    assert decoded.min() == 0 and decoded.max() == 255
    assert mean_abs_difference(decoded, expected) <= 1


@pytest.mark.parametrize("syntax", ENCODINGS, ids=ENCODING_IDS)
def test_bits_above_bits_stored_are_ignored(tmp_path: Path, syntax: UID) -> None:
    clean = square_on_ramp(12)
    with_overlay = clean.copy()
    with_overlay[30:40, 5:60] |= 0xF000  # overlay-style bits above High Bit
    path = write_dicom(tmp_path / "overlay.dcm", with_overlay, bits_stored=16, syntax=syntax)
    ds = pydicom.dcmread(path)
    ds.BitsStored, ds.HighBit = 12, 11  # the header says only the low 12 bits are pixels
    ds.save_as(path, enforce_file_format=True)

    expected = decode_grayscale(write_dicom(tmp_path / "clean.dcm", clean)).pixels
    np.testing.assert_array_equal(decode_grayscale(path).pixels, expected)


@pytest.mark.parametrize("bits_stored", [12, 15])
@pytest.mark.parametrize("photometric", ["MONOCHROME1", "MONOCHROME2"])
def test_every_encoding_of_the_same_pixels_decodes_identically(
    tmp_path: Path, bits_stored: int, photometric: str
) -> None:
    stored = square_on_ramp(bits_stored)
    noise = np.random.default_rng(3).integers(0, 64, stored.shape, dtype=np.uint16)
    stored = np.minimum(stored + noise, (1 << bits_stored) - 1).astype(np.uint16)
    decoded = [
        decode_grayscale(
            write_dicom(
                tmp_path / f"{name}.dcm",
                stored,
                photometric=photometric,
                bits_stored=bits_stored,
                syntax=syntax,
            )
        ).pixels
        for syntax, name in zip(ENCODINGS, ENCODING_IDS, strict=True)
    ]
    for other in decoded[1:]:
        np.testing.assert_array_equal(other, decoded[0])


def test_lossless_jpeg_helper_round_trips_through_pydicom(tmp_path: Path) -> None:
    # Guards the test encoder itself: a broken one would make the encoding test vacuous.
    stored = np.random.default_rng(4).integers(0, 1 << 16, (ROWS, COLS), dtype=np.uint16)
    stored[0, 0] = 0  # 0 - the initial prediction 2**15 is the special difference category 16
    path = write_dicom(tmp_path / "jl.dcm", stored, bits_stored=16, syntax=JPEGLosslessSV1)
    ds = pydicom.dcmread(path)
    assert ds.file_meta.TransferSyntaxUID == JPEGLosslessSV1
    np.testing.assert_array_equal(ds.pixel_array, stored)


def test_project_synthetic_dicom_variants_agree(tmp_path: Path) -> None:
    radiograph = render_radiograph(np.random.default_rng(5), 96, 80).pixels
    identity = DicomIdentity("GRDN0000000000001", "1.2.3", "1.2.3.4", "1.2.3.4.5", "PA")
    reference = np.rint(radiograph * 255).ravel()
    for index, variant in enumerate(COVERING_VARIANTS):
        path = tmp_path / f"variant{index}.dcm"
        path.write_bytes(dicom_bytes(radiograph, variant, identity))
        decoded = decode_grayscale(path).pixels
        assert np.corrcoef(decoded.ravel(), reference)[0, 1] > 0.99, variant


# --- JPEG -----------------------------------------------------------------------------------

BIG_HEIGHT, BIG_WIDTH = 2800, 2300
TARGET = 224
# Measured mean |difference| at 224 px is ~0.13 grey levels on this image (0.1-0.7 on other
# sizes and noise levels); 1.0 keeps the reduced decode within one 8-bit step on average.
MAX_REDUCED_DCT_MAD = 1.0


def radiograph_like(height: int, width: int) -> np.ndarray:
    """Smooth gradients with lungs, spine, rib bands and quantum-like noise, as uint8."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    y, x = y / height, x / width
    image = 0.35 + 0.4 * y
    for centre in (0.3, 0.7):
        lung = ((x - centre) / 0.17) ** 2 + ((y - 0.45) / 0.3) ** 2
        image -= 0.25 * np.clip(1 - lung, 0, 1)
    image += 0.25 * np.exp(-(((x - 0.5) / 0.04) ** 2))
    image += 0.06 * np.sin(2 * np.pi * (14 * y + 2 * (x - 0.5) ** 2)) ** 8
    image += np.random.default_rng(6).normal(0, 0.015, image.shape).astype(np.float32)
    return np.clip(image * 255, 0, 255).astype(np.uint8)


@pytest.fixture(scope="module")
def big_jpeg(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("jpeg") / "view1_frontal.jpg"
    Image.fromarray(radiograph_like(BIG_HEIGHT, BIG_WIDTH)).save(path, quality=90)
    return path


def area_resize_long_side(pixels: np.ndarray, long_side: int) -> np.ndarray:
    height, width = pixels.shape
    scale = long_side / max(height, width)
    size = (round(width * scale), round(height * scale))
    return cv2.resize(pixels, size, interpolation=cv2.INTER_AREA)


def test_large_jpeg_uses_reduced_dct_within_a_grey_level_of_full_decode(big_jpeg: Path) -> None:
    full = decode_grayscale(big_jpeg)
    reduced = decode_grayscale(big_jpeg, target_size=TARGET)

    assert full.reduction == 1 and full.pixels.shape == (BIG_HEIGHT, BIG_WIDTH)
    assert reduced.reduction > 1
    assert (reduced.source_height, reduced.source_width) == (BIG_HEIGHT, BIG_WIDTH)
    assert max(reduced.pixels.shape) >= 2 * TARGET  # the margin the area resize relies on
    assert reduced.pixels.shape == tuple(
        -(-side // reduced.reduction) for side in (BIG_HEIGHT, BIG_WIDTH)
    )
    difference = mean_abs_difference(
        area_resize_long_side(reduced.pixels, TARGET), area_resize_long_side(full.pixels, TARGET)
    )
    assert difference <= MAX_REDUCED_DCT_MAD


def test_small_jpeg_is_decoded_at_full_scale(tmp_path: Path) -> None:
    path = tmp_path / "small.jpeg"
    Image.fromarray(radiograph_like(300, 260)).save(path, quality=95)
    decoded = decode_grayscale(path, target_size=TARGET)
    assert decoded.reduction == 1 and decoded.pixels.shape == (300, 260)


def test_colour_jpeg_decodes_to_grayscale(tmp_path: Path) -> None:
    grey = radiograph_like(120, 100)
    rgb_path, grey_path = tmp_path / "rgb.JPG", tmp_path / "grey.jpg"
    Image.fromarray(np.dstack([grey] * 3)).save(rgb_path, quality=95)
    Image.fromarray(grey).save(grey_path, quality=95)
    rgb = decode_grayscale(rgb_path).pixels
    assert rgb.ndim == 2 and rgb.dtype == np.uint8
    assert mean_abs_difference(rgb, decode_grayscale(grey_path).pixels) <= 1.5


# --- PNG ------------------------------------------------------------------------------------


def test_eight_bit_png_is_returned_as_is(tmp_path: Path) -> None:
    pixels = radiograph_like(ROWS, COLS)
    Image.fromarray(pixels).save(tmp_path / "eight.png")
    decoded = decode_grayscale(tmp_path / "eight.png")
    np.testing.assert_array_equal(decoded.pixels, pixels)
    assert (decoded.source_height, decoded.source_width) == (ROWS, COLS)


def test_sixteen_bit_png_full_range_scales_linearly(tmp_path: Path) -> None:
    values = np.linspace(0, 65535, ROWS * COLS).reshape(ROWS, COLS).astype(np.uint16)
    Image.fromarray(values).save(tmp_path / "sixteen.png")
    pixels = decode_grayscale(tmp_path / "sixteen.png").pixels
    expected = np.rint(values / 65535 * 255)
    assert np.abs(pixels.astype(float) - expected).max() <= 1


def test_sixteen_bit_png_using_twelve_bits_is_not_dark(tmp_path: Path) -> None:
    values = square_on_ramp(12)  # 16-bit container, values < 4096
    Image.fromarray(values).save(tmp_path / "twelve.png")
    pixels = decode_grayscale(tmp_path / "twelve.png").pixels
    assert pixels.min() == 0 and pixels.max() == 255
    assert pixels[SQUARE].min() > 200


def test_lossless_rgba_png_is_accepted(tmp_path: Path) -> None:
    grey = radiograph_like(ROWS, COLS)
    rgba = np.dstack([grey, grey, grey, np.full_like(grey, 255)])
    Image.fromarray(rgba, mode="RGBA").save(tmp_path / "rgba.png")
    np.testing.assert_array_equal(decode_grayscale(tmp_path / "rgba.png").pixels, grey)


def test_rgba_png_with_transparency_is_rejected(tmp_path: Path) -> None:
    grey = radiograph_like(ROWS, COLS)
    alpha = np.full_like(grey, 255)
    alpha[:5] = 128
    Image.fromarray(np.dstack([grey, grey, grey, alpha]), mode="RGBA").save(tmp_path / "a.png")
    with pytest.raises(DecodeError, match="alpha"):
        decode_grayscale(tmp_path / "a.png")


# --- errors ---------------------------------------------------------------------------------


def _image_bytes(image_format: str) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(radiograph_like(200, 160)).save(buffer, format=image_format)
    return buffer.getvalue()


@pytest.mark.parametrize(("name", "image_format"), [("cut.jpg", "JPEG"), ("cut.png", "PNG")])
def test_truncated_file_is_a_decode_error(tmp_path: Path, name: str, image_format: str) -> None:
    data = _image_bytes(image_format)
    path = tmp_path / name
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(DecodeError, match="truncated") as caught:
        decode_grayscale(path, target_size=64)
    assert caught.value.path == path
    assert str(caught.value) == f"{path}: {caught.value.reason}"


@pytest.mark.parametrize("name", ["noise.jpg", "noise.jpeg", "noise.png", "noise.dcm"])
def test_random_bytes_are_not_an_image(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    path.write_bytes(np.random.default_rng(7).bytes(4096))
    with pytest.raises(DecodeError, match=r"cannot identify|not a readable DICOM"):
        decode_grayscale(path)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(DecodeError, match="file not found"):
        decode_grayscale(tmp_path / "absent.dcm")


def test_unknown_extension(tmp_path: Path) -> None:
    path = tmp_path / "image.tif"
    path.write_bytes(b"II*\x00")
    with pytest.raises(DecodeError, match="unsupported extension"):
        decode_grayscale(path)


def _with_encapsulated_junk(path: Path, syntax: UID) -> Path:
    ds = pydicom.dcmread(write_dicom(path, square_on_ramp(12)))
    _encapsulate(ds, b"\x00junk" * 16, syntax)
    ds.save_as(path, enforce_file_format=True)
    return path


@pytest.mark.parametrize(
    ("syntax", "name"),
    [(MPEG2MPML, "MPEG2 Main Profile / Main Level"), (UID("1.2.3.4.5.6"), "unknown")],
)
def test_unsupported_transfer_syntax_names_the_uid(tmp_path: Path, syntax: UID, name: str) -> None:
    path = _with_encapsulated_junk(tmp_path / "video.dcm", syntax)
    with pytest.raises(DecodeError, match="unsupported transfer syntax") as caught:
        decode_grayscale(path)
    assert str(syntax) in caught.value.reason and name in caught.value.reason


def test_corrupt_codestream_in_a_supported_syntax(tmp_path: Path) -> None:
    path = _with_encapsulated_junk(tmp_path / "jpegls.dcm", JPEGLSLossless)
    with pytest.raises(DecodeError, match="cannot decode transfer syntax") as caught:
        decode_grayscale(path)
    assert str(JPEGLSLossless) in caught.value.reason


def test_dicom_without_pixel_data(tmp_path: Path) -> None:
    path = write_dicom(tmp_path / "header.dcm", square_on_ramp(12))
    ds = pydicom.dcmread(path)
    del ds.PixelData
    ds.save_as(path, enforce_file_format=True)
    with pytest.raises(DecodeError, match=r"no .* Pixel Data"):
        decode_grayscale(path)


def test_truncated_dicom(tmp_path: Path) -> None:
    path = write_dicom(tmp_path / "cut.dcm", square_on_ramp(12))
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 2000])
    with pytest.raises(DecodeError):
        decode_grayscale(path)


def test_colour_dicom_is_rejected(tmp_path: Path) -> None:
    path = write_dicom(tmp_path / "rgb.dcm", square_on_ramp(12))
    ds = pydicom.dcmread(path)
    ds.PhotometricInterpretation = "PALETTE COLOR"
    ds.save_as(path, enforce_file_format=True)
    with pytest.raises(DecodeError, match="not grayscale"):
        decode_grayscale(path)


@pytest.mark.parametrize("target", [None, TARGET])
def test_jpeg_bytes_in_memory_decode_like_the_file(big_jpeg: Path, target: int | None) -> None:
    from_file = decode_grayscale(big_jpeg, target_size=target)
    from_bytes = decode_grayscale(big_jpeg, target_size=target, content=big_jpeg.read_bytes())
    assert from_bytes.reduction == from_file.reduction
    np.testing.assert_array_equal(from_bytes.pixels, from_file.pixels)


def test_truncated_jpeg_bytes_are_a_decode_error_naming_the_file(big_jpeg: Path) -> None:
    content = big_jpeg.read_bytes()
    with pytest.raises(DecodeError, match=r"view1_frontal\.jpg"):
        decode_grayscale(big_jpeg, target_size=TARGET, content=content[: len(content) // 3])
