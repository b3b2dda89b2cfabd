"""Training exports of one partition: Hugging Face `datasets` Parquet shards and WebDataset tar
shards of bounded size, each shard published whole, with a JSON shard index written last."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, BinaryIO

import cv2
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from radharmony_pipeline.internals import add_webdataset_opener
from radharmony_pipeline.processing.annotations.masks import MASK_FOREGROUND
from radharmony_pipeline.processing.imaging.geometry import GEOMETRIES, ResizeGeometry, resize_mask
from radharmony_pipeline.processing.imaging.tagged_png import mask_png
from radharmony_pipeline.processing.storage import store as storage
from radharmony_pipeline.processing.storage.output_layout import (
    HUGGINGFACE_EXPORT,
    WEBDATASET_EXPORT,
)
from radharmony_pipeline.processing.storage.retry_policy import is_local
from radharmony_pipeline.processing.storage.store import (
    OutputPath,
    listing,
    make_folder,
    output_path,
    publish_bytes,
    remove_orphaned_temporaries,
)
from radharmony_pipeline.processing.tables.table_schemas import (
    BOOL,
    CORPUS_WIDE_COLUMNS,
    MIMIC_CHEXPERT,
    REPORT_LABEL_PREFIX,
    REPORT_RULES,
    UNIFIED_MANIFEST,
    Column,
    TableSchema,
    col,
    conform,
)
from radharmony_pipeline.vocabulary import STATUS_OK, UNION_CLASS

# Bumped when the bytes of a shard would change for the same inputs.
EXPORT_CODE_VERSION = "2"  # 2: the labels derived from reports (issue 31)
INDEX_VERSION = 1
DEFAULT_MAX_SHARD_BYTES = 256 * 2**20

# The output layout of the exports, relative to the output root.
HUGGINGFACE_FOLDER = HUGGINGFACE_EXPORT
WEBDATASET_FOLDER = WEBDATASET_EXPORT
# The split names `datasets` gives special meaning to (`val` is spelled `validation`).
HUGGINGFACE_SPLITS = {"train": "train", "val": "validation", "test": "test"}

# The Hugging Face `Image` feature's Arrow storage: the PNG bytes, and a path (left null).
IMAGE = pa.struct([("bytes", pa.binary()), ("path", pa.string())])

# Manifest columns every export carries, as declared there; file locations inside the output
# root (image_path etc.) are kept so a sample can be traced back to the corpus. Columns joined
# over the whole corpus (near-duplicate group, parent identity) are left out: carrying them
# would make a change in one partition re-export every other.
RECORD_COLUMNS = tuple(
    name
    for name in UNIFIED_MANIFEST.names
    if name not in ("tensor_path", "tensor_index", "mask_path") and name not in CORPUS_WIDE_COLUMNS
)


def export_schema(mask_classes: Sequence[str]) -> TableSchema:
    """The Hugging Face export's columns: the manifest's record columns, the resized image, the
    union mask, and per mask class a nullable mask image with its `has_<class>_mask` flag."""
    per_class: list[Column] = []
    for name in mask_classes:
        per_class.append(
            col(f"{name}_mask", IMAGE, f"Resized `{name}` mask PNG (0/255); null when none")
        )
        per_class.append(col(f"has_{name}_mask", BOOL, f"The image has a non-empty `{name}` mask"))
    return TableSchema(
        "huggingface_export",
        (
            *(UNIFIED_MANIFEST.column(name) for name in RECORD_COLUMNS),
            col("image", IMAGE, "The resized S×S PNG of `image_path`, byte for byte"),
            col("mask", IMAGE, "The resized union mask PNG; null when has_mask is false"),
            *per_class,
        ),
    )


def huggingface_features(schema: TableSchema) -> Any:
    """The `datasets.Features` of the export: `Image` for image columns, the Arrow mapping
    of `datasets` for every other column."""
    import datasets

    plain = pa.schema([pa.field(c.name, c.type) for c in schema.columns if c.type != IMAGE])
    inferred = datasets.Features.from_arrow_schema(plain)
    return datasets.Features(
        {c.name: datasets.Image() if c.type == IMAGE else inferred[c.name] for c in schema.columns}
    )


@dataclass(frozen=True)
class ShardNames:
    """`<prefix>-<number>.<extension>`: the names of one export's shards in its folder."""

    prefix: str
    digits: int
    extension: str

    def name(self, number: int) -> str:
        return f"{self.prefix}-{number:0{self.digits}d}.{self.extension}"

    def matches(self, name: str) -> bool:
        start, end = f"{self.prefix}-", f".{self.extension}"
        number = name[len(start) : -len(end)]
        return (
            name.startswith(start)
            and name.endswith(end)
            and len(number) == self.digits
            and number.isdigit()
        )


