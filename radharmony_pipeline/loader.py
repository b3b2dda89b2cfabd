"""A PyTorch-style map dataset over `unified_manifest.parquet`, usable with or without torch.

Each sample is a dict:

- `img`: float32 1×S×S in [-1, 1] (pixel / 127.5 − 1), from the partition's packed uint8
  array (`tensor_path`, row `tensor_index`, one row read per sample: a process never holds a
  whole array) or, when that file is absent or `use_packed=False`, from the resized PNG
  `image_path`.
- `mask`: float32 1×S×S in {0, 1}, the resized union mask.
- `has_mask`: bool. True: the dataset segmented this image and `mask` is its annotation (all
  zeros = annotated negative). False: no mask was annotated (laterals, MS-CXR, ReXGradient);
  `mask` is then all zeros only so that batches stack, and must be left out of a
  segmentation loss — weight the per-sample loss by `has_mask` (see the README snippet).
- `bboxes`: float32 (n, 4) `[y_min, y_max, x_min, x_max]` normalized to the resized S×S frame
  (letterbox padding included), (0, 4) when none; `bbox_labels`: list[str] and `label_text`:
  list[str | None], parallel to `bboxes` (entry i of each describes box i; MS-CXR phrases,
  duplicates kept; None where the dataset has no phrase).
- `cls`: float32 (21,) in `UNIFIED_LABELS` order, NaN where the class is unknown (unknown is
  not negative: mask NaNs out of the loss). `labels=` chooses what fills it: `"annotations"`
  (default) the dataset's own `label_*` columns; `"reports"` the labels read from the image's
  report (`report_label_*`: null where the report does not mention the class, for classes the
  report labeler does not read, and for images without report labels); `"both"` per class
  the annotation where there is one, else the report label. `uncertain=` says what an
  uncertain label (-1, from reports) becomes: `"ignore"` NaN (default), `"zeros"` 0 or
  `"ones"` 1, the policies of the CheXpert paper. A null never becomes 0.
- `report`: str or None. `image_id`, `dataset`, `split`: str.

When torch is importable the class is a `torch.utils.data.Dataset` and `img`, `mask`, `cls`,
`bboxes` are tensors; otherwise they are numpy arrays. Boxes vary in number per image, so the
default collate cannot stack them; batch with a collate that stacks the fixed-size fields and
keeps the rest as lists:

    from torch.utils.data import DataLoader, default_collate

    def collate(samples):
        fixed = default_collate(
            [{k: s[k] for k in ("img", "mask", "has_mask", "cls")} for s in samples]
        )
        rest = {k: [s[k] for s in samples] for k in samples[0] if k not in fixed}
        return {**fixed, **rest}

    dataset = ManifestDataset("data/output/tables/unified_manifest.parquet", splits="train")
    loader = DataLoader(dataset, batch_size=32, shuffle=True, num_workers=4, collate_fn=collate)
    for batch in loader:
        known = ~batch["cls"].isnan()  # a loss only over annotated classes
        annotated = batch["has_mask"]  # a segmentation loss only over annotated masks
        ...

(or `batch_size=1`, or `batch_size=None` for unbatched samples). Each worker process opens its
own readers; they are not pickled with the dataset.

From object storage (an `s3://` manifest) each packed row is a range request: a plain shuffle
pays one per sample. `read_block_rows=64` with a BlockShuffleSampler reads blocks of 64 rows,
each serving the samples of its block that a window of 8 blocks draws (calling `set_epoch`
per epoch), at the price of batches mixed from 8 blocks at a time rather than the whole
split. Give the sampler the loader's batch size and workers, so that each block goes to one
worker:

    dataset = ManifestDataset("s3://bucket/output/tables/unified_manifest.parquet",
                              splits="train", read_block_rows=64)
    sampler = BlockShuffleSampler(dataset, batch_size=32, num_workers=4)
    loader = DataLoader(dataset, batch_size=32, sampler=sampler, num_workers=4, collate_fn=collate)

`manifest_records` gives the same rows as MONAI data dicts, and `SeedCompatibleDataset`
returns the seed library's sample dicts (docs/exports.md).
"""

from __future__ import annotations

import math
import os
import pickle
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
from PIL import Image

