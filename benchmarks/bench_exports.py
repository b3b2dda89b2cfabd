"""Benchmark: export throughput per format against reading the same PNGs back.

Writes N resized 224×224 radiograph PNGs (synthetic content, written the way `images` writes
them), a union mask PNG for half of them and one native-resolution class mask each for those,
then measures in the same run, on the same files (page cache warm for all):

- the floor: reading every image and mask PNG's bytes (bare read), and reading plus decoding
  them (Pillow, to numpy);
- each export (`export_partition` as the assets call it, fresh folder each time): Hugging
  Face Parquet (PNG bytes embedded, class masks resized and encoded) and WebDataset tar.

Target: each export within 1.5× of the read-and-decode time of the same PNGs. Times are
wall-clock, best of `--repeat` passes; the load average is printed at the start and the end.

    .venv/bin/python benchmarks/bench_exports.py [--images 2000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
from common import add_smoke
from PIL import Image

from radharmony_pipeline.processing.annotations.masks import write_mask_png
from radharmony_pipeline.processing.corpus.exports import (
    WEBDATASET,
    ExportSample,
    export_partition,
    huggingface_format,
    huggingface_shards,
    webdataset_shards,
)
from radharmony_pipeline.processing.imaging.geometry import (
    letterbox_geometry,
    resize_image,
    resize_mask,
)
from radharmony_pipeline.processing.imaging.tagged_png import (
    radiograph_png,
)
from radharmony_pipeline.processing.storage import output_layout as layout
from radharmony_pipeline.synthetic.radiograph import render_radiograph, to_uint8
from radharmony_pipeline.vocabulary import LABEL_COLUMNS

SIZE = 224
TARGET = 1.5
CLASS = "nodule"
PARTITION = "bench.train"


def write_inputs(root: Path, count: int, rng: np.random.Generator) -> list[ExportSample]:
    (root / layout.resized_image_folder(PARTITION)).mkdir(parents=True)
    samples = []
    template = render_radiograph(rng, 1024, 1024).pixels
    for number in range(count):
        height, width = 1024, int(rng.integers(800, 1024))
        geometry = letterbox_geometry(height, width, SIZE)
        noisy = template[:height, :width] + rng.normal(0, 0.02, (height, width))
        pixels = resize_image(to_uint8(np.clip(noisy, 0, 1)), geometry)
        key = f"bench__{number:06d}"
        image = root / layout.resized_image(PARTITION, key)
        image.parent.mkdir(exist_ok=True)
        image.write_bytes(radiograph_png(pixels))
        mask, class_masks = None, {}
        if number % 2 == 0:
            native = np.zeros((height, width), dtype=np.uint8)
            top, left = rng.integers(100, 600, 2)
            native[top : top + 200, left : left + 150] = 1
            class_masks[CLASS] = root / layout.image_mask_folder(PARTITION, key) / f"{CLASS}.png"
            class_masks[CLASS].parent.mkdir(parents=True)
            write_mask_png(class_masks[CLASS], native, "bench")
            mask = root / layout.resized_union_mask(PARTITION, key)
            write_mask_png(mask, resize_mask(native, geometry), "bench")
        record = {
            "image_id": f"bench/{number:06d}",
            "dataset": "bench",
            "split": "train",
            "image_path": image.relative_to(root).as_posix(),
            "has_mask": mask is not None,
            "mask_classes": [CLASS] if mask is not None else [],
            **{column: None for column in LABEL_COLUMNS},
        }
        samples.append(
            ExportSample(
                key=key,
                record=_complete(record),
                image=image,
                mask=mask,
                class_masks=class_masks,
                geometry=geometry,
                provenance=(str(number),),
            )
        )
    return samples


def _complete(record: dict) -> dict:
    from radharmony_pipeline.processing.corpus.exports import RECORD_COLUMNS

    lists = ("bboxes", "bboxes_resized", "bbox_labels", "label_text")
    return {c: record.get(c, [] if c in lists else None) for c in RECORD_COLUMNS}


def pngs_of(samples: list[ExportSample]) -> list[Path]:
    files = [sample.image for sample in samples]
    files += [sample.mask for sample in samples if sample.mask is not None]
    return files


def read_bytes(files: list[Path]) -> int:
    return sum(len(path.read_bytes()) for path in files)


def read_and_decode(files: list[Path]) -> int:
    total = 0
    for path in files:
        with Image.open(io.BytesIO(path.read_bytes())) as image:
            total += np.asarray(image).size
    return total


def best_of(repeat: int, run) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    add_smoke(parser)
    args = parser.parse_args()
    if args.smoke:
        args.images, args.repeat = 24, 1
    workers = os.cpu_count() or 1
    print(f"load average at start: {os.getloadavg()}; export threads: {workers}")
    with tempfile.TemporaryDirectory(prefix="bench-exports-") as scratch:
        root = Path(scratch)
        samples = write_inputs(root, args.images, np.random.default_rng(args.seed))
        files = pngs_of(samples)
        megabytes = sum(path.stat().st_size for path in files) / 2**20
        print(f"{len(samples)} samples, {len(files)} PNGs, {megabytes:.1f} MiB")
        read = best_of(args.repeat, lambda: read_bytes(files))
        decode = best_of(args.repeat, lambda: read_and_decode(files))
        for name, seconds in (("bare read", read), ("read + decode", decode)):
            label = f"{name} of the PNGs:"
            print(f"{label:28s} {seconds:7.3f} s ({len(samples) / seconds:8.0f} samples/s)")
        formats = {
            "huggingface": (
                huggingface_format((CLASS,)),
                huggingface_shards("train"),
                "i.json",
                layout.HUGGINGFACE_EXPORT,
            ),
            "webdataset": (
                WEBDATASET,
                webdataset_shards(PARTITION),
                "index.json",
                layout.WEBDATASET_EXPORT,
            ),
        }
        verdicts = []
        for name, (export, names, index, export_folder) in formats.items():
            folder = root / export_folder

            def run(export=export, names=names, index=index, folder=folder) -> None:
                shutil.rmtree(folder, ignore_errors=True)
                export_partition(samples, export, folder, names, index, 256 * 2**20, {}, workers)

            seconds = best_of(args.repeat, run)
            size = sum(p.stat().st_size for p in folder.iterdir()) / 2**20
            ratio = seconds / decode
            verdicts.append((name, ratio))
            print(
                f"{name} export:{' ' * (17 - len(name))}{seconds:7.3f} s "
                f"({len(samples) / seconds:8.0f} samples/s, {size:.1f} MiB): "
                f"{ratio:.2f}x read + decode, {seconds / read:.2f}x bare read"
            )
    print(f"load average at end: {os.getloadavg()}")
    for name, ratio in verdicts:
        met = "met" if ratio <= TARGET else "NOT met"
        print(f"target {name} export <= {TARGET}x read + decode: {met} ({ratio:.2f}x)")


if __name__ == "__main__":
    main()