def huggingface_shards(split: str) -> ShardNames:
    """`train-00000.parquet`: names `datasets` reads the split from."""
    return ShardNames(HUGGINGFACE_SPLITS[split], 5, "parquet")


def huggingface_index_name(split: str) -> str:
    return f"{HUGGINGFACE_SPLITS[split]}.index.json"


def webdataset_shards(partition: str) -> ShardNames:
    return ShardNames(partition, 6, "tar")


WEBDATASET_INDEX_NAME = "index.json"


HUGGINGFACE_CARD = "README.md"


def huggingface_configs_card(splits_by_dataset: Mapping[str, Sequence[str]]) -> str:
    """The README.md that makes the Hugging Face folder one repository with one configuration
    per dataset: `datasets.load_dataset("<output>/exports/huggingface", "<dataset>")`."""
    lines = ["---", "configs:"]
    for dataset, splits in splits_by_dataset.items():
        lines += [f"- config_name: {dataset}", "  data_files:"]
        for split in splits:
            name = HUGGINGFACE_SPLITS[split]
            lines += [f"  - split: {name}", f"    path: {dataset}/{name}-*.parquet"]
    lines += [
        "---",
        "",
        "RadHarmony corpus: one configuration per dataset.",
        "",
        f"`{REPORT_LABEL_PREFIX}*` columns are derived from the report text, not annotated: "
        f"`report_label_source` says how (`{REPORT_RULES}`: read by the RadHarmony report "
        f"labeler; `{MIMIC_CHEXPERT}`: MIMIC-CXR's CheXpert labels of the study). 1 positive, "
        "0 negative, -1 uncertain, null not mentioned.",
        "",
    ]
    return "\n".join(lines)


def write_huggingface_configs(
    folder: OutputPath, splits_by_dataset: Mapping[str, Sequence[str]]
) -> None:
    """Publish the folder's README.md unless it already holds these configurations (every
    partition's run writes the same file; an unchanged one is left untouched)."""
    card = huggingface_configs_card(splits_by_dataset).encode()
    path = folder / HUGGINGFACE_CARD
    try:
        if read_bytes(path) == card:
            return
    except FileNotFoundError:
        pass
    publish_bytes(path, card)


def huggingface_data_files(root: str | OutputPath, dataset: str) -> dict[str, list[str]]:
    """Split name -> shard paths of one dataset's configuration, from its shard indexes, as
    `datasets.load_dataset("parquet", data_files=...)` takes them."""
    folder = output_path(root) / HUGGINGFACE_FOLDER / dataset
    files: dict[str, list[str]] = {}
    for split, name in HUGGINGFACE_SPLITS.items():
        index = read_shard_index(folder / huggingface_index_name(split))
        if index is not None:
            files[name] = [str(folder / shard["name"]) for shard in index["shards"]]
    return files