from radharmony_pipeline.processing.corpus.duplicates import (
    one_per_duplicate_group,
    without_cross_split_groups,
)
from radharmony_pipeline.processing.corpus.parents import (
    PARENT_IDENTITY,
    patient_disjoint_by_parent,
    without_parent_patient_leaks,
    without_parent_train_leaks,
)
from radharmony_pipeline.processing.storage.layout_migration import refuse_unfinished_migration
from radharmony_pipeline.processing.storage.output_layout import root_of_table_file
from radharmony_pipeline.processing.storage.packed_rows import (
    PackedBlockReader,
    PackedRowReader,
    read_layout,
)
from radharmony_pipeline.processing.storage.retry_policy import is_local
from radharmony_pipeline.processing.storage.store import (
    OutputPath,
    exists,
    open_for_reading,
    output_path,
)
from radharmony_pipeline.processing.tables.manifest import (
    PARTITION_MANIFEST_COLUMNS,
    REPORT_MANIFEST_COLUMNS,
)
from radharmony_pipeline.processing.tables.table_schemas import REPORT_LABEL_PREFIX
from radharmony_pipeline.sources import SOURCE_TYPES
from radharmony_pipeline.vocabulary import (
    LABEL_COLUMNS,
    UNCERTAIN,
    UNIFIED_LABELS,
    snake_case,
    unified_class,
)

try:  # torch is optional: without it samples are numpy arrays.
    import torch
    from torch.utils.data import Dataset as _DatasetBase
except ImportError:
    torch = None
    _DatasetBase = object

Filter = str | Collection[str] | None

TENSOR_FIELDS: tuple[str, ...] = ("img", "mask", "cls", "bboxes")
# Needed only by the duplicate options (manifests built before issue 11 lack it).
DUPLICATE_COLUMNS: tuple[str, ...] = ("duplicate_group",)
# Every manifest column a sample needs whatever the options (manifests built before issue 31
# lack the report labels, needed only by labels="reports" or "both").
_SAMPLE_COLUMNS = tuple(c for c in PARTITION_MANIFEST_COLUMNS if c not in REPORT_MANIFEST_COLUMNS)
# What fills `cls`: the datasets' annotations, the labels read from reports, or both.
LABEL_CHOICES: tuple[str, ...] = ("annotations", "reports", "both")
# What an uncertain label (-1) becomes in `cls`, by policy.
UNCERTAIN_VALUES: dict[str, float] = {"ignore": np.nan, "zeros": 0.0, "ones": 1.0}
# Blocks of packed rows each process keeps: twice BlockShuffleSampler's default window, so a
# window's blocks stay while its rows are drawn (16 blocks of 64 rows at 224²: 50 MB).
CACHED_BLOCKS = 16
# Blocks BlockShuffleSampler mixes at a time by default.
WINDOW_BLOCKS = 8
# The report label column of each unified class, in UNIFIED_LABELS order (None: not read).
_REPORT_COLUMN_OF_CLASS: tuple[str | None, ...] = tuple(
    f"{REPORT_LABEL_PREFIX}{name}"
    if f"{REPORT_LABEL_PREFIX}{name}" in REPORT_MANIFEST_COLUMNS
    else None
    for name in UNIFIED_LABELS
)


