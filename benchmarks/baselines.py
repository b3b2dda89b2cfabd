"""What the `images` stage is measured against: each source format's floor decoders, the naive
single-process loop a user would write, the MONAI chain the seed library runs, and the stage's
own per-image work alone (no job, pool or bookkeeping)."""

from __future__ import annotations

import hashlib
import importlib.util
import io
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np
from common import SIZE
from PIL import Image
from synthetic_inputs import (
    dicom_source,
    jpeg_lossless_source,
    jpeg_source,
    png8_rex_source,
    png16_rex_source,
    png_l_source,
    png_rgba_source,
)

from radharmony_pipeline.processing.imaging.decode import decode_grayscale
from radharmony_pipeline.processing.imaging.geometry import letterbox_geometry, resize_image
from radharmony_pipeline.processing.imaging.tagged_png import radiograph_png
from radharmony_pipeline.processing.jobs.image_jobs import content_fingerprints
from radharmony_pipeline.processing.storage.atomic import write_atomically
from radharmony_pipeline.synthetic.dicom import DicomVariant


def sha256_of(content: bytes) -> str:
    return hashlib.sha256(content).hexdigest()


# --- floor decoders: bytes in memory to pixels, nothing else ---------------------------------


def pillow_full(data: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(data)) as image:
        return np.asarray(image)


def pillow_draft(data: bytes) -> np.ndarray:
    """A JPEG at the reduced DCT scale the stage asks for (>= 2 x SIZE on the long side)."""
    with Image.open(io.BytesIO(data)) as image:
        width, height = image.size
        shrink = min(1.0, 2 * SIZE / max(width, height))
        image.draft("L", (math.ceil(width * shrink), math.ceil(height * shrink)))
        return np.asarray(image)


def opencv_unchanged(data: bytes) -> np.ndarray:
    return cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)


def pyspng_load(data: bytes) -> np.ndarray:
    import pyspng

    return pyspng.load(data)


def pydicom_pixels(data: bytes) -> np.ndarray:
    import pydicom

    return pydicom.dcmread(io.BytesIO(data)).pixel_array


def pydicom_header_numpy_view(data: bytes) -> np.ndarray:
    """Uncompressed pixels: the header parsed, the pixels viewed in place (no copy)."""
    import pydicom

    ds = pydicom.dcmread(io.BytesIO(data), defer_size=1 << 16)
    offset = ds.get_item("PixelData", keep_deferred=True).value_tell
    count = int(ds.Rows) * int(ds.Columns)
    return np.frombuffer(data, "<u2", count, offset).reshape(int(ds.Rows), int(ds.Columns))


def pillow_jpeg2000_level(data: bytes) -> np.ndarray:
    """The codestream at the resolution level the stage uses (2 for 3056 x 2544 at 224)."""
    import pydicom
    from pydicom.encaps import generate_frames

    ds = pydicom.dcmread(io.BytesIO(data))
    codestream = next(generate_frames(ds.PixelData, number_of_frames=1))
    with Image.open(io.BytesIO(codestream), formats=["JPEG2000"]) as image:
        image.reduce = 2
        return np.asarray(image)


# --- the naive loop: a correct single-process job, written the plain way ---------------------


def naive_letterbox(pixels: np.ndarray) -> np.ndarray:
    """The naive loop's resize: INTER_AREA of the long side to SIZE, centred zero padding."""
    height, width = pixels.shape
    scale = SIZE / max(height, width)
    # Half up like letterbox_geometry, so both place the content identically.
    new_height = max(1, math.floor(height * scale + 0.5))
    new_width = max(1, math.floor(width * scale + 0.5))
    content = cv2.resize(pixels, (new_width, new_height), interpolation=cv2.INTER_AREA)
    frame = np.zeros((SIZE, SIZE), dtype=np.uint8)
    top, left = (SIZE - new_height) // 2, (SIZE - new_width) // 2
    frame[top : top + new_height, left : left + new_width] = content
    return frame