def webdataset_urls(root: str | OutputPath, partition: str) -> list[str]:
    """The tar shards of one partition, from its shard index, as `webdataset.WebDataset`
    takes them: local paths, or object-store URLs (their scheme is then registered with
    webdataset's opener, which has none for s3, see `open_object_url`)."""
    root = output_path(root)
    if not is_local(root):
        add_webdataset_opener(root.protocol, open_object_url)
    folder = root / WEBDATASET_FOLDER / partition
    index = read_shard_index(folder / WEBDATASET_INDEX_NAME)
    if index is None:
        raise FileNotFoundError(f"{folder / WEBDATASET_INDEX_NAME}: no WebDataset export yet")
    return [str(folder / shard["name"]) for shard in index["shards"]]


def open_object_url(url: str, mode: str = "rb", bufsize: int = 8192, **_: Any) -> BinaryIO:
    """Open an object-store URL through fsspec, the way the output root itself is opened
    (same endpoint and credentials): webdataset's opener for schemes it lacks."""
    return output_path(url).open(mode)


def read_shard_index(path: OutputPath) -> dict[str, Any] | None:
    try:
        return json.loads(storage.read_bytes(path))
    except FileNotFoundError:
        return None


def shard_problem(folder: OutputPath, shard: Mapping[str, Any]) -> str | None:
    """How a shard listed in its folder's index differs from the index's entry (missing, its
    size, its SHA-256), or None."""
    try:
        content = storage.read_bytes(folder / shard["name"])
    except FileNotFoundError:
        return "missing (listed in its shard index)"
    if len(content) != shard["bytes"]:
        return f"{len(content):,} bytes, its shard index lists {shard['bytes']:,} (truncated?)"
    if hashlib.sha256(content).hexdigest() != shard["sha256"]:
        return f"SHA-256 differs from its shard index's ({shard['sha256']})"
    return None


@dataclass(frozen=True)
class ExportSample:
    """One manifest row and the files it is exported from."""

    key: str
    record: Mapping[str, Any]
    image: OutputPath
    mask: OutputPath | None
    # Native-resolution per-class masks (the masks table's), resized at export.
    class_masks: Mapping[str, OutputPath]
    geometry: ResizeGeometry
    # What the exported bytes depend on besides the record: pixel digest, mask rows.
    provenance: tuple[str, ...] = field(default=())


class ExportSamples(Sequence[ExportSample]):
    """A partition's samples held as columns (the records as Arrow, the files as relative
    paths): a sample's Python objects exist only while it is read, so memory does not grow
    by kilobytes per row of a 239,000-row partition. Slices build their samples together, and
    iteration goes a slice at a time."""

    def __init__(
        self, manifest: pd.DataFrame, images: pd.DataFrame, masks: pd.DataFrame, root: OutputPath
    ) -> None:
        self._records = conform(manifest[list(RECORD_COLUMNS)], _record_schema())
        self._mask_paths = manifest["mask_path"].tolist()
        self._root = root
        ids = images["image_id"]
        columns = ("orig_height", "orig_width", "size", "resize")
        geometry = zip(*(images[c] for c in columns), strict=True)
        self._geometry = dict(zip(ids, geometry, strict=True))
        self._pixels = dict(zip(ids, images["pixels_sha256"], strict=True))
        ok = masks[(masks["status"] == STATUS_OK) & (masks["mask_class"] != UNION_CLASS)]
        self._class_masks: dict[str, list[tuple[str, str, float]]] = {}
        for image_id, name, path, area in zip(
            ok["image_id"], ok["mask_class"], ok["mask_path"], ok["area_fraction"], strict=True
        ):
            self._class_masks.setdefault(image_id, []).append((str(name), path, area))

    def __len__(self) -> int:
        return self._records.num_rows

    def __iter__(self) -> Iterator[ExportSample]:
        for start in range(0, len(self), _ITERATION_SLICE):
            yield from self[start : start + _ITERATION_SLICE]

    def __getitem__(self, index):  # type: ignore[override]
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            if step != 1:
                raise ValueError("export samples are sliced in order")
            records = self._records.slice(start, max(0, stop - start)).to_pylist()
            return [self._sample(r, self._mask_paths[start + n]) for n, r in enumerate(records)]
        if not -len(self) <= index < len(self):
            raise IndexError(index)
        index %= len(self)
        return self[index : index + 1][0]

    def _sample(self, record: dict[str, Any], mask_path: Any) -> ExportSample:
        image_id = record["image_id"]
        height, width, size, resize = self._geometry[image_id]
        class_masks = self._class_masks.get(image_id, [])
        return ExportSample(
            key=sample_key(image_id),
            record=record,
            image=self._root / record["image_path"],
            mask=None if pd.isna(mask_path) else self._root / mask_path,
            class_masks={name: self._root / path for name, path, _ in class_masks},
            geometry=GEOMETRIES[resize](int(height), int(width), int(size)),
            provenance=(
                str(self._pixels.get(image_id)),
                *sorted(f"{name}:{path}:{area!r}" for name, path, area in class_masks),
            ),
        )