class ManifestDataset(_DatasetBase):
    """Map-style dataset: one training sample per manifest row that passes the filters.

    `manifest`: the Parquet path or an already loaded frame (then `output_root` is required).
    `output_root`: the folder the manifest's paths are relative to; by default the parent of
    the manifest's `tables/` folder. `datasets`, `splits`, `view_positions`: keep rows whose
    value is one of these (a string or a collection); None keeps all.
    `drop_cross_split_duplicates`: leave out every image whose near-duplicate group
    (`duplicate_group`) has a member in another split, of any dataset (decided on the whole
    manifest, before the filters). `one_per_duplicate_group`: of the rows kept, keep only the
    smallest `image_id` of each group.
    `drop_parent_train_leaks`: leave out evaluation images (val/test) that are in their parent
    dataset's official training split (MIMIC-CXR train, NIH ChestX-ray14 train_val; the
    `eval_images_in_parent_train_split` check counts them). `drop_parent_patient_leaks`: leave
    out evaluation images whose parent patient has images in that training split.
    `patient_disjoint_parents`: leave out the val/test images of a dataset whose parent patient
    also has a train image in it (ChestX-Det's patients, recovered through NIH). These three
    are decided on the whole manifest, before the filters; rows whose parent is unknown stay.
    `labels` and `uncertain` choose what fills `cls` (see the module's docstring).
    `read_block_rows`: packed rows are read this many consecutive rows at a time, the last
    CACHED_BLOCKS blocks kept. Sampled with BlockShuffleSampler, one read then serves many
    samples: on object storage, where each read is a request, that is what keeps training
    near its speed from the local disk. 1 (the default) reads each row alone, the fit for a
    plain random shuffle.
    """

    def __init__(
        self,
        manifest: str | Path | pd.DataFrame,
        output_root: str | Path | None = None,
        datasets: Filter = None,
        splits: Filter = None,
        view_positions: Filter = None,
        use_packed: bool = True,
        drop_cross_split_duplicates: bool = False,
        one_per_duplicate_group: bool = False,
        drop_parent_train_leaks: bool = False,
        drop_parent_patient_leaks: bool = False,
        patient_disjoint_parents: bool = False,
        labels: str = "annotations",
        uncertain: str = "ignore",
        read_block_rows: int = 1,
    ) -> None:
        _check_choice("labels", labels, LABEL_CHOICES)
        if read_block_rows < 1:
            raise ValueError(f"read_block_rows must be at least 1, got {read_block_rows}")
        _check_choice("uncertain", uncertain, tuple(UNCERTAIN_VALUES))
        self.output_root = _output_root(manifest, output_root)
        refuse_unfinished_migration(self.output_root)
        deduplicating = drop_cross_split_duplicates or one_per_duplicate_group
        by_parent = drop_parent_train_leaks or drop_parent_patient_leaks or patient_disjoint_parents
        table = _read_manifest(
            manifest,
            (
                *(DUPLICATE_COLUMNS if deduplicating else ()),
                *(PARENT_IDENTITY if by_parent else ()),
                *(REPORT_MANIFEST_COLUMNS if labels != "annotations" else ()),
            ),
        )
        if drop_cross_split_duplicates:
            table = without_cross_split_groups(table)
        if drop_parent_train_leaks:
            table = without_parent_train_leaks(table)
        if drop_parent_patient_leaks:
            table = without_parent_patient_leaks(table)
        if patient_disjoint_parents:
            table = patient_disjoint_by_parent(table)
        filters = {"dataset": datasets, "split": splits, "view_position": view_positions}
        self.table = _filtered(table, filters)
        if one_per_duplicate_group:
            self.table = _one_per_group(self.table)
        self.use_packed = use_packed
        self.read_block_rows = read_block_rows
        # Done once for all rows: per-sample pandas conversions would dominate __getitem__.
        self._labels = _class_matrix(self.table, labels, uncertain)
        self._packed: dict[Path, PackedBlockReader | None] = {}
        self._process = os.getpid()  # the process whose readers and S3 clients these are

    def __len__(self) -> int:
        return len(self.table)

    def __getitem__(self, index: int) -> dict[str, Any]:
        position = _checked_index(index, len(self))
        if self._process != os.getpid():
            self._open_in_this_process()
        row = self.table.iloc[position]
        img = _to_unit_range(self._pixels(row))
        sample = {
            "img": img,
            "mask": self._mask(row, img.shape[-2:]),
            "has_mask": bool(row["has_mask"]),
            "bboxes": _boxes(row["bboxes_resized"]),
            "bbox_labels": _strings(row["bbox_labels"]),
            "label_text": _optional_strings(row["label_text"]),
            "cls": self._labels[position].copy(),
            "report": _optional_str(row["report"]),
            "image_id": str(row["image_id"]),
            "dataset": str(row["dataset"]),
            "split": str(row["split"]),
        }
        return _as_tensors(sample)

    def __getstate__(self) -> dict[str, Any]:
        # An open file does not pickle; DataLoader workers open their own.
        state = self.__dict__.copy()
        state["_packed"] = {}
        return state

    def _open_in_this_process(self) -> None:
        """Forked from the process that read samples (a DataLoader worker started by fork):
        its open arrays and the output root's S3 client are that process's, and s3fs refuses
        a client from another process. Start afresh, as a pickled copy does."""
        self._packed = {}
        self.output_root = pickle.loads(pickle.dumps(self.output_root))
        self._process = os.getpid()

    def _pixels(self, row: pd.Series) -> np.ndarray:
        """The resized uint8 S×S image: a packed row if available, else the PNG."""
        packed = self._packed_rows(row["tensor_path"]) if self.use_packed else None
        if packed is not None and not _is_missing(row["tensor_index"]):
            return packed.row(int(row["tensor_index"]))
        return _read_png(self.output_root / row["image_path"])

    def _packed_rows(self, relative_path: Any) -> PackedBlockReader | None:
        """A reader of the partition's packed array, its header read on first use (a block
        of rows is one read, locally or as a range request on object storage; a memory map
        would grow the process to the whole array over an epoch); None if it is absent."""
        if _is_missing(relative_path):
            return None
        path = self.output_root / relative_path
        if path not in self._packed:
            self._packed[path] = (
                PackedBlockReader(
                    PackedRowReader(read_layout(path)), self.read_block_rows, CACHED_BLOCKS
                )
                if exists(path)
                else None
            )
        return self._packed[path]

    def _mask(self, row: pd.Series, shape: tuple[int, int]) -> np.ndarray:
        # Not annotated: zeros so batches stack; has_mask=False keeps them out of the loss.
        if not bool(row["has_mask"]) or _is_missing(row["mask_path"]):
            return np.zeros((1, *shape), dtype=np.float32)
        mask = _read_png(self.output_root / row["mask_path"])
        if mask.shape != shape:
            raise ValueError(f"{row['mask_path']}: mask is {mask.shape}, image is {shape}")
        # Thresholded, not divided by 255, so a 0/1 PNG also comes out as {0, 1}.
        return (mask > 0).astype(np.float32)[None]


