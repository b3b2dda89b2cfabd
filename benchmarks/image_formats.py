"""The `formats` section of bench_images.py (formerly bench_formats.py): the `images` stage's
marginal cost per image for every source format the four datasets ship, against that format's
floor, a correct naive loop and MONAI.

For each format it writes seeded synthetic sources at realistic sizes and entropy (radiograph
content plus detector noise), then measures in the same run:

* floor: the fastest installed decoder's decode-only CPU time per image (bytes in memory,
  every decoder tried, reduced-resolution decodes included where the format has them), plus
  the SHA-256 of the file that the `images` table records;
* bare floor, for uncompressed DICOM: no decoder at all, the header parsed and the pixel
  bytes viewed in place, plus the SHA-256 (what is left is the stage's own work: the read's
  copy, one pass reducing the stored values, the window table, resize, PNG, hashes);
* stage: the step's marginal CPU per image, i.e. what one more image adds to
  build_packed_images (the asset's own call; decode, window, resize, PNG, hashes, rows) with
  one worker: (CPU over all N images - CPU over the first N/16) / (N - N/16), CPU of the parent
  and its worker processes, the minimum over --repeats runs;
* ratio: per repeat, one floor pass and right after it one stage pair (N/16 and N images),
  their ratio; the verdict is the median of these paired ratios (target: <= 1.5x). The
  host's speed drifts by tens of percent between runs seconds apart, and a floor and a stage
  measured back to back share that drift, where the best of each, taken minutes apart, do
  not (that ratio is printed too);
* work alone: the stage's own per-image calls in sequence in one process (read, SHA-256,
  decode, resize, fingerprints, PNG, write), no job, pool or bookkeeping;
* naive: a correct single-process loop (full decode; the same modality LUT, VOI window or
  robust range and MONOCHROME1 inversion through pydicom; min-max of 16-bit PNGs; 8 bits;
  INTER_AREA letterbox; Pillow PNG; SHA-256), CPU per image, as a ratio naive / stage;
* MONAI (when installed: `make install-bench`): LoadImage -> ScaleIntensityRangePercentiles
  -> Resize -> SpatialPad, CPU per image (torch's threads included), ratio MONAI / stage;

then a projection of all ten partitions at the documented image counts (read from the
sources' documented_counts): the stage's CPU, and its wall time from the measured 1- and
2-worker marginal rates (plus each partition's fixed part once), extended linearly per added
worker.
CPU times are per image and the minimum of repeats, so other programs on the machine move
them less than wall times; the load average is printed at the start and the end.

    .venv/bin/python benchmarks/bench_images.py --sections formats [--keep DIR] [--repeats 2]
        [--scale 1.0] [--only png16-rex,dicom]
"""

from __future__ import annotations

import hashlib
import io
import math
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np
import pydicom
import pyspng
from common import (
    SIZE,
    cpu_per_image,
    load_line,
    monai_chain,
    naive_letterbox,
    noisy_radiograph,
    pool_cpu_seconds,
    stage_jobs,
)
from PIL import Image
from pydicom.encaps import encapsulate, generate_frames
from pydicom.pixels import apply_modality_lut, apply_voi_lut
from pydicom.uid import ExplicitVRLittleEndian, JPEG2000Lossless, JPEGLosslessSV1

from radharmony_pipeline.processing.execution.cluster import LocalPool
from radharmony_pipeline.processing.execution.supervised import TimeLimit
from radharmony_pipeline.processing.imaging.decode import decode_grayscale
from radharmony_pipeline.processing.imaging.geometry import letterbox_geometry, resize_image
from radharmony_pipeline.processing.imaging.image_files import header_image_size
from radharmony_pipeline.processing.imaging.tagged_png import radiograph_png
from radharmony_pipeline.processing.jobs.image_jobs import (
    build_packed_images,
    content_fingerprints,
    image_job_stopped,
    image_table,
)
from radharmony_pipeline.processing.storage import output_layout as layout
from radharmony_pipeline.processing.storage.atomic import temporary_sibling, write_atomically
from radharmony_pipeline.settings import TIMEOUT_VARIABLE, job_timeout
from radharmony_pipeline.sources import SOURCE_TYPES, partition_keys
from radharmony_pipeline.synthetic.dicom import DicomIdentity, DicomVariant, dicom_bytes
from radharmony_pipeline.synthetic.radiograph import to_uint8, to_unsigned