# Samples built together while iterating: few enough to keep memory flat.
_ITERATION_SLICE = 1024


def export_samples(
    manifest: pd.DataFrame, images: pd.DataFrame, masks: pd.DataFrame, root: OutputPath
) -> ExportSamples:
    """The partition's manifest rows (`partition_manifest`) with their files, in row order."""
    return ExportSamples(manifest, images, masks, root)


def sample_key(image_id: str) -> str:
    """The WebDataset key of an image: its id with `/` as `__` and `.` as `,`.

    WebDataset splits a member name at the first dot of its base name (key, extension), so a
    key holds no dot; a comma is not in any image_key (see `image_keys`), so keys stay unique.
    """
    return image_id.replace("/", "__").replace(".", ",")


def _record_schema() -> TableSchema:
    return TableSchema(
        "export_record", tuple(UNIFIED_MANIFEST.column(name) for name in RECORD_COLUMNS)
    )


def export_fingerprint(samples: Sequence[ExportSample], settings: Mapping[str, Any]) -> str:
    """A digest of everything the shards are made of: when it matches the index's, the
    shards already on storage are the ones this export would write."""
    digest = hashlib.sha256()
    digest.update(json.dumps({"code": EXPORT_CODE_VERSION, **settings}, sort_keys=True).encode())
    for sample in samples:
        digest.update(json.dumps(json_record(sample.record), sort_keys=True).encode())
        digest.update("\0".join(sample.provenance).encode())
    return digest.hexdigest()


def json_record(record: Mapping[str, Any]) -> dict[str, Any]:
    """The record with timestamps as ISO 8601 text: what `<key>.json` holds."""
    return {
        name: value.isoformat() if hasattr(value, "isoformat") else value
        for name, value in record.items()
    }


@dataclass
class Payload:
    """A sample's bytes, loaded for one shard."""

    sample: ExportSample
    files: dict[str, bytes]

    @property
    def size(self) -> int:
        return sum(len(content) for content in self.files.values())


def read_bytes(path: OutputPath) -> bytes:
    return storage.read_bytes(path)


def resized_class_mask(sample: ExportSample, mask_class: str) -> bytes:
    """The class's native mask through the image's geometry, as a 0/255 PNG (as images
    resizes the union mask)."""
    path = sample.class_masks[mask_class]
    mask = resize_mask(_native_mask(path), sample.geometry)
    return mask_png(mask)


def _native_mask(path: OutputPath) -> np.ndarray:
    """A 0/255 mask PNG of the masks stage, decoded by OpenCV (several times faster than
    Pillow on these native-resolution files, and without the GIL)."""
    content = np.frombuffer(read_bytes(path), dtype=np.uint8)
    mask = cv2.imdecode(content, cv2.IMREAD_UNCHANGED)
    if mask is None or mask.ndim != 2 or mask.dtype != np.uint8:
        raise ValueError(f"{path}: not an 8-bit grayscale mask PNG; re-run the masks stage")
    invalid = np.count_nonzero((mask != 0) & (mask != MASK_FOREGROUND))
    if invalid:
        raise ValueError(f"{path}: {invalid:,} pixels are neither 0 nor {MASK_FOREGROUND}")
    return mask