class BlockShuffleSampler:
    """A ManifestDataset's samples in an order that reads well from object storage: its
    packed arrays' blocks of `dataset.read_block_rows` rows in random order, `window_blocks`
    blocks at a time, the samples of each window in random order, so that a block is read
    once for all its samples where a plain shuffle reads each sample alone. A batch mixes the
    samples of `window_blocks` blocks, not of the whole split. Samples with no packed row
    (read from their PNGs) form blocks of neighbouring positions.

    With DataLoader workers, give the loader's `batch_size` and `num_workers` here too: the
    DataLoader hands batch k to worker k mod `num_workers`, each worker keeps its own blocks,
    so the order deals every block to one worker and makes each batch of that worker's
    blocks (otherwise each worker would read every block of a window). For
    DataLoader(sampler=...); `set_epoch(n)` before each epoch gives each epoch its own order,
    reproducible from `seed`."""

    def __init__(
        self,
        dataset: ManifestDataset,
        window_blocks: int = WINDOW_BLOCKS,
        seed: int = 0,
        batch_size: int = 1,
        num_workers: int = 0,
    ) -> None:
        for name, value, least in (
            ("window_blocks", window_blocks, 1),
            ("batch_size", batch_size, 1),
            ("num_workers", num_workers, 0),
        ):
            if value < least:
                raise ValueError(f"{name} must be at least {least}, got {value}")
        self.window_blocks, self.seed, self.epoch = window_blocks, seed, 0
        self.batch_size, self.readers = batch_size, max(1, num_workers)
        self._blocks = _sample_blocks(dataset)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return sum(len(block) for block in self._blocks)

    def __iter__(self) -> Iterator[int]:
        rng = np.random.default_rng((self.seed, self.epoch))
        streams = [
            self._windows(blocks, rng)
            for blocks in _dealt(rng.permutation(len(self._blocks)), self._blocks, self.readers)
        ]
        yield from _batches_in_turn(streams, self.batch_size).tolist()

    def _windows(self, blocks: list[int], rng: np.random.Generator) -> np.ndarray:
        """The samples of `blocks`, window by window, each window's in random order."""
        windows = [
            rng.permutation(
                np.concatenate(
                    [self._blocks[b] for b in blocks[first : first + self.window_blocks]]
                )
            )
            for first in range(0, len(blocks), self.window_blocks)
        ]
        return np.concatenate(windows) if windows else np.zeros(0, dtype=np.int64)


