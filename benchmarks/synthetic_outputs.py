"""What the stages leave on the output root, written directly for the benchmarks that read it:
an `images` partition (table, tagged PNGs, union masks, packed array) for verify, and
resized radiographs with their masks as the exports read them."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from radharmony_pipeline.synthetic.radiograph import render_radiograph, to_uint8

if TYPE_CHECKING:
    from radharmony_pipeline.processing.corpus.exports import ExportSample

# --- an `images` partition, as verify reads it --------------------------------------------

TEMPLATES = 16
NOISE_LEVELS = 3.0  # grey levels of per-image noise: every PNG differs, compresses alike
MASK_EVERY = 10
EXPORT_CLASS = "nodule"


def write_images_partition(root: Path, partition: str, images: int, size: int) -> None:
    """The partition's `images` table, one radiograph PNG per image (the stage's own writer,
    its pixel digest tagged), a union mask for one in MASK_EVERY and the packed array, at
    the paths output_layout gives; 16 rendered radiographs plus per-image noise. Nothing is
    written when the table is there already."""
    import pandas as pd

    from radharmony_pipeline.processing.imaging.perceptual_hash import pixels_sha256
    from radharmony_pipeline.processing.imaging.tagged_png import mask_png, write_tagged_png
    from radharmony_pipeline.processing.storage import output_layout as layout
    from radharmony_pipeline.processing.storage.integrity import PIXEL_DIGEST
    from radharmony_pipeline.vocabulary import STATUS_OK

    table_path = layout.table_file(root, "images", partition)
    if table_path.exists():
        return
    rng = np.random.default_rng(0)
    templates = [to_uint8(render_radiograph(rng, size, size).pixels) for _ in range(TEMPLATES)]
    packed = root / layout.packed_images(partition)
    packed.parent.mkdir(parents=True, exist_ok=True)
    array = np.lib.format.open_memmap(packed, mode="w+", dtype=np.uint8, shape=(images, size, size))
    records = []
    mask = mask_png((templates[0] > 127).astype(np.uint8) * 255)
    for row in range(images):
        noise = rng.normal(0.0, NOISE_LEVELS, (size, size))
        pixels = np.clip(templates[row % TEMPLATES] + noise, 0, 255).astype(np.uint8)
        array[row] = pixels
        key = f"img{row:07d}"
        image_path = layout.resized_image(partition, key)
        mask_path = layout.resized_union_mask(partition, key) if row % MASK_EVERY == 0 else None
        digest = pixels_sha256(pixels)
        write_tagged_png(root / image_path, lambda p=pixels: p, key, {PIXEL_DIGEST: digest})
        if mask_path is not None:
            (root / mask_path).parent.mkdir(parents=True, exist_ok=True)
            (root / mask_path).write_bytes(mask)
        records.append(
            {
                "image_id": key,
                "image_path": image_path,
                "mask_path": mask_path,
                PIXEL_DIGEST: digest,
                "tensor_index": row,
                "status": STATUS_OK,
            }
        )
    array.flush()
    del array
    table_path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(records).to_parquet(table_path)


# --- resized radiographs with their masks, as the exports read them --------------------------


def export_samples(
    root: Path, partition: str, count: int, size: int, rng: np.random.Generator
) -> list[ExportSample]:
    """`count` resized radiograph PNGs (written as `images` writes them; a 1024² render with
    noise and a random width each), a union mask and one native-resolution class mask for
    every other one; the ExportSample of each, as the exports assets build them."""
    from radharmony_pipeline.processing.annotations.masks import write_mask_png
    from radharmony_pipeline.processing.corpus.exports import RECORD_COLUMNS, ExportSample
    from radharmony_pipeline.processing.imaging.geometry import (
        letterbox_geometry,
        resize_image,
        resize_mask,
    )
    from radharmony_pipeline.processing.imaging.tagged_png import radiograph_png
    from radharmony_pipeline.processing.storage import output_layout as layout
    from radharmony_pipeline.vocabulary import LABEL_COLUMNS

    (root / layout.resized_image_folder(partition)).mkdir(parents=True)
    samples = []
    template = render_radiograph(rng, 1024, 1024).pixels
    lists = ("bboxes", "bboxes_resized", "bbox_labels", "label_text")
    for number in range(count):
        height, width = 1024, int(rng.integers(800, 1024))
        geometry = letterbox_geometry(height, width, size)
        noisy = template[:height, :width] + rng.normal(0, 0.02, (height, width))
        pixels = resize_image(to_uint8(np.clip(noisy, 0, 1)), geometry)
        key = f"bench__{number:06d}"
        image = root / layout.resized_image(partition, key)
        image.parent.mkdir(exist_ok=True)
        image.write_bytes(radiograph_png(pixels))
        mask, class_masks = None, {}
        if number % 2 == 0:
            native = np.zeros((height, width), dtype=np.uint8)
            top, left = rng.integers(100, 600, 2)
            native[top : top + 200, left : left + 150] = 1
            class_masks[EXPORT_CLASS] = (
                root / layout.image_mask_folder(partition, key) / f"{EXPORT_CLASS}.png"
            )
            class_masks[EXPORT_CLASS].parent.mkdir(parents=True)
            write_mask_png(class_masks[EXPORT_CLASS], native, "bench")
            mask = root / layout.resized_union_mask(partition, key)
            write_mask_png(mask, resize_mask(native, geometry), "bench")
        record = {
            "image_id": f"bench/{number:06d}",
            "dataset": "bench",
            "split": "train",
            "image_path": image.relative_to(root).as_posix(),
            "has_mask": mask is not None,
            "mask_classes": [EXPORT_CLASS] if mask is not None else [],
            **{column: None for column in LABEL_COLUMNS},
        }
        complete = {c: record.get(c, [] if c in lists else None) for c in RECORD_COLUMNS}
        samples.append(
            ExportSample(key, complete, image, mask, class_masks, geometry, (str(number),))
        )
    return samples