def naive_dicom_pixels(data: bytes) -> np.ndarray:
    """pydicom's own chain: modality LUT, the first VOI (or the 0.5/99.5 percentiles), 8 bits,
    MONOCHROME1 inverted."""
    import pydicom
    from pydicom.pixels import apply_modality_lut, apply_voi_lut

    ds = pydicom.dcmread(io.BytesIO(data))
    values = apply_modality_lut(ds.pixel_array, ds)
    if "WindowCenter" in ds or "VOILUTSequence" in ds:
        windowed = apply_voi_lut(values, ds, index=0)
        bits = int(ds.BitsStored)
        low, high = (0.0, float((1 << bits) - 1))  # pydicom's window output range
        if ds.PixelRepresentation:
            low, high = -float(1 << (bits - 1)), float((1 << (bits - 1)) - 1)
    else:
        windowed = values
        low, high = np.percentile(values, (0.5, 99.5))
    scaled = np.clip((windowed - low) * (255 / (high - low)), 0, 255)
    pixels = np.rint(scaled).astype(np.uint8)
    return 255 - pixels if ds.PhotometricInterpretation == "MONOCHROME1" else pixels


def naive_pillow_pixels(data: bytes) -> np.ndarray:
    """Pillow's full decode to 8-bit grey; 16-bit images scaled by their own range."""
    with Image.open(io.BytesIO(data)) as image:
        if image.mode in ("L", "RGB", "RGBA"):
            return np.asarray(image.convert("L"))
        values = np.asarray(image).astype(np.float32)
    low, high = float(values.min()), float(values.max())
    return np.rint((values - low) * (255 / (high - low))).astype(np.uint8)


def run_naive(
    pixels_of: Callable[[bytes], np.ndarray], sources: Sequence[Path], folder: Path, hashed: bool
) -> tuple[float, float]:
    """(wall, CPU) seconds of the naive loop over `sources`: read, SHA-256 when `hashed` (as
    the images table records it), decode, letterbox, Pillow PNG into `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    start, cpu = time.perf_counter(), time.process_time()
    for source in sources:
        content = source.read_bytes()
        if hashed:
            sha256_of(content)
        frame = naive_letterbox(pixels_of(content))
        Image.fromarray(frame).save(folder / f"{source.stem}.png", format="PNG")
    return time.perf_counter() - start, time.process_time() - cpu


# --- MONAI: the seed library's chain (the `bench` extra) -------------------------------------


def monai_chain(reader: str) -> Callable[[str], object] | None:
    """The kind of transform chain the seed library runs per image (LoadImage ->
    ScaleIntensityRangePercentiles 0.5/99.5 -> Resize longest SIZE -> SpatialPad); None
    without monai (the `bench` extra)."""
    if importlib.util.find_spec("monai") is None:
        return None
    from monai.transforms import (
        Compose,
        LoadImage,
        Resize,
        ScaleIntensityRangePercentiles,
        SpatialPad,
    )

    return Compose(
        [
            LoadImage(image_only=True, ensure_channel_first=True, reader=reader),
            ScaleIntensityRangePercentiles(lower=0.5, upper=99.5, b_min=0.0, b_max=1.0, clip=True),
            Resize(spatial_size=SIZE, size_mode="longest", mode="area"),
            SpatialPad(spatial_size=(SIZE, SIZE)),
        ]
    )


def run_monai(chain: Callable[[str], object], sources: Sequence[Path]) -> tuple[float, float]:
    """(wall, CPU) seconds of the chain over `sources`, torch's threads included."""
    start, cpu = time.perf_counter(), time.process_time()
    for source in sources:
        result = chain(str(source))
        if tuple(result.shape) != (1, SIZE, SIZE):
            raise SystemExit(f"monai: unexpected output shape {tuple(result.shape)}")
    return time.perf_counter() - start, time.process_time() - cpu


# --- the stage's own per-image work, alone -----------------------------------------------------


def work_alone(folder: Path) -> Callable[[Path], np.ndarray]:
    """The stage's own per-image calls in sequence, in this process, its PNGs written into
    `folder`: read, SHA-256, decode, resize, fingerprints, PNG, write and rename. No job, pool,
    reuse check or tags. Each call returns the resized pixels."""
    folder.mkdir(parents=True, exist_ok=True)

    def work(source: Path) -> np.ndarray:
        content = source.read_bytes()
        sha256_of(content)
        decoded = decode_grayscale(source, target_size=SIZE, content=content)
        geometry = letterbox_geometry(decoded.source_height, decoded.source_width, SIZE)
        pixels = resize_image(decoded.pixels, geometry)
        content_fingerprints(pixels, geometry)
        png = radiograph_png(pixels)
        write_atomically(folder / f"{source.stem}.png", lambda temp: temp.write_bytes(png))
        return pixels

    return work