def _dealt(order: np.ndarray, blocks: list[np.ndarray], readers: int) -> list[list[int]]:
    """The blocks in `order` dealt to `readers`, each to the one with the fewest samples so
    far, so that every reader's share is within a block of the others'."""
    shares: list[list[int]] = [[] for _ in range(readers)]
    sizes = [0] * readers
    for block in order.tolist():
        reader = sizes.index(min(sizes))
        shares[reader].append(block)
        sizes[reader] += len(blocks[block])
    return shares


def _batches_in_turn(streams: list[np.ndarray], batch_size: int) -> np.ndarray:
    """Batches taken from the streams in turn, so that batch k is stream k mod len(streams)'s,
    as long as every stream has a whole batch left; then the rest of every stream."""
    whole = min(len(stream) for stream in streams) // batch_size * batch_size
    turns = np.stack([stream[:whole].reshape(-1, batch_size) for stream in streams], axis=1)
    return np.concatenate([turns.reshape(-1), *(stream[whole:] for stream in streams)])


def _sample_blocks(dataset: ManifestDataset) -> list[np.ndarray]:
    """The dataset's positions grouped by the block of packed rows each reads (by position
    for those read from PNGs), in no particular order."""
    table, rows = dataset.table, dataset.read_block_rows
    packed = table["tensor_path"].notna() & table["tensor_index"].notna()
    packed &= dataset.use_packed
    index = pd.to_numeric(table["tensor_index"], errors="coerce").fillna(0).to_numpy(np.int64)
    block = np.where(packed, index // rows, np.arange(len(table)) // rows)
    array = table["tensor_path"].where(packed, "").astype(str).to_numpy()
    groups = pd.Series(np.arange(len(table))).groupby([array, block]).indices
    return [np.asarray(positions) for positions in groups.values()]


def _output_root(manifest: str | Path | pd.DataFrame, output_root: str | Path | None) -> OutputPath:
    if output_root is not None:
        return output_path(output_root)
    if isinstance(manifest, pd.DataFrame):
        raise ValueError(
            "a manifest given as a DataFrame needs output_root: the folder its "
            "image_path, tensor_path and mask_path are relative to"
        )
    location = output_path(manifest)
    if is_local(location):
        return root_of_table_file(Path(location).resolve())
    return root_of_table_file(location)


def _read_manifest(
    manifest: str | Path | pd.DataFrame, extra: tuple[str, ...] = ()
) -> pd.DataFrame:
    wanted = [*_SAMPLE_COLUMNS, *extra]
    if isinstance(manifest, pd.DataFrame):
        table = manifest
    else:
        with open_for_reading(output_path(manifest)) as handle:
            present = set(pq.read_schema(handle).names)
            handle.seek(0)
            table = pd.read_parquet(handle, columns=[c for c in wanted if c in present])
    missing = [column for column in wanted if column not in table.columns]
    if missing:
        raise ValueError(f"manifest lacks columns {missing}; is it a unified_manifest table?")
    return table


def _filtered(table: pd.DataFrame, filters: dict[str, Filter]) -> pd.DataFrame:
    """Rows matching every given filter, renumbered 0 … n−1 for positional access."""
    keep = np.ones(len(table), dtype=bool)
    for column, wanted in filters.items():
        if wanted is not None:
            keep &= table[column].isin(_as_set(wanted)).to_numpy()
    if len(table) and not keep.any():
        raise ValueError(
            f"no manifest row matches {_describe(filters)}; available: {_available(table, filters)}"
        )
    return table.loc[keep].reset_index(drop=True)


def _one_per_group(table: pd.DataFrame) -> pd.DataFrame:
    return one_per_duplicate_group(table).reset_index(drop=True)


def _as_set(wanted: str | Collection[str]) -> set[str]:
    # A bare string is one value, not a collection of characters.
    return {wanted} if isinstance(wanted, str) else set(wanted)


def _describe(filters: dict[str, Filter]) -> str:
    return ", ".join(
        f"{column} in {sorted(_as_set(wanted))}"
        for column, wanted in filters.items()
        if wanted is not None
    )


def _available(table: pd.DataFrame, filters: dict[str, Filter]) -> str:
    return "; ".join(
        f"{column}: {sorted(table[column].dropna().unique())}"
        for column, wanted in filters.items()
        if wanted is not None
    )


def _check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(
            f"{name} must be one of {', '.join(repr(c) for c in choices)}, got {value!r}"
        )


def _label_matrix(table: pd.DataFrame) -> np.ndarray:
    """(rows, 21) float32 of the annotations in vocabulary order; null becomes NaN, never 0."""
    return table[list(LABEL_COLUMNS)].to_numpy(dtype=np.float32, na_value=np.nan)


def _report_matrix(table: pd.DataFrame) -> np.ndarray:
    """(rows, 21) float32 of the report labels in vocabulary order (-1 kept); NaN where the
    report states nothing of the class or the labeler does not read it."""
    matrix = np.full((len(table), len(UNIFIED_LABELS)), np.nan, dtype=np.float32)
    for position, column in enumerate(_REPORT_COLUMN_OF_CLASS):
        if column is not None:
            matrix[:, position] = table[column].to_numpy(dtype=np.float32, na_value=np.nan)
    return matrix


def _class_matrix(table: pd.DataFrame, labels: str, uncertain: str) -> np.ndarray:
    """`cls` of every row: the chosen labels, per cell the annotation first for "both",
    uncertain (-1) replaced by the policy's value."""
    if labels == "annotations":
        matrix = _label_matrix(table)
    elif labels == "reports":
        matrix = _report_matrix(table)
    else:
        annotations = _label_matrix(table)
        matrix = np.where(np.isnan(annotations), _report_matrix(table), annotations)
    return np.where(matrix == UNCERTAIN, np.float32(UNCERTAIN_VALUES[uncertain]), matrix)


def _checked_index(index: int, length: int) -> int:
    # IndexError (not a pandas error) ends plain `for sample in dataset` iteration.
    if not -length <= index < length:
        raise IndexError(f"index {index} out of range for {length} samples")
    return index % length


def _read_png(path: OutputPath) -> np.ndarray:
    with open_for_reading(path) as handle, Image.open(handle) as image:
        return np.asarray(image if image.mode == "L" else image.convert("L"))


def _to_unit_range(pixels: np.ndarray) -> np.ndarray:
    """uint8 H×W → float32 1×H×W in [-1, 1]."""
    return (pixels.astype(np.float32) / np.float32(127.5) - np.float32(1.0))[None]


def _boxes(value: Any) -> np.ndarray:
    if _is_missing(value):
        return np.zeros((0, 4), dtype=np.float32)
    # Parquet list columns arrive as object arrays of arrays; reshape keeps (0, 4) when empty.
    return np.array([np.asarray(box, dtype=np.float32) for box in value], dtype=np.float32).reshape(
        -1, 4
    )


def _strings(value: Any) -> list[str]:
    return [] if _is_missing(value) else [str(item) for item in value]


def _optional_strings(value: Any) -> list[str | None]:
    return [] if _is_missing(value) else [_optional_str(item) for item in value]


def _optional_str(value: Any) -> str | None:
    return None if _is_missing(value) else str(value)


def _is_missing(value: Any) -> bool:
    """A null scalar (None, pd.NA, NaN). Lists and arrays are never missing, even empty."""
    return value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value))


