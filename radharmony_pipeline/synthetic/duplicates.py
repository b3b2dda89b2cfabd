"""Known duplicates planted into generated datasets, and the truth file that lists them.

A plant overwrites one generated image (the target) with a copy of another (the source),
transformed the way real duplicates differ: re-encoded at another JPEG quality, resized,
shifted by a few pixels, brightness-scaled, or a DICOM stored again as PNG. Targets keep
their file name, format and, where the metadata pins it (ChestX-Det's 1024×1024), their size,
so every documented count still holds.
"""

from __future__ import annotations

import io
import json
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import cv2
import numpy as np
from PIL import Image

from radharmony_pipeline.processing.imaging.decode import decode_grayscale
from radharmony_pipeline.settings import DATA_ROOT_VARIABLE
from radharmony_pipeline.sources import SourceLocation, open_source
from radharmony_pipeline.synthetic.encoding import jpeg_bytes, png_bytes
from radharmony_pipeline.synthetic.expected import EXPECTED_COUNTS_NAME
from radharmony_pipeline.synthetic.files import write_bytes, write_text

TRUTH_NAME = "duplicates_truth.json"
TRANSFORMS = ("copy", "jpeg_quality", "resized", "shifted", "brightness", "as_png")
SHIFT_PIXELS = 2
JPEG_QUALITY = 40
RESIZE_FACTOR = 0.75
BRIGHTNESS = 1.15


@dataclass(frozen=True)
class PlantedDuplicate:
    """Image `source_index` of a partition copied over image `target_index` of another.

    Indexes count the partition's images in `image_id` order. `source_format="dcm"` picks
    the partition's DICOM files only (MIMIC-CXR trees are mixed).
    """

    source: str
    source_index: int
    target: str
    target_index: int
    transform: str
    source_format: str | None = None


# Shown by the demo: a broken-download copy, near copies inside and across splits and
# datasets, one DICOM stored again as PNG. None is identical across train and test.
DEMO_DUPLICATES: tuple[PlantedDuplicate, ...] = (
    PlantedDuplicate("chestx_det.train", 0, "chestx_det.train", 1, "copy"),
    PlantedDuplicate("chestx_det.train", 2, "chestx_det.test", 0, "shifted"),
    PlantedDuplicate("chestx_det.test", 1, "chestx_det.test", 2, "jpeg_quality"),
    PlantedDuplicate("ms_cxr.train", 0, "rexgradient.train", 0, "as_png", source_format="dcm"),
    PlantedDuplicate("chexlocalize.val", 0, "rexgradient.val", 0, "resized"),
    PlantedDuplicate("rexgradient.train", 1, "rexgradient.test", 0, "brightness"),
)
# The demo's plants plus an evaluation leak: the same file in ChestX-Det train and test.
LEAK = PlantedDuplicate("chestx_det.train", 3, "chestx_det.test", 3, "copy")


def plant_duplicates(out: Path, plants: Sequence[PlantedDuplicate]) -> Path:
    """Apply `plants` to the datasets under `out`; write and return `out/duplicates_truth.json`."""
    out = Path(out)
    environ = {DATA_ROOT_VARIABLE: str(out)}
    located = _Locator(environ)
    truth = []
    for plant in plants:
        if plant.transform not in TRANSFORMS:
            raise ValueError(f"unknown transform {plant.transform!r}; one of {TRANSFORMS}")
        source_id, source_file = located.image(
            plant.source, plant.source_index, plant.source_format
        )
        target_id, target_file = located.image(plant.target, plant.target_index, None)
        if source_file == target_file:
            raise ValueError(f"plant {plant} copies {source_file} onto itself")
        _write_transformed(source_file, target_file, plant.transform)
        truth.append({**asdict(plant), "source_id": source_id, "target_id": target_id})
    _recount_rgba_images(out / "chestx-det")
    path = out / TRUTH_NAME
    write_text(path, json.dumps(truth, indent=2) + "\n")
    return path


def _recount_rgba_images(root: Path) -> None:
    """A plant may overwrite an RGBA ChestX-Det PNG with a grayscale one (or the reverse):
    `expected_counts.json` must keep stating what the root really holds."""
    counts_file = root / EXPECTED_COUNTS_NAME
    if not counts_file.is_file():
        return
    document = json.loads(counts_file.read_text())
    total = 0
    for split, counts in document["splits"].items():
        if "rgba_images" not in counts:
            continue
        counts["rgba_images"] = sum(_is_rgba(path) for path in (root / split).glob("*.png"))
        total += counts["rgba_images"]
    if "rgba_images" in document["total"]:
        document["total"]["rgba_images"] = total
    write_text(counts_file, json.dumps(document, indent=2) + "\n")


def _is_rgba(path: Path) -> bool:
    with Image.open(path) as image:
        return image.mode == "RGBA"


def read_truth(out: Path) -> list[dict]:
    """The planted pairs written by `plant_duplicates`."""
    return json.loads((Path(out) / TRUTH_NAME).read_text())


class _Locator:
    """Image ids and files of generated partitions, read with the project's own readers."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        self.environ = environ
        self.cache: dict[str, list[tuple[str, Path]]] = {}

    def image(self, partition: str, index: int, image_format: str | None) -> tuple[str, Path]:
        images = self._images(partition)
        if image_format is not None:
            images = [(i, f) for i, f in images if f.suffix == f".{image_format}"] or images
        if not 0 <= index < len(images):
            raise ValueError(f"{partition} has {len(images)} images; no image {index}")
        return images[index]

    def _images(self, partition: str) -> list[tuple[str, Path]]:
        if partition not in self.cache:
            dataset, _, split = partition.partition(".")
            source = open_source(dataset, SourceLocation(), self.environ)
            index = source.read_split(split).index.sort_values("image_id")
            folder = source.image_dir(split)
            self.cache[partition] = [
                (str(i), folder / str(p))
                for i, p in zip(index["image_id"], index["image_path"], strict=True)
            ]
        return self.cache[partition]


def _write_transformed(source: Path, target: Path, transform: str) -> None:
    if transform == "copy":
        if source.suffix != target.suffix:
            raise ValueError(f"a byte copy needs one format: {source.name} → {target.name}")
        shutil.copyfile(source, target)
        return
    pixels = decode_grayscale(source, target_size=1 << 14).pixels
    if transform == "jpeg_quality":
        pixels = _jpeg_round_trip(pixels, JPEG_QUALITY)
    elif transform == "resized":
        height, width = pixels.shape
        size = (round(width * RESIZE_FACTOR), round(height * RESIZE_FACTOR))
        pixels = cv2.resize(pixels, size, interpolation=cv2.INTER_AREA)
    elif transform == "shifted":
        matrix = np.float32([[1, 0, SHIFT_PIXELS], [0, 1, -SHIFT_PIXELS]])
        pixels = cv2.warpAffine(
            pixels, matrix, (pixels.shape[1], pixels.shape[0]), borderMode=cv2.BORDER_REPLICATE
        )
    elif transform == "brightness":
        pixels = np.clip(pixels.astype(np.float32) * BRIGHTNESS, 0, 255).astype(np.uint8)
    encoded = jpeg_bytes(pixels) if target.suffix == ".jpg" else png_bytes(pixels)
    write_bytes(target, encoded)


def _jpeg_round_trip(pixels: np.ndarray, quality: int) -> np.ndarray:
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="JPEG", quality=quality)
    with Image.open(io.BytesIO(buffer.getvalue())) as image:
        return np.asarray(image.convert("L"))