# Samples loaded ahead of the shard writer: enough to keep every thread busy, few enough to
# bound memory on a partition of hundreds of thousands of images.
LOAD_WINDOW = 64


def _loaded(
    samples: Sequence[ExportSample], load: Callable[[ExportSample], Payload], workers: int
) -> Iterator[Payload]:
    """The samples' payloads in order, read and encoded on `workers` threads (file reads and
    PNG codecs release the GIL)."""
    if workers <= 1:
        yield from map(load, samples)
        return
    with ThreadPoolExecutor(workers) as pool:
        for start in range(0, len(samples), LOAD_WINDOW):
            yield from pool.map(load, samples[start : start + LOAD_WINDOW])


ShardWriter = Callable[[Sequence[Payload], BinaryIO], None]


@dataclass(frozen=True)
class ExportFormat:
    """How one export format loads a sample's bytes and writes a shard of them."""

    name: str
    load: Callable[[ExportSample], Payload]
    write: ShardWriter


@dataclass(frozen=True)
class ExportResult:
    index: dict[str, Any]
    reused: bool


def export_partition(
    samples: Sequence[ExportSample],
    export: ExportFormat,
    folder: OutputPath,
    shard_names: ShardNames,
    index_name: str,
    max_shard_bytes: int,
    identity: Mapping[str, str],
    workers: int = 1,
) -> ExportResult:
    """Write the samples as shards of at most `max_shard_bytes` of payload (a bigger sample
    is a shard of its own), then the shard index; shards the index does not list are removed.

    Each shard is published whole (temporary name, then renamed or copied into place), so a
    killed export leaves only temporaries, which the next run clears; the same inputs give
    byte-identical shards, and an export whose inputs match the index's is not redone.
    """
    make_folder(folder)
    remove_orphaned_temporaries(folder)
    settings = {"format": export.name, "max_shard_bytes": max_shard_bytes}
    fingerprint = export_fingerprint(samples, settings)
    existing = read_shard_index(folder / index_name)
    present = listing(folder)
    if (
        existing is not None
        and existing.get("fingerprint") == fingerprint
        and all(shard["name"] in present for shard in existing["shards"])
    ):
        return ExportResult(existing, reused=True)
    shards = []
    payloads = _loaded(samples, export.load, workers)
    # A shard the previous index lists with the same bytes is left in place: after
    # `radharmony verify` removed a damaged one, only that one is written again.
    listed = {shard["name"]: shard for shard in (existing or {}).get("shards", [])}
    for number, shard in enumerate(_shards(payloads, max_shard_bytes)):
        name = shard_names.name(number)
        shards.append(_publish_shard(folder / name, shard, export.write, listed.get(name)))
    index = {
        "format": export.name,
        "index_version": INDEX_VERSION,
        **identity,
        "fingerprint": fingerprint,
        "max_shard_bytes": max_shard_bytes,
        "samples": sum(len(shard["samples"]) for shard in shards),
        "shards": shards,
    }
    publish_bytes(folder / index_name, _index_bytes(index))
    kept = {shard["name"] for shard in shards}
    for name in present:
        # Shards of an earlier, larger export of this partition.
        if shard_names.matches(name) and name not in kept:
            storage.remove(folder / name)
    return ExportResult(index, reused=False)


def _index_bytes(index: Mapping[str, Any]) -> bytes:
    return (json.dumps(index, indent=1, sort_keys=True) + "\n").encode()


def _shards(payloads: Iterable[Payload], max_bytes: int) -> Iterator[list[Payload]]:
    shard: list[Payload] = []
    size = 0
    for payload in payloads:
        if shard and size + payload.size > max_bytes:
            yield shard
            shard, size = [], 0
        shard.append(payload)
        size += payload.size
    if shard:
        yield shard