def _as_tensors(sample: dict[str, Any]) -> dict[str, Any]:
    if torch is None:
        return sample
    return {
        key: torch.from_numpy(value) if key in TENSOR_FIELDS else value
        for key, value in sample.items()
    }


def manifest_records(
    manifest: str | Path | pd.DataFrame,
    output_root: str | Path | None = None,
    datasets: Filter = None,
    splits: Filter = None,
    view_positions: Filter = None,
) -> list[dict[str, Any]]:
    """The manifest as MONAI data dicts, one per row that passes the filters.

    `image` (and `mask`, only when the image was annotated) are paths of the resized PNGs,
    for `monai.transforms.LoadImaged(keys=["image", "mask"], allow_missing_keys=True)`;
    `label` is the 21 unified labels in `UNIFIED_LABELS` order (NaN: not annotated),
    `bbox` the boxes `[y_min, y_max, x_min, x_max]` normalized in the resized frame with
    `bbox_labels` and `label_text` parallel to them; `has_mask`, `report` and the ids as in
    `ManifestDataset`.
    """
    root = _output_root(manifest, output_root)
    table = _filtered(
        _read_manifest(manifest),
        {"dataset": datasets, "split": splits, "view_position": view_positions},
    )
    labels = _label_matrix(table)
    records = []
    for position, row in enumerate(table.itertuples(index=False)):
        record = {
            "image": str(root / row.image_path),
            "has_mask": bool(row.has_mask),
            "label": labels[position].tolist(),
            "bbox": _box_lists(row.bboxes_resized),
            "bbox_labels": _strings(row.bbox_labels),
            "label_text": _optional_strings(row.label_text),
            "report": _optional_str(row.report),
            "image_id": str(row.image_id),
            "dataset": str(row.dataset),
            "split": str(row.split),
        }
        if record["has_mask"] and not _is_missing(row.mask_path):
            record["mask"] = str(root / row.mask_path)
        records.append(record)
    return records


