"""The protocol every dataset reader fulfils, and helpers shared by the readers."""

from __future__ import annotations

import gc
import json
import os
import re
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np
import pandas as pd
import pyarrow as pa

from ..processing.vocabulary import LABEL_COLUMNS
from .counts import ExpectedCounts, load_expected_counts
from .errors import DatasetLayoutError, MetadataError

INDEX_COLUMNS: tuple[str, ...] = (
    "image_id",
    "image_key",
    "dataset",
    "split",
    "patient_id",
    "study_id",
    "image_path",
    "image_format",
    "view_position",
    "view_position_raw",
    "source_height",
    "source_width",
)

IMAGE_FORMATS = {".jpg": "jpg", ".jpeg": "jpg", ".png": "png", ".dcm": "dcm"}


@dataclass(frozen=True)
class SplitTables:
    """What a reader returns for one split: the image index and the labels, row-aligned."""

    index: pd.DataFrame
    labels: pd.DataFrame


class DatasetSource(ABC):
    """One dataset on disk. Subclasses read its native files into the pipeline's tables."""

    key: ClassVar[str]
    splits: ClassVar[tuple[str, ...]]
    # Which SourceLocation field each environment variable sets (DESIGN §5).
    env_vars: ClassVar[Mapping[str, str]]
    layout: ClassVar[str]
    documented_counts: ClassVar[ExpectedCounts]
    # What a short count usually means for this dataset, keyed by metric.
    count_hints: ClassVar[Mapping[str, str]] = {}

    @property
    @abstractmethod
    def root(self) -> Path:
        """The folder that may hold expected_counts.json for this dataset."""

    @abstractmethod
    def annotation_files(self, split: str) -> list[Path]:
        """The metadata files whose content defines the split (hashed for data versions)."""

    @abstractmethod
    def image_dir(self, split: str) -> Path:
        """The base folder that `image_path` values of the split are relative to."""

    @abstractmethod
    def read_split(self, split: str) -> SplitTables:
        """Read the native metadata of one split into the index and labels tables."""

    @abstractmethod
    def count_metrics(self, tables: SplitTables) -> dict[str, int]:
        """Observed figures for the split, under the metric names of ExpectedCounts."""

    def image_files(self, split: str) -> Iterator[Path]:
        """Files of the split's image tree (fingerprinted for data versions)."""
        base = self.image_dir(split)
        for dirpath, _dirnames, filenames in os.walk(base):
            for name in filenames:
                if Path(name).suffix.lower() in IMAGE_FORMATS:
                    yield Path(dirpath) / name

    def expected_counts(self) -> ExpectedCounts:
        return load_expected_counts(self.root, self.documented_counts)

    def check_split(self, split: str) -> None:
        if split not in self.splits:
            raise ValueError(f"{self.key} has splits {self.splits}, not {split!r}")

    def require(self, path: Path, what: str) -> Path:
        """Return `path`, or raise the layout error that tells the user how to fix it."""
        if not path.exists():
            env_var = next(iter(self.env_vars.values()))
            raise DatasetLayoutError(self.key, path, env_var, self.layout, f"{what} not found")
        return path


def index_frame(dataset: str, split: str, columns: Mapping[str, object]) -> pd.DataFrame:
    """Assemble an index table in contract column order, with ids, keys and formats derived."""
    frame = pd.DataFrame(columns)
    native_id = frame.pop("native_id").astype("string")
    frame.insert(0, "image_id", dataset + "/" + native_id)
    frame.insert(1, "image_key", image_keys(frame["image_id"]))
    frame.insert(2, "dataset", dataset)
    frame.insert(3, "split", split)
    frame["image_format"] = image_formats(frame["image_path"])
    frame[["source_height", "source_width"]] = frame[["source_height", "source_width"]].astype(
        "Int64"
    )
    for column in ("dataset", "split", "patient_id", "study_id", "image_path",
                   "view_position", "view_position_raw"):
        frame[column] = frame[column].astype("string")
    extras = [c for c in frame.columns if c not in INDEX_COLUMNS]
    return frame[list(INDEX_COLUMNS) + extras].reset_index(drop=True)


def image_keys(image_ids: pd.Series) -> pd.Series:
    """Filesystem-safe form of image ids: `/` becomes `__`, other unsafe characters `_`."""
    return (
        image_ids.astype("string")
        .str.replace("/", "__", regex=False)
        .str.replace(r"[^A-Za-z0-9._-]", "_", regex=True)
    )