SEED = 23
TARGET_RATIO = 1.5
# The formats whose files the `masks` stage opens, and for which dataset: it reads only the
# header (the size the annotations must match), so its floor is opening the file and
# reading its first block.
MASK_HEADER_READERS = {"jpeg": "CheXlocalize", "png8-L": "ChestX-Det", "png8-RGBA": "ChestX-Det"}
HEADER_BLOCK = 4096
CORPUS_TARGET_MINUTES = 30
PARTITIONS = len(partition_keys())


# --- sources -------------------------------------------------------------------------------


def radiograph(index: int, height: int, width: int, noise: float) -> np.ndarray:
    return noisy_radiograph(SEED, index, height, width, noise)


def png_bytes(pixels: np.ndarray, mode: str | None = None) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels, mode=mode).save(buffer, format="PNG")
    return buffer.getvalue()


def jpeg_source(index: int) -> bytes:
    buffer = io.BytesIO()
    pixels = to_uint8(radiograph(index, 2828, 2320, 0.02))
    Image.fromarray(pixels).save(buffer, format="JPEG", quality=90)
    return buffer.getvalue()


def png_l_source(index: int) -> bytes:
    return png_bytes(to_uint8(radiograph(index, 1024, 1024, 0.02)))


def png_rgba_source(index: int) -> bytes:
    grey = to_uint8(radiograph(index, 1024, 1024, 0.02))
    return png_bytes(np.dstack([grey, grey, grey, np.full_like(grey, 255)]), "RGBA")


def png8_rex_source(index: int) -> bytes:
    return png_bytes(to_uint8(radiograph(index, 742, 730, 0.01)))


def png16_rex_source(index: int) -> bytes:
    return png_bytes(to_unsigned(radiograph(index, 742, 730, 0.01), 12))


IDENTITY = DicomIdentity("GRDN0000000000023", "1.2.3", "1.2.3.4", "1.2.3.4.5", "PA")
MIMIC_SHAPE = (3056, 2544)


def dicom_source(variant: DicomVariant, shape: tuple[int, int] = MIMIC_SHAPE):
    def write(index: int) -> bytes:
        return dicom_bytes(radiograph(index, *shape, 0.01), variant, IDENTITY)

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


# --- decoders: the floor candidates and the naive loop's decode ------------------------------


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
    return pyspng.load(data)


def pydicom_pixels(data: bytes) -> np.ndarray:
    return pydicom.dcmread(io.BytesIO(data)).pixel_array


def pydicom_header_numpy_view(data: bytes) -> np.ndarray:
    """Uncompressed pixels: the header parsed, the pixels viewed in place (no copy)."""
    ds = pydicom.dcmread(io.BytesIO(data), defer_size=1 << 16)
    offset = ds.get_item("PixelData", keep_deferred=True).value_tell
    count = int(ds.Rows) * int(ds.Columns)
    return np.frombuffer(data, "<u2", count, offset).reshape(int(ds.Rows), int(ds.Columns))


def pillow_jpeg2000_level(data: bytes) -> np.ndarray:
    """The codestream at the resolution level the stage uses (2 for 3056 x 2544 at 224)."""
    ds = pydicom.dcmread(io.BytesIO(data))
    codestream = next(generate_frames(ds.PixelData, number_of_frames=1))
    with Image.open(io.BytesIO(codestream), formats=["JPEG2000"]) as image:
        image.reduce = 2
        return np.asarray(image)


# --- the naive loop ---------------------------------------------------------------------------


def naive_dicom_pixels(data: bytes) -> np.ndarray:
    """pydicom's own chain: modality LUT, the first VOI (or the 0.5/99.5 percentiles), 8 bits,
    MONOCHROME1 inverted."""
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
    with Image.open(io.BytesIO(data)) as image:
        if image.mode in ("L", "RGB", "RGBA"):
            return np.asarray(image.convert("L"))
        values = np.asarray(image).astype(np.float32)  # 16 bits: the image's own range
    low, high = float(values.min()), float(values.max())
    return np.rint((values - low) * (255 / (high - low))).astype(np.uint8)


# --- formats ---------------------------------------------------------------------------------


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