def _box_lists(value: Any) -> list[list[float]]:
    """Boxes as plain float lists, at the manifest's float64 precision."""
    return [] if _is_missing(value) else [[float(v) for v in box] for box in value]


def seed_label_columns(dataset: str) -> tuple[str, ...]:
    """The unified label columns of the dataset's own classes, in the seed library's `cls`
    order (its class names sorted by snake_case name); empty for a dataset without labels."""
    names = sorted(SOURCE_TYPES[dataset].native_classes, key=snake_case)
    return tuple(f"label_{unified_class(name)}" for name in names)


class SeedCompatibleDataset(_DatasetBase):
    """Samples in the seed library's contract, so its users switch by changing the import
    and the constructor (docs/exports.md has the side-by-side table).

    One dataset (and optionally splits) of the manifest, with the seed's switches:
    `output_cls` adds `cls` — the dataset's own classes in the seed's order
    (`labels="native"`, NaN where not annotated) or the 21 unified ones (`labels="unified"`);
    `output_mask` adds `mask` (1×S×S in {0, 1}; all zeros for an image the dataset did not
    segment, as the seed does) for datasets that draw masks; `output_report` adds `report`;
    `output_bbox` adds `bbox` (list of `[y_min, y_max, x_min, x_max]` normalized in the
    resized frame) and `bbox_labels` (unified class names) for datasets with boxes. `img` is
    always there: 1×S×S in [-1, 1]. `dtype` is the torch dtype of the tensors (when torch
    is installed); `get_datasets()` returns the dataset itself, as the seed's does.
    """

    def __init__(
        self,
        manifest: str | Path | pd.DataFrame,
        dataset: str,
        splits: Filter = None,
        output_root: str | Path | None = None,
        output_cls: bool = False,
        output_mask: bool = False,
        output_report: bool = False,
        output_bbox: bool = False,
        labels: str = "native",
        dtype: Any = None,
    ) -> None:
        if dataset not in SOURCE_TYPES:
            raise ValueError(f"unknown dataset {dataset!r}; known: {sorted(SOURCE_TYPES)}")
        if labels not in ("native", "unified"):
            raise ValueError(f"labels must be 'native' or 'unified', got {labels!r}")
        source = SOURCE_TYPES[dataset]
        self.samples = ManifestDataset(manifest, output_root, datasets=dataset, splits=splits)
        columns = seed_label_columns(dataset) if labels == "native" else LABEL_COLUMNS
        if output_cls and not columns:
            raise ValueError(f"{dataset} has no structured labels: leave output_cls off")
        self._cls_positions = [LABEL_COLUMNS.index(column) for column in columns]
        self.outputs = {
            "cls": output_cls,
            "mask": output_mask and bool(source.mask_classes),
            "report": output_report,
            "bbox": output_bbox and source.has_boxes,
        }
        self.dtype = dtype if dtype is not None or torch is None else torch.float32

    def get_datasets(self) -> SeedCompatibleDataset:
        return self

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> dict[str, Any]:
        sample = self.samples[index]
        seed = {"img": sample["img"]}
        if self.outputs["cls"]:
            seed["cls"] = sample["cls"][self._cls_positions]
        if self.outputs["mask"]:
            seed["mask"] = sample["mask"]
        if self.outputs["report"]:
            seed["report"] = sample["report"]
        if self.outputs["bbox"]:
            seed["bbox"] = [[float(v) for v in box] for box in sample["bboxes"].tolist()]
            seed["bbox_labels"] = sample["bbox_labels"]
        if torch is not None:
            seed = {
                key: value.to(self.dtype) if isinstance(value, torch.Tensor) else value
                for key, value in seed.items()
            }
        return seed
