"""The synthetic inputs benchmarks measure on, seeded so every run meets the same files:
CheXpert-like full-resolution JPEGs, radiograph PNGs, each source format's files, ReXGradient
partitions and metadata (report_texts.py writes the report texts)."""

from __future__ import annotations

import io
import os
import time
from collections.abc import Callable
from pathlib import Path

import cv2
import numpy as np
from PIL import Image

from radharmony_pipeline.processing.storage.atomic import temporary_sibling
from radharmony_pipeline.synthetic import rexgradient
from radharmony_pipeline.synthetic.dicom import DicomIdentity, DicomVariant, dicom_bytes
from radharmony_pipeline.synthetic.encoding import png_bytes, rgba_png_bytes
from radharmony_pipeline.synthetic.radiograph import render_radiograph, to_uint8, to_unsigned
from radharmony_pipeline.synthetic.seeding import dataset_rng

# --- full-resolution CheXpert-like JPEGs ---------------------------------------------------

JPEG_SEED = 0
JPEG_QUALITY = 90
WIDTH_RANGE = (2300, 2400)  # CheXpert full-resolution frontals are ~2320 x 2828
HEIGHT_RANGE = (2800, 2900)
LATERAL_FRACTION = 0.15  # a share of lateral views, as in CheXpert
# render_radiograph is smooth and compresses to ~0.2 MB; real full-resolution CheXpert JPEGs
# are ~2 MB (quantum mottle, fine texture). Entropy decoding, which no DCT scale skips, grows
# with the compressed size, so Gaussian noise of this standard deviation (in [0, 1] units,
# 0.02 ~ 5 grey levels) brings files to ~1.5 MB and decode cost close to the real thing.
DEFAULT_NOISE = 0.02


def jpeg_bytes(pixels: np.ndarray) -> bytes:
    """Baseline grayscale JPEG of uint8 pixels at JPEG_QUALITY (CheXpert's are about so)."""
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="JPEG", quality=JPEG_QUALITY)
    return buffer.getvalue()


def write_atomically(path: Path, content: bytes) -> None:
    """A killed run must not leave a truncated file that the next run would reuse."""
    temp = temporary_sibling(path)
    temp.write_bytes(content)
    os.replace(temp, path)


def write_radiograph_jpeg(
    path: Path, index: int, noise: float, shape: tuple[int, int] | None = None
) -> None:
    """One seeded CheXpert-like radiograph (its own generator, so any subset regenerates
    identically); `shape` (height, width) replaces the full-resolution size (smoke runs)."""
    rng = np.random.default_rng([JPEG_SEED, index])
    width = int(rng.integers(WIDTH_RANGE[0], WIDTH_RANGE[1] + 1))
    height = int(rng.integers(HEIGHT_RANGE[0], HEIGHT_RANGE[1] + 1))
    if shape is not None:
        height, width = shape
    view = "lateral" if rng.random() < LATERAL_FRACTION else "frontal"
    pixels = render_radiograph(rng, height, width, view).pixels
    if noise > 0:
        pixels = pixels + np.float32(noise) * rng.standard_normal(pixels.shape, dtype=np.float32)
    write_atomically(path, jpeg_bytes(to_uint8(pixels)))


