"""Where every output lives under the output root: the one place that names its folders.

Functions returning a `str` give a path relative to the output root (as the tables record
it); functions taking `root` give the path itself (a local Path or a UPath on a store).
"""

from __future__ import annotations

import hashlib
from typing import Any

TABLES = "tables"
IMAGES = "images"
MASKS = "masks"
PREVIEWS = "previews"
OBSERVATIONS = "observations"
EXPORTS = "exports"
LAYOUT_MIGRATIONS = f"{OBSERVATIONS}/layout_migration"

# Per-image outputs are spread over 16**SHARD_DIGITS shard folders per partition, named by the
# first hex digits of the SHA-1 of the image_key (as git spreads its objects), so that no folder
# holds more than about 10,000 entries at the corpus's sizes (docs/contracts-and-layout.md).
# A shard name never equals an image_key: every key holds `__` (`<dataset>__<native id>`).
SHARD_DIGITS = 2
SHARD_COUNT = 16**SHARD_DIGITS
# The resized image's file and its union mask's, after the image_key.
RESIZED_IMAGE_SUFFIX = ".png"
UNION_MASK_SUFFIX = ".mask.png"
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


def image_shard(image_key: str) -> str:
    """The shard folder of an image's outputs: the first SHARD_DIGITS hex digits of the SHA-1
    of its key (stable across runs, machines and Python versions)."""
    return hashlib.sha1(image_key.encode()).hexdigest()[:SHARD_DIGITS]


def is_shard_name(name: str) -> bool:
    """Whether a folder name is one image_shard gives (never an image_key)."""
    return len(name) == SHARD_DIGITS and all(c in "0123456789abcdef" for c in name)


def resized_image_folder(partition: str) -> str:
    """The partition's resized PNGs (images and their union masks), in shard folders."""
    return f"{IMAGES}/{partition}"


def resized_image(partition: str, image_key: str) -> str:
    """`images/<partition>/<shard>/<image_key>.png`."""
    return f"{_resized_shard(partition, image_key)}/{image_key}{RESIZED_IMAGE_SUFFIX}"


def resized_union_mask(partition: str, image_key: str) -> str:
    """`images/<partition>/<shard>/<image_key>.mask.png`, beside its image."""
    return f"{_resized_shard(partition, image_key)}/{image_key}{UNION_MASK_SUFFIX}"


def _resized_shard(partition: str, image_key: str) -> str:
    return f"{resized_image_folder(partition)}/{image_shard(image_key)}"


def resized_png_glob(partition: str = "*") -> str:
    """Every resized PNG (images and union masks) of a partition, by default of every
    partition, as a glob relative to the root (Croissant's file set, listings in tests)."""
    return f"{resized_image_folder(partition)}/*/*{RESIZED_IMAGE_SUFFIX}"


def packed_images(partition: str) -> str:
    """The partition's packed N×S×S uint8 array (`tensor_path` in the manifest)."""
    return f"{IMAGES}/{partition}.npy"


def packed_keys(packed: Any) -> Any:
    """The input keys recorded beside a packed array, one per row."""
    return packed.with_name(packed.name + ".keys.json")


# After a packed array's name: what each of its rows took from its PNGs' headers.
PACKED_HEADERS_SUFFIX = ".headers.parquet"


def packed_headers(packed: Any) -> Any:
    """What each row of a packed array took from its PNGs' headers, with the files' states."""
    return packed.with_name(packed.name + PACKED_HEADERS_SUFFIX)


def mask_folder(partition: str) -> str:
    """The partition's native-resolution masks, one folder per image in shard folders."""
    return f"{MASKS}/{partition}"


def image_mask_folder(partition: str, image_key: str) -> str:
    """One image's masks, `masks/<partition>/<shard>/<image_key>/`: `<class>.png` per class
    and `any.png`, their union."""
    return f"{mask_folder(partition)}/{image_shard(image_key)}/{image_key}"


def mask_png_glob(partition: str = "*") -> str:
    """Every native-resolution mask PNG of a partition (by default of every partition), as a
    glob relative to the root."""
    return f"{mask_folder(partition)}/*/*/*.png"


def source_snapshot(partition: str) -> str:
    """The partition's last observation of its source files (what changed since)."""
    return f"{OBSERVATIONS}/source_files/{partition}.json.gz"


def suite_report(partition: str, suite: str) -> str:
    """The last report of a suite on the partition's table, with the digest of the table and
    suite it is the report of (a table validated before is not validated again)."""
    return f"{OBSERVATIONS}/suite_reports/{partition}/{suite}.json"


def layout_migration_journal(stage: str, partition: str) -> str:
    """Present while a stage's outputs of a partition are being moved into shard folders
    (`radharmony migrate-layout`, or the stage itself): the partition is unfinished."""
    return f"{LAYOUT_MIGRATIONS}/{stage}/{partition}.json"


def preview(kind: str, name: str) -> str:
    """A picture for the UI: `previews/<kind>/<name>.png` (masks, bboxes, profile)."""
    return f"{PREVIEWS}/{kind}/{name}.png"
