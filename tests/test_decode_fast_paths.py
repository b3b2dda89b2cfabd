"""The `images` stage's fast decode paths (lookup-table windowing, whole-factor reduction,
pyspng, JPEG 2000 resolution levels) against the implementation they replaced and against
pydicom's own modality, VOI and windowing functions."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pydicom
import pytest
from decode_reference import (
    reference_dicom,
    reference_jpeg,
    reference_letterbox,
    reference_png,
    reference_resize,
)
from PIL import Image
from pydicom.dataset import Dataset
from pydicom.pixels import apply_modality_lut, apply_voi_lut, apply_windowing
from pydicom.uid import ExplicitVRLittleEndian, JPEG2000Lossless, JPEGLosslessSV1, RLELossless
from test_decode import write_dicom

from radharmony_pipeline.processing.imaging.decode import decode_grayscale
from radharmony_pipeline.processing.imaging.geometry import (
    letterbox_geometry,
    reduce_by_area,
    reduce_with_partial_blocks,
    resize_image,
)
from radharmony_pipeline.processing.imaging.pixels import (
    reduce_stored_values,
    uneven_reduction_factor,
)
from radharmony_pipeline.synthetic.radiograph import render_radiograph, to_uint8, to_unsigned

S = 224
# Sides with a large common divisor, so the whole-factor reduction applies (factor 2 or 3).
SHAPES = [(1200, 1000), (1792, 1344)]


def radiograph(shape: tuple[int, int], seed: int, noise: float = 0.01) -> np.ndarray:
    """Radiograph-like [0, 1] floats with detector noise."""
    rng = np.random.default_rng(seed)
    pixels = render_radiograph(rng, *shape, "frontal").pixels
    noisy = pixels + np.float32(noise) * rng.standard_normal(pixels.shape, dtype=np.float32)
    return np.clip(noisy, 0, 1)


def stage_pixels(path: Path) -> np.ndarray:
    """What `images` stores for `path` (decode with the target size, letterbox)."""
    decoded = decode_grayscale(path, target_size=S)
    geometry = letterbox_geometry(decoded.source_height, decoded.source_width, S)
    return resize_image(decoded.pixels, geometry)


def grey_levels_apart(got: np.ndarray, expected: np.ndarray) -> np.ndarray:
    assert got.shape == expected.shape
    return np.abs(got.astype(np.int16) - expected.astype(np.int16))


def assert_within_one_grey_level(got: np.ndarray, expected: np.ndarray) -> None:
    difference = grey_levels_apart(got, expected)
    assert difference.max() <= 1, (difference.max(), int((difference > 1).sum()))


# --- every source format against the previous implementation ---------------------------------


@pytest.mark.parametrize("shape", [*SHAPES, (1024, 1024), (900, 900), (742, 730)])
def test_eight_bit_grey_and_rgba_png(tmp_path: Path, shape: tuple[int, int]) -> None:
    grey = to_uint8(radiograph(shape, 1, noise=0.02))
    Image.fromarray(grey).save(tmp_path / "l.png")
    rgba = np.dstack([grey, grey, grey, np.full_like(grey, 255)])
    Image.fromarray(rgba, mode="RGBA").save(tmp_path / "rgba.png")
    for name in ("l.png", "rgba.png"):
        assert_within_one_grey_level(
            stage_pixels(tmp_path / name), reference_letterbox(reference_png(tmp_path / name), S)
        )


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("bits", [12, 16])
def test_sixteen_bit_png(tmp_path: Path, shape: tuple[int, int], bits: int) -> None:
    path = tmp_path / "sixteen.png"
    Image.fromarray(to_unsigned(radiograph(shape, 2), bits)).save(path)
    assert decode_grayscale(path, target_size=S).reduction > 1  # the path under test
    assert_within_one_grey_level(stage_pixels(path), reference_letterbox(reference_png(path), S))


def test_sixteen_bit_png_is_never_clipped(tmp_path: Path) -> None:
    # Values spread over the whole 16-bit range, and over 12 bits only: each fills 0-255 and
    # keeps distinct values distinct (an 8-bit conversion would clip or flatten them).
    for top in (65535, 4095):
        values = np.linspace(0, top, 1200 * 1000).reshape(1200, 1000).astype(np.uint16)
        path = tmp_path / f"ramp{top}.png"
        Image.fromarray(values).save(path)
        decoded = decode_grayscale(path, target_size=S)
        assert decoded.pixels.min() == 0 and decoded.pixels.max() == 255
        expected = np.rint(reduce_by_area(values, decoded.reduction) / top * 255)
        assert np.abs(decoded.pixels - expected).max() <= 1
        assert len(np.unique(decoded.pixels)) == 256


def test_baseline_jpeg(tmp_path: Path) -> None:
    path = tmp_path / "view1_frontal.jpg"
    Image.fromarray(to_uint8(radiograph((2320, 1900), 3, noise=0.02))).save(path, quality=90)
    expected = reference_resize(reference_jpeg(path, S), (2320, 1900), S)
    assert_within_one_grey_level(stage_pixels(path), expected)


DICOM_SYNTAXES = [ExplicitVRLittleEndian, RLELossless, JPEG2000Lossless, JPEGLosslessSV1]


@pytest.mark.parametrize("syntax", DICOM_SYNTAXES, ids=lambda syntax: syntax.name)
@pytest.mark.parametrize(
    ("photometric", "tags"),
    [
        ("MONOCHROME2", {"WindowCenter": "2048", "WindowWidth": "4096"}),
        ("MONOCHROME1", {}),  # no window: robust percentiles from the histogram
        ("MONOCHROME2", {"RescaleSlope": "2", "RescaleIntercept": "-1024"}),
    ],
    ids=["window", "monochrome1-percentiles", "rescale-percentiles"],
)
@pytest.mark.slow
def test_dicom_formats(tmp_path: Path, syntax, photometric: str, tags: dict) -> None:
    # 1792 x 1536: sides divisible by 2, so the JPEG 2000 path decodes at level 1 and the
    # others average 2 x 2 blocks.
    stored = to_unsigned(radiograph((1792, 1536), 4), 12)
    path = write_dicom(tmp_path / "x.dcm", stored, photometric=photometric, syntax=syntax, **tags)
    got, expected = stage_pixels(path), reference_letterbox(reference_dicom(path), S)
    if syntax == JPEG2000Lossless:
        # A resolution level is the wavelet's low-pass, not a 2 x 2 mean: close, not equal.
        difference = grey_levels_apart(got, expected)
        assert difference.mean() < 0.5 and np.percentile(difference, 99) <= 3
    else:
        assert_within_one_grey_level(got, expected)


def test_jpeg2000_level_decode_equals_the_full_decode_at_level_zero(tmp_path: Path) -> None:
    # An image too small to reduce takes the full decode: exactly the previous pixels.
    stored = to_unsigned(radiograph((300, 260), 5), 12)
    path = write_dicom(tmp_path / "small.dcm", stored, syntax=JPEG2000Lossless)
    np.testing.assert_array_equal(
        decode_grayscale(path, target_size=S).pixels, reference_dicom(path)
    )


def test_a_clipping_window_changes_pixels_by_a_bounded_amount(tmp_path: Path) -> None:
    # Averaging before windowing differs from windowing first where the window clips: the
    # reason IMAGE_CODE_VERSION went to 3. Bounded on average, not per pixel.
    stored = to_unsigned(radiograph((1792, 1536), 6), 12)
    path = write_dicom(tmp_path / "narrow.dcm", stored, WindowCenter="2000", WindowWidth="600")
    difference = grey_levels_apart(
        stage_pixels(path), reference_letterbox(reference_dicom(path), S)
    )
    assert difference.mean() < 0.5


# Sides without a common factor: 1201 is prime, 2539 too, 3050 = 2 x 5^2 x 61.
ODD_SHAPES = [(1201, 1000), (1000, 1201), (3050, 2539)]


def assert_near_within_one_grey_level(got: np.ndarray, expected: np.ndarray) -> None:
    """At most 2 grey levels anywhere and more than 1 in under 0.1 % of the pixels: blocks
    taken as uniform where the resampling between block and source grids cuts them
    (IMAGE_CODE_VERSION 4) differ only at sharp edges."""
    difference = grey_levels_apart(got, expected)
    assert difference.max() <= 2, difference.max()
    assert (difference > 1).mean() < 0.001, int((difference > 1).sum())


@pytest.mark.parametrize("shape", ODD_SHAPES)
def test_dicom_sides_without_a_common_factor_are_reduced_with_partial_blocks(
    tmp_path: Path, shape: tuple[int, int]
) -> None:
    stored = to_unsigned(radiograph(shape, 7), 12)
    path = write_dicom(tmp_path / "odd.dcm", stored, WindowCenter="2048", WindowWidth="4096")
    decoded = decode_grayscale(path, target_size=S)
    assert decoded.reduction > 1  # the path under test
    # The reduced pixels tile the source exactly: side // factor of them on each side.
    assert decoded.pixels.shape == tuple(side // decoded.reduction for side in shape)
    assert_near_within_one_grey_level(
        stage_pixels(path), reference_letterbox(reference_dicom(path), S)
    )


@pytest.mark.parametrize("shape", ODD_SHAPES[:2])
def test_sixteen_bit_png_sides_without_a_common_factor(tmp_path: Path, shape) -> None:
    path = tmp_path / "odd.png"
    Image.fromarray(to_unsigned(radiograph(shape, 8), 12)).save(path)
    assert decode_grayscale(path, target_size=S).reduction > 1
    assert_near_within_one_grey_level(
        stage_pixels(path), reference_letterbox(reference_png(path), S)
    )


@pytest.mark.parametrize(
    ("shape", "factor"),
    [((3050, 2539), 4), ((5003, 4001), 8), ((2701, 2300), 4), ((1201, 1000), 2), ((899, 700), 1)],
)
def test_sides_without_a_common_factor_are_reduced_by_a_power_of_two(shape, factor) -> None:
    # The largest power of two keeping REDUCTION_MARGIN x S pixels on the short side: OpenCV
    # halves fast, and a factor such as 5 or 3 costs several times more over the whole image.
    assert uneven_reduction_factor(*shape, S) == factor
    reduced, used = reduce_stored_values(to_unsigned(radiograph(shape, 3), 12), S)
    assert used == factor
    assert reduced.shape == tuple(side // factor for side in shape)


def test_partial_block_reduction_keeps_a_ramp_in_place() -> None:
    # A ramp of 50 per source row stays that ramp at the reduced size: each reduced pixel
    # holds the value at the centre of the source span it tiles, to within half a source
    # pixel where a span cuts a block (blocks are taken as uniform), and no drift overall.
    rows = np.arange(1201, dtype=np.float64)[:, None] * np.ones((1, 1000))
    ramp = np.rint(rows * 50).astype(np.uint16)
    centres = ((np.arange(600) + 0.5) * 1201 / 600 - 0.5) * 50
    for reduced in (
        reduce_with_partial_blocks(ramp, 2)[:, 0],
        reduce_with_partial_blocks(ramp.T, 2)[0],
    ):
        assert reduced.shape == (600,)
        error = reduced - centres
        assert np.abs(error).max() < 25 and abs(error.mean()) < 2.5, (error.min(), error.max())
    # Sides the factor divides are plain block means.
    np.testing.assert_array_equal(
        reduce_with_partial_blocks(ramp[:1200], 2), reduce_by_area(ramp[:1200], 2)
    )


def test_small_images_are_not_reduced(tmp_path: Path) -> None:
    stored = to_unsigned(radiograph((401, 300), 9), 12)
    path = write_dicom(tmp_path / "small.dcm", stored, WindowCenter="2048", WindowWidth="4096")
    decoded = decode_grayscale(path, target_size=S)
    assert decoded.reduction == 1
    np.testing.assert_array_equal(decoded.pixels, reference_dicom(path))


# --- the lookup table against pydicom's own functions ---------------------------------------


def pydicom_presentation(path: Path, use_windowing: bool) -> np.ndarray:
    """pydicom's modality LUT, then its VOI (apply_windowing for a window, apply_voi_lut
    otherwise), stretched over the VOI's output range (or the image's robust range), as
    8 bits, MONOCHROME1 inverted."""
    ds = pydicom.dcmread(path)
    values = apply_modality_lut(ds.pixel_array, ds)
    if "VOILUTSequence" in ds:
        windowed = apply_voi_lut(np.rint(values).astype(np.int64), ds)
        entries, first = ds.VOILUTSequence[0].LUTDescriptor[:2]
        entries = entries or 65536  # 0 means 2**16 entries
        probe = apply_voi_lut(np.arange(first, first + entries, dtype=np.int64), ds)
        low, high = float(probe.min()), float(probe.max())
    elif "WindowCenter" in ds:
        voi = apply_windowing if use_windowing else apply_voi_lut
        windowed = voi(values, ds)
        probe = voi(np.array([-np.inf, np.inf]), ds)
        low, high = float(probe.min()), float(probe.max())
    else:
        windowed = values
        low, high = np.percentile(values, (0.5, 99.5))
    scaled = (windowed.astype(np.float32) - np.float32(low)) * np.float32(255 / (high - low))
    pixels = np.rint(np.clip(scaled, 0, 255)).astype(np.uint8)
    return 255 - pixels if ds.PhotometricInterpretation == "MONOCHROME1" else pixels


def voi_lut_item(bits_stored: int) -> Dataset:
    entries = 1 << bits_stored
    lut = np.clip((np.arange(entries) - entries // 4) * 2, 0, entries - 1).astype(np.uint16)
    item = Dataset()
    item.LUTDescriptor = [entries % 65536, 0, 16]
    item.add_new("LUTData", "OW", lut.astype("<u2").tobytes())
    return item


# A VOI LUT is indexed by unsigned stored values here; every other VOI with both signs.
LOOKUP_CASES = [
    (voi, signed)
    for voi in ("window", "voi-lut", "rescale-window", "none", "monochrome1-window")
    for signed in (False, True)
    if not (voi == "voi-lut" and signed)
]


@pytest.mark.parametrize("bits_stored", [10, 12, 14, 16])
@pytest.mark.parametrize(("voi", "signed"), LOOKUP_CASES)
def test_lookup_table_matches_pydicom(
    tmp_path: Path, bits_stored: int, signed: bool, voi: str
) -> None:
    rng = np.random.default_rng(bits_stored)
    top = 1 << bits_stored
    low, high = (-(top // 2), top // 2) if signed else (0, top)
    stored = rng.integers(low, high, (90, 70)).astype(np.int16 if signed else np.uint16)
    centre, width = (low + high) // 2, (high - low) // 3
    tags: dict = {}
    if voi in ("window", "rescale-window", "monochrome1-window"):
        tags.update(WindowCenter=str(centre), WindowWidth=str(width))
    if voi == "rescale-window":
        tags.update(RescaleSlope="1.5", RescaleIntercept="-100")
    if voi == "voi-lut":
        tags["VOILUTSequence"] = [voi_lut_item(bits_stored)]
    photometric = "MONOCHROME1" if voi == "monochrome1-window" else "MONOCHROME2"
    path = write_dicom(
        tmp_path / "lut.dcm",
        stored.view(np.uint16),
        photometric=photometric,
        bits_stored=bits_stored,
        PixelRepresentation=int(signed),
        **tags,
    )
    # Stored values must read back as written (signed ones sign-extended from BitsStored).
    np.testing.assert_array_equal(pydicom.dcmread(path).pixel_array, stored)
    decoded = decode_grayscale(path).pixels  # no target: the table over full-size pixels
    for use_windowing in (True, False):
        np.testing.assert_array_equal(decoded, pydicom_presentation(path, use_windowing))