# --- the source formats, each with its floor decoders and baselines --------------------------


@dataclass(frozen=True)
class Format:
    key: str
    description: str
    suffix: str
    images: int
    write: Callable[[int], bytes]
    decoders: dict[str, Callable[[bytes], np.ndarray]]
    naive_pixels: Callable[[bytes], np.ndarray]
    monai_reader: str
    # Below any decoder: for pixels stored as they are used, viewing the bytes in place.
    bare_read: Callable[[bytes], np.ndarray] | None = None


def _png(key: str, description: str, images: int, write: Callable[[int], bytes]) -> Format:
    decoders = {"pyspng": pyspng_load, "opencv": opencv_unchanged, "pillow": pillow_full}
    return Format(
        key, description, ".png", images, write, decoders, naive_pillow_pixels, "PILReader"
    )


def _dicom(
    key: str,
    description: str,
    images: int,
    write: Callable[[int], bytes],
    decoders: dict[str, Callable[[bytes], np.ndarray]] | None,
) -> Format:
    """A DICOM format: pydicom decodes it unless `decoders` say otherwise, and pixels stored
    uncompressed (no decoders given) also have the bare read, viewed in place."""
    bare = None if decoders else pydicom_header_numpy_view
    decoders = decoders or {"pydicom": pydicom_pixels}
    return Format(
        key, description, ".dcm", images, write, decoders, naive_dicom_pixels, "PydicomReader", bare
    )


def source_formats() -> tuple[Format, ...]:
    """Every source format the four datasets ship (pydicom imported only when asked)."""
    from pydicom.uid import ExplicitVRLittleEndian as NATIVE
    from pydicom.uid import JPEG2000Lossless

    window = dicom_source(DicomVariant(NATIVE, "MONOCHROME2", 12, True, None))
    mono1 = dicom_source(DicomVariant(NATIVE, "MONOCHROME1", 12, False, (1, 0)))
    odd = dicom_source(DicomVariant(NATIVE, "MONOCHROME2", 12, True, None), (3050, 2539))
    j2k = dicom_source(DicomVariant(JPEG2000Lossless, "MONOCHROME2", 12, True, None))
    j2k_decoders = {"pydicom (openjpeg)": pydicom_pixels, "pillow level 2": pillow_jpeg2000_level}
    jpeg_decoders = {"pillow full": pillow_full, "pillow reduced DCT": pillow_draft}
    jpegll_decoders = {"pydicom (libjpeg)": pydicom_pixels}
    described = {
        "jpeg": "baseline JPEG, CheXpert/MIMIC-JPG-like 2320x2828 q90",
        "png8-L": "8-bit PNG L, ChestX-Det-like 1024x1024",
        "png8-RGBA": "8-bit PNG grey RGBA, ChestX-Det-like 1024x1024",
        "png8-rex": "8-bit PNG, ReXGradient-like 730x742",
        "png16-rex": "16-bit PNG (12-bit content), ReXGradient-like 730x742",
        "dicom": "uncompressed 16-bit DICOM, window, MIMIC-like 3056x2544",
        "dicom-mono1": "uncompressed DICOM MONOCHROME1, no window, 3056x2544",
        "dicom-odd": "uncompressed DICOM, window, 3050x2539 (no common factor: partial last "
        "blocks)",
        "dicom-j2k": "JPEG 2000 lossless DICOM, window, 3056x2544",
        "dicom-jpegll": "JPEG Lossless SV1 DICOM, window, 3056x2544",
    }
    jpeg = Format(
        "jpeg",
        described["jpeg"],
        ".jpg",
        24,
        jpeg_source,
        jpeg_decoders,
        naive_pillow_pixels,
        "PILReader",
    )
    pngs = {
        "png8-L": (40, png_l_source),
        "png8-RGBA": (40, png_rgba_source),
        "png8-rex": (48, png8_rex_source),
        "png16-rex": (48, png16_rex_source),
    }
    dicoms = {
        "dicom": (16, window, None),
        "dicom-mono1": (16, mono1, None),
        "dicom-odd": (12, odd, None),
        "dicom-j2k": (12, j2k, j2k_decoders),
        "dicom-jpegll": (12, jpeg_lossless_source, jpegll_decoders),
    }
    return (
        jpeg,
        *(_png(key, described[key], images, write) for key, (images, write) in pngs.items()),
        *(_dicom(key, described[key], *chosen) for key, chosen in dicoms.items()),
    )