def prepare_jpeg_sources(
    folder: Path, count: int, noise: float, shape: tuple[int, int] | None = None
) -> tuple[list[Path], int, float]:
    """The `count` JPEGs in `folder`, writing missing ones: (paths, written, seconds)."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / f"patient{index:05d}_study1_view1.jpg" for index in range(count)]
    start = time.perf_counter()
    missing = [(index, path) for index, path in enumerate(paths) if not path.is_file()]
    for index, path in missing:
        write_radiograph_jpeg(path, index, noise, shape)
    return paths, len(missing), time.perf_counter() - start


# --- radiographs and PNG files --------------------------------------------------------------


def noisy_radiograph(seed: int, index: int, height: int, width: int, noise: float) -> np.ndarray:
    """A frontal radiograph in [0, 1] plus Gaussian detector noise, seeded per image."""
    rng = np.random.default_rng([seed, index, height, width])
    pixels = render_radiograph(rng, height, width, "frontal").pixels
    noisy = pixels + np.float32(noise) * rng.standard_normal(pixels.shape, dtype=np.float32)
    return np.clip(noisy, 0, 1)


def write_radiograph_png(path: Path, rng: np.random.Generator, height: int, width: int) -> None:
    """An 8-bit PNG radiograph (an existing file replaced, a hard link's other names kept)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    cv2.imwrite(str(path), to_uint8(render_radiograph(rng, height, width, "frontal").pixels))


def change_sources(sources: list[Path], share: float, round_number: int) -> int:
    """Rewrite a fresh share of the sources with other pixels; how many."""
    count = max(1, round(len(sources) * share))
    rng = np.random.default_rng(1000 + round_number)
    for position in rng.choice(len(sources), count, replace=False):
        height, width = cv2.imread(str(sources[position]), cv2.IMREAD_UNCHANGED).shape
        write_radiograph_png(sources[position], rng, height, width)
    return count


# --- each source format's files, at the datasets' sizes --------------------------------------

FORMAT_SEED = 23
IDENTITY = DicomIdentity("GRDN0000000000023", "1.2.3", "1.2.3.4", "1.2.3.4.5", "PA")
MIMIC_SHAPE = (3056, 2544)


def _radiograph(index: int, height: int, width: int, noise: float) -> np.ndarray:
    return noisy_radiograph(FORMAT_SEED, index, height, width, noise)


def jpeg_source(index: int) -> bytes:
    return jpeg_bytes(to_uint8(_radiograph(index, 2828, 2320, 0.02)))


def png_l_source(index: int) -> bytes:
    return png_bytes(to_uint8(_radiograph(index, 1024, 1024, 0.02)))


def png_rgba_source(index: int) -> bytes:
    return rgba_png_bytes(to_uint8(_radiograph(index, 1024, 1024, 0.02)))


def png8_rex_source(index: int) -> bytes:
    return png_bytes(to_uint8(_radiograph(index, 742, 730, 0.01)))


def png16_rex_source(index: int) -> bytes:
    return png_bytes(to_unsigned(_radiograph(index, 742, 730, 0.01), 12))


def dicom_source(
    variant: DicomVariant, shape: tuple[int, int] = MIMIC_SHAPE
) -> Callable[[int], bytes]:
    """The writer of a DICOM format's file `index`: a noisy radiograph of `shape`."""

    def write(index: int) -> bytes:
        return dicom_bytes(_radiograph(index, *shape, 0.01), variant, IDENTITY)

    return write


def lossless_jpeg_codestream(stored: np.ndarray, precision: int = 16) -> bytes:
    """ITU-T T.81 process 14, predictor 1, one Huffman table giving every difference category
    a 5-bit code: a valid JPEG Lossless (SV1) codestream, built with numpy."""
    rows, cols = stored.shape
    values = stored.astype(np.int64)
    predicted = np.empty_like(values)
    predicted[:, 1:] = values[:, :-1]
    predicted[1:, 0] = values[:-1, 0]
    predicted[0, 0] = 1 << (precision - 1)
    difference = (values - predicted) % 65536
    difference = np.where(difference >= 32768, difference - 65536, difference).ravel()
    magnitude = np.abs(difference)
    category = np.zeros(magnitude.shape, dtype=np.int64)
    nonzero = magnitude > 0
    category[nonzero] = np.floor(np.log2(magnitude[nonzero])).astype(np.int64) + 1
    extra_bits = np.where(category < 16, category, 0)
    extra = np.where(difference > 0, difference, difference + (1 << extra_bits) - 1)
    extra = np.where(extra_bits > 0, extra, 0)
    code = (category << extra_bits) | extra
    lengths = 5 + extra_bits
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    total = int(lengths.sum())
    bits = np.ones(total + (-total % 8), dtype=np.uint8)  # pad with 1-bits (T.81 F.1.2.3)
    for bit in range(int(lengths.max())):
        has = lengths > bit
        bits[starts[has] + bit] = (code[has] >> (lengths[has] - 1 - bit)) & 1
    data = np.packbits(bits).tobytes().replace(b"\xff", b"\xff\x00")

    def segment(marker: int, body: bytes) -> bytes:
        return bytes([0xFF, marker]) + (len(body) + 2).to_bytes(2, "big") + body

    frame = bytes([precision]) + rows.to_bytes(2, "big") + cols.to_bytes(2, "big")
    frame += bytes([1, 1, 0x11, 0])
    huffman = bytes([0x00, 0, 0, 0, 0, 17] + [0] * 11) + bytes(range(17))
    scan = bytes([1, 1, 0x00, 1, 0, 0])
    return (
        b"\xff\xd8"
        + segment(0xC3, frame)
        + segment(0xC4, huffman)
        + segment(0xDA, scan)
        + data
        + b"\xff\xd9"
    )


def jpeg_lossless_source(index: int) -> bytes:
    """A windowed 12-bit DICOM whose pixels are re-encoded as JPEG Lossless SV1."""
    import pydicom
    from pydicom.encaps import encapsulate
    from pydicom.uid import ExplicitVRLittleEndian, JPEGLosslessSV1

    variant = DicomVariant(ExplicitVRLittleEndian, "MONOCHROME2", 12, True, None)
    ds = pydicom.dcmread(io.BytesIO(dicom_source(variant)(index)))
    stored = ds.pixel_array
    ds.file_meta.TransferSyntaxUID = JPEGLosslessSV1
    ds.PixelData = encapsulate([lossless_jpeg_codestream(stored)])
    ds["PixelData"].VR = "OB"
    ds["PixelData"].is_undefined_length = True
    buffer = io.BytesIO()
    ds.save_as(buffer, enforce_file_format=True)
    return buffer.getvalue()


# --- ReXGradient partitions and metadata ---------------------------------------------------

REXGRADIENT_PARTITION = "rexgradient.train"
SMALL_SIDES = (180, 200)


def write_rexgradient_partition(
    root: Path, images: int, seed: int = 0, sides: tuple[int, int] = SMALL_SIDES
) -> list[Path]:
    """ReXGradient metadata with `images` train images (tiny val and test), one rendered
    radiograph of `sides` per ImagePath under root/rexgradient; the train PNGs' paths."""
    sizes = {
        "train": rexgradient.SplitSize(max(1, images * 6 // 10), images, max(1, images * 4 // 10)),
        "val": rexgradient.SplitSize(3, 5, 2),
        "test": rexgradient.SplitSize(3, 5, 2),
    }
    studies = rexgradient.write_metadata(root / "rexgradient", seed, sizes, sides)
    train = []
    for split_index, split in enumerate(rexgradient.SPLIT_FILES):
        index = 0
        for _, study in studies[split]:
            for path, (height, width) in zip(study["ImagePath"], study["ImageShape"], strict=True):
                rng = dataset_rng(seed, "rexgradient", 1, split_index, index)
                relative = path.removeprefix(rexgradient.IMAGE_PREFIX)
                target = root / "rexgradient" / "deid_png" / relative
                write_radiograph_png(target, rng, height, width)
                if split == "train":
                    train.append(target)
                index += 1
    return train


def write_rexgradient_metadata(base: Path, smoke: bool, seed: int = 0) -> Path:
    """ReXGradient metadata without images under base/rexgradient, at the release's size
    (or, for a smoke run, 40 train images); the rexgradient root."""
    if not smoke:
        from radharmony_pipeline.synthetic import write_full_scale_rexgradient_metadata

        return write_full_scale_rexgradient_metadata(base, seed)
    sizes = {
        "train": rexgradient.SplitSize(24, 40, 16),
        "val": rexgradient.SplitSize(3, 5, 2),
        "test": rexgradient.SplitSize(3, 5, 2),
    }
    rexgradient.write_metadata(base / "rexgradient", seed, sizes, SMALL_SIDES)
    return base / "rexgradient"
