"""Contact sheets (a partition's masks and boxes, near-duplicate groups), written beside the
tables and linked in materialization metadata so they open from the Dagster UI."""

import base64
from pathlib import Path

import dagster as dg
import numpy as np
import pandas as pd
from PIL import Image

from ..processing.annotations.boxes import NORMALIZED_COLUMNS
from ..processing.annotations.masks import read_mask_png
from ..processing.corpus.previews import (
    PreviewSample,
    choose_samples,
    contact_sheet,
    mask_at_shape,
    save_png,
    small_jpeg,
)
from ..processing.imaging.decode import decode_grayscale
from ..processing.imaging.image_files import confined
from ..processing.storage.output_layout import preview
from ..sources.base import DatasetSource
from ..vocabulary import STATUS_OK, UNION_CLASS

SAMPLES = 16
# Images are decoded for a tile of a few hundred pixels: JPEGs at a reduced DCT scale.
PREVIEW_SIDE = 512
INLINE_WIDTH = 640
# The metadata entries a sheet adds to its stage's materialization: the file and the image.
SHEET_METADATA = ("preview", "preview_inline")


def mask_preview(
    source: DatasetSource,
    split: str,
    index: pd.DataFrame,
    table: pd.DataFrame,
    root: Path,
    partition: str,
) -> dict:
    """Sheet of ~16 images with their class masks blended in (the union is not drawn)."""
    ok = table[(table["status"] == STATUS_OK) & table["mask_path"].notna()]
    classes = ok[ok["mask_class"] != UNION_CLASS]
    masks_by_image = classes.groupby("image_id")["mask_path"].apply(list).to_dict()
    class_by_path = dict(zip(classes["mask_path"], classes["mask_class"], strict=True))

    def masks_of(image_id: str, shape: tuple[int, int]) -> dict[str, np.ndarray]:
        return {
            class_by_path[path]: mask_at_shape(read_mask_png(root / path), shape)
            for path in masks_by_image.get(image_id, [])
        }

    return _write_sheet(
        source,
        split,
        index,
        root,
        preview("masks", partition),
        prefer=index["image_id"].isin(masks_by_image),
        masks_of=masks_of,
        boxes_of=lambda image_id: [],
    )


def box_preview(
    source: DatasetSource,
    split: str,
    index: pd.DataFrame,
    table: pd.DataFrame,
    root: Path,
    partition: str,
) -> dict:
    """Sheet of ~16 images with their boxes and labels drawn."""
    ok = table[table["status"] == STATUS_OK]
    boxes = {
        image_id: list(group[[*NORMALIZED_COLUMNS, "label"]].itertuples(index=False, name=None))
        for image_id, group in ok.groupby("image_id")
    }
    return _write_sheet(
        source,
        split,
        index,
        root,
        preview("bboxes", partition),
        prefer=index["image_id"].isin(boxes),
        masks_of=lambda image_id, shape: {},
        boxes_of=lambda image_id: boxes.get(image_id, []),
    )


def _write_sheet(source, split, index, root, relative, prefer, masks_of, boxes_of) -> dict:
    positions = choose_samples(index["image_id"].tolist(), SAMPLES, prefer.tolist())
    samples = []
    for position in positions:
        row = index.iloc[position]
        if pd.isna(row["image_path"]):
            continue  # an error row of raw_index: nothing to show
        base = source.image_dir(split)
        try:
            # Confined like every reader: a symlink leaving the image folder is never opened.
            image_file = confined(base / row["image_path"], base)
            pixels = decode_grayscale(image_file, target_size=PREVIEW_SIDE).pixels
        except (OSError, ValueError):
            continue  # the images stage reports unreadable files; a preview just skips them
        samples.append(
            PreviewSample(
                title=row["image_id"],
                image=pixels,
                masks=masks_of(row["image_id"], pixels.shape),
                boxes=boxes_of(row["image_id"]),
            )
        )
    if not samples:
        return {}
    sheet = contact_sheet(samples)
    save_png(sheet, root / relative)
    file_entry, inline_entry = SHEET_METADATA
    return {
        file_entry: dg.MetadataValue.path(str(root / relative)),
        inline_entry: dg.MetadataValue.md(inline_sheet(sheet)),
    }


def inline_sheet(sheet: Image.Image) -> str:
    """A small JPEG of the sheet inside the metadata, so the UI shows it without file access."""
    encoded = base64.b64encode(small_jpeg(sheet, INLINE_WIDTH)).decode()
    return f"![contact sheet](data:image/jpeg;base64,{encoded})"