PNG_DECODERS = {"pyspng": pyspng_load, "opencv": opencv_unchanged, "pillow": pillow_full}
NATIVE_DICOM_DECODERS = {"pydicom": pydicom_pixels}
MONO2_WINDOW = DicomVariant(ExplicitVRLittleEndian, "MONOCHROME2", 12, True, None)

FORMATS = (
    Format(
        "jpeg",
        "baseline JPEG, CheXpert/MIMIC-JPG-like 2320x2828 q90",
        ".jpg",
        24,
        jpeg_source,
        {"pillow full": pillow_full, "pillow reduced DCT": pillow_draft},
        naive_pillow_pixels,
        "PILReader",
    ),
    Format(
        "png8-L",
        "8-bit PNG L, ChestX-Det-like 1024x1024",
        ".png",
        40,
        png_l_source,
        PNG_DECODERS,
        naive_pillow_pixels,
        "PILReader",
    ),
    Format(
        "png8-RGBA",
        "8-bit PNG grey RGBA, ChestX-Det-like 1024x1024",
        ".png",
        40,
        png_rgba_source,
        PNG_DECODERS,
        naive_pillow_pixels,
        "PILReader",
    ),
    Format(
        "png8-rex",
        "8-bit PNG, ReXGradient-like 730x742",
        ".png",
        48,
        png8_rex_source,
        PNG_DECODERS,
        naive_pillow_pixels,
        "PILReader",
    ),
    Format(
        "png16-rex",
        "16-bit PNG (12-bit content), ReXGradient-like 730x742",
        ".png",
        48,
        png16_rex_source,
        PNG_DECODERS,
        naive_pillow_pixels,
        "PILReader",
    ),
    Format(
        "dicom",
        "uncompressed 16-bit DICOM, window, MIMIC-like 3056x2544",
        ".dcm",
        16,
        dicom_source(MONO2_WINDOW),
        NATIVE_DICOM_DECODERS,
        naive_dicom_pixels,
        "PydicomReader",
        pydicom_header_numpy_view,
    ),
    Format(
        "dicom-mono1",
        "uncompressed DICOM MONOCHROME1, no window, 3056x2544",
        ".dcm",
        16,
        dicom_source(DicomVariant(ExplicitVRLittleEndian, "MONOCHROME1", 12, False, (1, 0))),
        NATIVE_DICOM_DECODERS,
        naive_dicom_pixels,
        "PydicomReader",
        pydicom_header_numpy_view,
    ),
    Format(
        "dicom-odd",
        "uncompressed DICOM, window, 3050x2539 (no common factor: partial last blocks)",
        ".dcm",
        12,
        dicom_source(MONO2_WINDOW, (3050, 2539)),
        NATIVE_DICOM_DECODERS,
        naive_dicom_pixels,
        "PydicomReader",
        pydicom_header_numpy_view,
    ),
    Format(
        "dicom-j2k",
        "JPEG 2000 lossless DICOM, window, 3056x2544",
        ".dcm",
        12,
        dicom_source(DicomVariant(JPEG2000Lossless, "MONOCHROME2", 12, True, None)),
        {"pydicom (openjpeg)": pydicom_pixels, "pillow level 2": pillow_jpeg2000_level},
        naive_dicom_pixels,
        "PydicomReader",
    ),
    Format(
        "dicom-jpegll",
        "JPEG Lossless SV1 DICOM, window, 3056x2544",
        ".dcm",
        12,
        jpeg_lossless_source,
        {"pydicom (libjpeg)": pydicom_pixels},
        naive_dicom_pixels,
        "PydicomReader",
    ),
)


def prepare(folder: Path, source_format: Format, count: int) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for index in range(count):
        path = folder / f"{source_format.key}_{index:04d}{source_format.suffix}"
        if not path.is_file():
            temp = temporary_sibling(path)
            temp.write_bytes(source_format.write(index))
            os.replace(temp, path)
        paths.append(path)
    return paths


# --- measurements ----------------------------------------------------------------------------


def sha256_of(content: bytes) -> str:
    return hashlib.sha256(content).hexdigest()