def _publish_shard(
    path: OutputPath,
    payloads: Sequence[Payload],
    write: ShardWriter,
    listed: Mapping[str, Any] | None,
) -> dict:
    """Write the shard unless `listed` (its previous index entry) has the same bytes and
    the file there still has that size."""
    buffer = io.BytesIO()
    write(payloads, buffer)
    content = buffer.getvalue()
    digest = hashlib.sha256(content).hexdigest()
    if not _still_listed(path, listed, len(content), digest):
        publish_bytes(path, content)
    return {
        "name": path.name,
        "bytes": len(content),
        "sha256": digest,
        "samples": [
            {"key": p.sample.key, "image_id": p.sample.record["image_id"]} for p in payloads
        ],
    }


def _still_listed(
    path: OutputPath, listed: Mapping[str, Any] | None, size: int, digest: str
) -> bool:
    if listed is None or listed["bytes"] != size or listed["sha256"] != digest:
        return False
    try:
        return storage.file_size(path) == size
    except FileNotFoundError:
        return False


# -- Hugging Face Parquet ---------------------------------------------------------------------


def huggingface_format(mask_classes: Sequence[str]) -> ExportFormat:
    schema = export_schema(mask_classes)
    features = huggingface_features(schema)
    arrow = _with_features(pa.schema([pa.field(c.name, c.type) for c in schema.columns]), features)

    def load(sample: ExportSample) -> Payload:
        files = {"image": read_bytes(sample.image)}
        if sample.mask is not None:
            files["mask"] = read_bytes(sample.mask)
        for name in mask_classes:
            if name in sample.class_masks:
                files[f"{name}_mask"] = resized_class_mask(sample, name)
        return Payload(sample, files)

    def write(payloads: Sequence[Payload], handle: BinaryIO) -> None:
        columns: dict[str, list] = {name: [] for name in arrow.names}
        for payload in payloads:
            for name in RECORD_COLUMNS:
                columns[name].append(payload.sample.record[name])
            for name in ("image", "mask", *(f"{c}_mask" for c in mask_classes)):
                content = payload.files.get(name)
                columns[name].append(None if content is None else {"bytes": content, "path": None})
            for name in mask_classes:
                columns[f"has_{name}_mask"].append(f"{name}_mask" in payload.files)
        table = pa.Table.from_pydict(columns, schema=arrow)
        # Small row groups: `datasets` streams a Parquet file a row group at a time.
        pq.write_table(table, handle, row_group_size=64, compression="zstd")

    return ExportFormat("huggingface", load, write)


def _with_features(schema: pa.Schema, features: Any) -> pa.Schema:
    # Where `datasets` looks for the declared features of a Parquet file.
    info = {"info": {"features": features.to_dict()}}
    return schema.with_metadata({b"huggingface": json.dumps(info, sort_keys=True).encode()})


# -- WebDataset tar ---------------------------------------------------------------------------


def _load_webdataset_sample(sample: ExportSample) -> Payload:
    files = {"png": read_bytes(sample.image)}
    if sample.mask is not None:
        files["mask.png"] = read_bytes(sample.mask)
    files["json"] = (json.dumps(json_record(sample.record), sort_keys=True) + "\n").encode()
    return Payload(sample, files)


def _write_tar(payloads: Sequence[Payload], handle: BinaryIO) -> None:
    # Fixed owner, mode and time, so the same samples give the same bytes.
    with tarfile.open(fileobj=handle, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for payload in payloads:
            for extension, content in payload.files.items():
                member = tarfile.TarInfo(f"{payload.sample.key}.{extension}")
                member.size = len(content)
                member.mtime = 0
                member.mode = 0o444
                member.uname = member.gname = ""
                tar.addfile(member, io.BytesIO(content))


WEBDATASET = ExportFormat("webdataset", _load_webdataset_sample, _write_tar)
