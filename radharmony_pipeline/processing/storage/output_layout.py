"""Where every output lives under the output root: the one place that names its folders.

Functions returning a `str` give a path relative to the output root (as the tables record
it); functions taking `root` give the path itself (a local Path or a UPath on a store).
"""

from __future__ import annotations

from typing import Any

TABLES = "tables"
IMAGES = "images"
MASKS = "masks"
PREVIEWS = "previews"
OBSERVATIONS = "observations"
EXPORTS = "exports"

# Every resized PNG (image and union mask) of every partition, as a glob under the root.
RESIZED_PNG_GLOB = f"{IMAGES}/*/*.png"
NEAR_DUPLICATE_SHEET = f"{PREVIEWS}/near_duplicates/examples.png"
HUGGINGFACE_EXPORT = f"{EXPORTS}/huggingface"
WEBDATASET_EXPORT = f"{EXPORTS}/webdataset"


def tables_folder(root: Any) -> Any:
    """The folder the Parquet IO manager writes every table under."""
    return root / TABLES


def table_path(table: str, partition: str | None = None) -> str:
    """`tables/<table>.parquet`, or `tables/<table>/<partition>.parquet` for a partition
    (where the Parquet IO manager keeps them under `tables_folder`)."""
    if partition is None:
        return f"{TABLES}/{table}.parquet"
    return f"{TABLES}/{table}/{partition}.parquet"


def table_file(root: Any, table: str, partition: str | None = None) -> Any:
    return root / table_path(table, partition)


def root_of_table_file(path: Any) -> Any:
    """The output root a whole table's file (`tables/<table>.parquet`) lies under."""
    return path.parent.parent


MANIFEST = table_path("unified_manifest")


def resized_image_folder(partition: str) -> str:
    """The partition's resized PNGs (images and their union masks)."""
    return f"{IMAGES}/{partition}"


def resized_image(partition: str, image_key: str) -> str:
    return f"{resized_image_folder(partition)}/{image_key}.png"


def resized_union_mask(partition: str, image_key: str) -> str:
    return f"{resized_image_folder(partition)}/{image_key}.mask.png"


def packed_images(partition: str) -> str:
    """The partition's packed N×S×S uint8 array (`tensor_path` in the manifest)."""
    return f"{IMAGES}/{partition}.npy"


def packed_keys(packed: Any) -> Any:
    """The input keys recorded beside a packed array, one per row."""
    return packed.with_name(packed.name + ".keys.json")


def mask_folder(partition: str) -> str:
    """The partition's native-resolution masks, one folder per image."""
    return f"{MASKS}/{partition}"


def image_mask_folder(partition: str, image_key: str) -> str:
    """One image's masks: `<class>.png` per class and `any.png`, their union."""
    return f"{mask_folder(partition)}/{image_key}"


def source_snapshot(partition: str) -> str:
    """The partition's last observation of its source files (what changed since)."""
    return f"{OBSERVATIONS}/source_files/{partition}.json.gz"


def preview(kind: str, name: str) -> str:
    """A picture for the UI: `previews/<kind>/<name>.png` (masks, bboxes, profile)."""
    return f"{PREVIEWS}/{kind}/{name}.png"