def few_images(count: int) -> int:
    """The size of the baseline run whose cost a run over all `count` images is compared to."""
    # The baseline run holds a few images, so the difference spans most of them: each run's
    # noise is divided by nearly N, not N/2 (the fixed costs are in both runs either way).
    return max(2, count // 16)


@dataclass
class StageCost:
    cpu: float  # seconds per image, marginal, one worker
    wall: dict[int, float]  # workers -> wall seconds per image, marginal
    start: dict[int, float]  # workers -> wall seconds of a run's fixed part (pool, array, table)


def stage_run(sources: Sequence[Path], root: Path, workers: int) -> tuple[float, float]:
    """(wall, CPU) seconds of build_packed_images over `sources` into a fresh `root`."""
    jobs = stage_jobs(sources, root, "bench")
    (root / layout.resized_image_folder("bench")).mkdir(parents=True)
    start, cpu_start = time.perf_counter(), pool_cpu_seconds()
    rows = build_packed_images(
        jobs,
        root / layout.packed_images("bench"),
        SIZE,
        LocalPool(workers),
        time_limit=TimeLimit(job_timeout(os.environ), image_job_stopped, TIMEOUT_VARIABLE),
    )
    table = image_table(rows)
    wall, cpu = time.perf_counter() - start, pool_cpu_seconds() - cpu_start
    failed = table[table["status"] != "ok"]
    if len(failed):
        raise SystemExit(f"images stage: {len(failed)} rows failed: {failed['error'].iloc[0]}")
    return wall, cpu


def stage_cost(sources: Sequence[Path], scratch: Path, repeats: int) -> StageCost:
    """Marginal CPU (1 worker) and wall (1 and 2 workers) per image: the difference between
    a run over every source and one over a few, divided by the images between them. A
    partition of 239k images pays the pool's start once, so the projection must not spread
    it over a benchmark's few dozen images."""
    few = few_images(len(sources))
    runs = 0

    def fresh() -> Path:
        nonlocal runs
        runs += 1
        return scratch / f"stage{runs}"

    best_cpu = {few: math.inf, len(sources): math.inf}
    best_wall: dict[tuple[int, int], float] = {}
    for workers in (1, 2):
        for _ in range(repeats):
            for count in (few, len(sources)):
                wall, cpu = stage_run(sources[:count], fresh(), workers)
                key = (workers, count)
                best_wall[key] = min(best_wall.get(key, math.inf), wall)
                if workers == 1:
                    best_cpu[count] = min(best_cpu[count], cpu)
    added = len(sources) - few
    wall = {
        workers: max(0.0, best_wall[(workers, len(sources))] - best_wall[(workers, few)]) / added
        for workers in (1, 2)
    }
    return StageCost(
        cpu=(best_cpu[len(sources)] - best_cpu[few]) / added,
        wall=wall,
        start={
            workers: max(0.0, best_wall[(workers, few)] - few * wall[workers]) for workers in (1, 2)
        },
    )


def paired_ratios(
    floor_once: Callable[[], float], sources: Sequence[Path], scratch: Path, repeats: int
) -> list[float]:
    """Per repeat: the floor measured once, then the stage's marginal CPU per image (one
    worker) right after it, and their ratio (see the module docstring for why pairs)."""
    few = few_images(len(sources))
    ratios = []
    for repeat in range(repeats):
        floor = floor_once()
        cpu = {
            count: stage_run(sources[:count], scratch / f"pair{repeat}-{count}", 1)[1]
            for count in (few, len(sources))
        }
        ratios.append((cpu[len(sources)] - cpu[few]) / (len(sources) - few) / floor)
    return ratios


def monai_cpu(chain: Callable[[str], object], sources: Sequence[Path]) -> float:
    chain(str(sources[0]))  # warm-up: imports, reader set-up
    start = time.process_time()
    for source in sources:
        chain(str(source))
    return (time.process_time() - start) / len(sources)


def work_alone_cpu(sources: Sequence[Path], folder: Path, repeats: int) -> float:
    """CPU per image of the stage's own per-image calls in sequence, in this process: read,
    SHA-256, decode, resize, fingerprints, PNG, write and rename. No job, pool, reuse check
    or tags: the stage above this is its bookkeeping, this above the floor the work the
    table needs besides decoding."""
    return cpu_per_image(work_alone(folder), sources, repeats)


def work_alone(folder: Path) -> Callable[[Path], np.ndarray]:
    """The per-image calls of work_alone_cpu, its PNGs written into `folder`; each call
    returns the resized pixels."""
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


def naive_cpu(source_format: Format, sources: Sequence[Path], folder: Path) -> float:
    folder.mkdir(parents=True, exist_ok=True)
    start = time.process_time()
    for source in sources:
        content = source.read_bytes()
        sha256_of(content)
        frame = naive_letterbox(source_format.naive_pixels(content))
        Image.fromarray(frame).save(folder / f"{source.stem}.png", format="PNG")
    return (time.process_time() - start) / len(sources)


# --- report ----------------------------------------------------------------------------------


def _over(value: float, stage: float) -> float:
    """value / stage; NaN when the stage's marginal CPU is not positive (a --smoke run's few
    images are within the clock's noise)."""
    return value / stage if stage > 0 else math.nan


def ms(seconds: float) -> str:
    return f"{1000 * seconds:.1f} ms"


@dataclass
class FormatResult:
    source_format: Format
    floor: float
    stage: StageCost
    paired: list[float]  # stage / floor, one per back-to-back pair

    def ratio(self) -> float:
        """The verdict's ratio: the median of the paired ones."""
        return float(np.median(self.paired))


def measure(source_format: Format, sources: Sequence[Path], scratch: Path, repeats: int):
    contents = [source.read_bytes() for source in sources]
    decode = {
        name: cpu_per_image(decoder, contents, repeats)
        for name, decoder in source_format.decoders.items()
    }
    fastest = min(decode, key=decode.get)
    hashing = cpu_per_image(sha256_of, contents, repeats)
    floor = decode[fastest] + hashing
    # Untimed: starts the fork server (once per process, as in a Dagster step), imports.
    stage_run(sources[:2], scratch / f"{source_format.key}-warmup", 1)
    stage = stage_cost(sources, scratch / source_format.key, repeats)

    def floor_once() -> float:
        return cpu_per_image(source_format.decoders[fastest], contents, 1) + cpu_per_image(
            sha256_of, contents, 1
        )

    result = FormatResult(
        source_format,
        floor,
        stage,
        paired_ratios(floor_once, sources, scratch / f"{source_format.key}-pairs", repeats),
    )
    work = work_alone_cpu(sources, scratch / f"{source_format.key}-work", repeats)
    naive = naive_cpu(source_format, sources[: max(4, len(sources) // 4)], scratch / "naive")
    chain = monai_chain(source_format.monai_reader)
    monai = monai_cpu(chain, sources[: max(3, len(sources) // 8)]) if chain else None
    ratio = result.ratio()
    pairs = f"{min(result.paired):.2f}-{max(result.paired):.2f}x"
    if source_format.bare_read is not None:
        bare = cpu_per_image(source_format.bare_read, contents, repeats) + hashing
        bare_text = f" | bare floor {ms(bare)}: {stage.cpu / bare:.2f}x"
    else:
        bare_text = ""
    megabytes = np.mean([len(content) for content in contents]) / 1e6
    others = ", ".join(f"{name} {ms(value)}" for name, value in decode.items())
    monai_text = (
        f"MONAI {ms(monai)}: {_over(monai, stage.cpu):.2f}x" if monai else "MONAI: not installed"
    )
    print(
        f"{source_format.key:13s} floor {ms(floor)} ({fastest} + SHA-256 {ms(hashing)}) | "
        f"stage {ms(stage.cpu)} | ratio {ratio:.2f}x "
        f"{'PASS' if ratio <= TARGET_RATIO else 'FAIL'} (median of {len(result.paired)} "
        f"back-to-back pairs, {pairs}; best stage / best floor {stage.cpu / floor:.2f}x)"
        f"{bare_text} | work alone {ms(work)}: "
        f"{work / floor:.2f}x floor | naive {ms(naive)}: "
        f"{_over(naive, stage.cpu):.2f}x | {monai_text}",
        flush=True,
    )
    print(
        f"{'':13s} {source_format.description}; {len(sources)} files, {megabytes:.2f} MB mean; "
        f"decoders: {others}; stage wall per added image: 1 worker {ms(stage.wall[1])}, "
        f"2 workers {ms(stage.wall[2])} (a run's fixed part: {ms(stage.start[1])}, "
        f"{ms(stage.start[2])})",
        flush=True,
    )
    if source_format.key in MASK_HEADER_READERS:
        print(masks_line(source_format.key, sources, repeats), flush=True)
    return result


def masks_line(key: str, sources: Sequence[Path], repeats: int) -> str:
    """The `masks` stage's read of each image (its header size) against opening the file
    and reading its first block, and against decoding the pixels (what ChestX-Det's masks
    did before they read the header only)."""
    header = cpu_per_image(header_image_size, sources, repeats)
    first_block = cpu_per_image(read_first_block, sources, repeats)
    decode = cpu_per_image(decode_grayscale, sources, 1)
    return (
        f"{'':13s} masks ({MASK_HEADER_READERS[key]}): header size {1000 * header:.2f} ms | "
        f"open + {HEADER_BLOCK // 1024} KiB read {1000 * first_block:.2f} ms, ratio "
        f"{header / first_block:.1f}x | a full decode instead {ms(decode)}"
    )


def read_first_block(path: Path) -> bytes:
    with open(path, "rb") as handle:
        return handle.read(HEADER_BLOCK)


def documented_images(dataset: str) -> int:
    """The dataset's documented image count: its total, else the sum over its splits."""
    counts = SOURCE_TYPES[dataset].documented_counts
    by_split = sum(split.get("images", 0) for split in counts.splits.values())
    return counts.total.get("images", by_split)


def corpus_projection(results: dict[str, FormatResult]) -> list[str]:
    """The ten partitions at documented counts; ReXGradient's bit depth is undocumented, so
    both PNG depths; MS-CXR over a MIMIC DICOM tree."""
    chestx_rgba = sum(
        split.get("rgba_images", 0)
        for split in SOURCE_TYPES["chestx_det"].documented_counts.splits.values()
    )
    lines = []
    for rex_format in ("png8-rex", "png16-rex"):
        mix = {
            rex_format: documented_images("rexgradient"),
            "png8-L": documented_images("chestx_det") - chestx_rgba,
            "png8-RGBA": chestx_rgba,
            "jpeg": documented_images("chexlocalize"),
            "dicom": documented_images("ms_cxr"),
        }
        if any(key not in results for key in mix):
            continue
        total = sum(mix.values())
        cpu = sum(count * results[key].stage.cpu for key, count in mix.items())
        # Per image at the marginal rate, plus each partition's fixed part once
        # (charged at the slowest format's, as a partition's format is not known here).
        per_worker = {
            workers: sum(count * results[key].stage.wall[workers] for key, count in mix.items())
            + PARTITIONS * max(results[key].stage.start[workers] for key in mix)
            for workers in (1, 2)
        }
        rate_1, rate_2 = total / per_worker[1], total / per_worker[2]
        added = rate_2 - rate_1
        scaling = (
            f"each added worker adds {added:.1f} images/s to {rate_2:.1f} (4 workers: "
            f"{total / (rate_2 + 2 * added) / 60:.1f} min, 8: "
            f"{total / (rate_2 + 6 * added) / 60:.1f} min, if the rate keeps growing so)"
            if added > 0
            else "the second worker added nothing measurable (a busy machine): no per-worker "
            "projection"
        )
        lines.append(
            f"corpus ({total:,} images, ReXGradient as {rex_format}): stage CPU "
            f"{cpu / 60:.1f} min (2 cores fully used: {cpu / 120:.1f} min); wall with 1 worker "
            f"{per_worker[1] / 60:.1f} min, 2 workers {per_worker[2] / 60:.1f} min (target < "
            f"{CORPUS_TARGET_MINUTES} min on 2 cores: "
            f"{'PASS' if per_worker[2] / 60 < CORPUS_TARGET_MINUTES else 'FAIL'}); {scaling}"
        )
    return lines


def run_formats(keep: Path | None, repeats: int, scale: float, only: str) -> None:
    """Measure every chosen format, print its lines, the corpus projection and the verdict."""
    chosen = [f for f in FORMATS if not only or f.key in only.split(",")]
    print(f"start: {load_line()}", flush=True)
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench_formats_") as scratch_name:
        scratch = Path(scratch_name)
        for source_format in chosen:
            count = max(4, round(source_format.images * scale) // 2 * 2)
            folder = (keep or scratch / "sources") / source_format.key
            sources = prepare(folder, source_format, count)
            results[source_format.key] = measure(source_format, sources, scratch, repeats)
    for line in corpus_projection(results):
        print(line, flush=True)
    print(f"end: {load_line()}", flush=True)
    verdicts = [result.ratio() <= TARGET_RATIO for result in results.values()]
    print(f"formats within {TARGET_RATIO}x of their floor: {sum(verdicts)} of {len(verdicts)}")