def image_formats(paths: pd.Series) -> pd.Series:
    """`jpg`/`png`/`dcm` from the file extension; null for anything else."""
    lower = paths.astype("string").str.lower()
    formats = pd.Series(pd.NA, index=paths.index, dtype="string")
    for suffix, name in IMAGE_FORMATS.items():
        formats = formats.mask(lower.str.endswith(suffix), name)
    return formats


def label_frame(image_ids: pd.Series, native: Mapping[str, object]) -> pd.DataFrame:
    """Labels table: image_id, native columns, then all 21 unified columns as nullable Int8."""
    frame = pd.DataFrame({"image_id": image_ids.to_numpy(), **native})
    for column in LABEL_COLUMNS:
        if column not in frame:
            # Not annotated by this dataset: null, never 0.
            frame[column] = pd.arrays.IntegerArray(
                np.zeros(len(frame), dtype=np.int8), np.ones(len(frame), dtype=bool)
            )
        else:
            frame[column] = frame[column].astype("Int8")
    native_columns = [c for c in frame.columns if c != "image_id" and c not in LABEL_COLUMNS]
    return frame[["image_id", *native_columns, *LABEL_COLUMNS]]


def text_column(values: Sequence[object]) -> pd.arrays.ArrowStringArray:
    """Nullable strings built in C by pyarrow: None and NaN become null.

    Converting a Python list element by element through pandas costs seconds on the
    hundreds of thousands of report strings of one ReXGradient split.
    """
    return pd.arrays.ArrowStringArray(pa.array(values, type=pa.large_string(), from_pandas=True))


def empty_phrase_lists(n: int) -> list[list[str]]:
    return [[] for _ in range(n)]


def confine_paths(relative: pd.Series, base: Path, metadata_file: Path, rows: Sequence) -> None:
    """Reject metadata paths that would leave the base folder (absolute or `..` escapes)."""
    text = relative.astype("string")
    escapes = text.str.startswith("/") | text.str.contains(r"(?:^|/)\.\.(?:/|$)", regex=True)
    escapes = escapes.fillna(True).to_numpy()
    if escapes.any():
        position = int(np.flatnonzero(escapes)[0])
        raise MetadataError(
            metadata_file,
            f"row {rows[position]}",
            f"image path {text.iloc[position]!r} points outside the image folder {base}",
            "Image paths must be relative and stay inside the image folder; fix the row",
        )


def require_columns(frame: pd.DataFrame, required: Iterable[str], path: Path) -> None:
    missing = [column for column in required if column not in frame.columns]
    if missing:
        raise MetadataError(
            path,
            "header",
            f"missing required column(s) {', '.join(missing)} (found: {', '.join(frame.columns)})",
            "Use the file as downloaded; the reader needs these columns",
        )


def read_csv(path: Path, dtype: Mapping[str, str] | None = None) -> pd.DataFrame:
    try:
        return pd.read_csv(path, dtype=dtype, keep_default_na=True)
    except (pd.errors.ParserError, UnicodeDecodeError) as exc:
        raise MetadataError(path, "parsing", f"not a readable CSV ({exc})",
                            "Re-download the file") from exc


@contextmanager
def garbage_collection_paused() -> Iterator[None]:
    """Parsing a large JSON allocates millions of objects that live on; each allocation burst
    triggers full collections that walk them all and free nothing. Pause, then restore."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def read_json(path: Path) -> object:
    """Parse JSON (bare NaN tokens allowed, as in ReXGradient), naming line and column on error.

    The standard parser is used on purpose: on these string-heavy files it measured faster
    than orjson, and it accepts NaN without a rewriting pass.
    """
    try:
        with open(path, "rb") as handle:
            return json.load(handle)
    except json.JSONDecodeError as exc:
        raise MetadataError(
            path,
            f"line {exc.lineno} column {exc.colno}",
            f"malformed JSON ({exc.msg})",
            "The file is truncated or edited; re-download it",
        ) from exc
    except UnicodeDecodeError as exc:
        raise MetadataError(path, f"byte {exc.start}", "not UTF-8 JSON",
                            "Re-download the file") from exc


def split_named_in(path: Path, splits: Sequence[str]) -> str | None:
    """The split a file or folder name starts with (`test` in `test_labels.csv`), if any."""
    match = re.match(r"(train|valid|val|test)(?:_|$)", path.name)
    if match is None:
        return None
    split = "val" if match.group(1) == "valid" else match.group(1)
    return split if split in splits else None
