"""The protocol every dataset reader fulfils, and helpers shared by the readers."""

from __future__ import annotations

import gc
import json
import mmap
import os
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from ..processing.corpus.parents import parent_identity
from ..processing.jobs.mask_jobs import MaskJob, MaskTarget
from ..processing.storage import source_store
from ..processing.storage.source_store import FileState, SourcePath
from ..processing.tables.table_schemas import INDEX_COLUMNS, RAW_INDEX, Column, pandas_dtype
from ..vocabulary import FORMAT_BY_SUFFIX, LABEL_COLUMNS, STATUS_ERROR, STATUS_OK
from .counts import ExpectedCounts, load_expected_counts
from .errors import DatasetLayoutError, MetadataError
from .layouts import nearby
from .location import SourceLocation

_UNSAFE_KEY_CHARACTER = r"[^A-Za-z0-9._-]"
_TEXT_SLICE = 16384  # values per pyarrow conversion in text_column
# What pandas infers for Python strings: `str` with pandas 3, object before.
_INFERRED_STRING_DTYPE = pd.Series(np.array(["x"], dtype=object)).dtype


@dataclass(frozen=True)
class SplitTables:
    """What a reader returns for one split: the image index and the labels, row-aligned.

    Both end with `status` (`ok`/`error`) and `error` (null when ok): an entry the reader
    could not use is kept as an error row naming the file, the entry and the field.
    """

    index: pd.DataFrame
    labels: pd.DataFrame

    def __post_init__(self) -> None:
        # A reader that never finds a bad entry need not say so: every row is ok.
        if "status" not in self.index:
            clean = self.with_row_errors(RowErrors(len(self.index)))
            object.__setattr__(self, "index", clean.index)
            object.__setattr__(self, "labels", clean.labels)

    def with_row_errors(self, errors: RowErrors) -> SplitTables:
        status, error = errors.columns()
        index = self.index.assign(status=status, error=error)
        # In labels they go before the 21 unified columns, which stay last.
        labels = self.labels.drop(columns=["status", "error"], errors="ignore")
        position = next(
            (i for i, c in enumerate(labels.columns) if c in LABEL_COLUMNS), len(labels.columns)
        )
        labels.insert(position, "status", status.to_numpy())
        labels.insert(position + 1, "error", error.to_numpy())
        labels["status"] = labels["status"].astype("string")
        labels["error"] = labels["error"].astype("string")
        return SplitTables(index=index, labels=labels)


class RowErrors:
    """The first problem found for each row of a split (positions are row positions)."""

    def __init__(self, rows: int):
        self.rows = rows
        self._messages: dict[int, str] = {}

    def add(self, position: int, message: str) -> None:
        self._messages.setdefault(int(position), message)

    def update(self, messages: Mapping[int, str]) -> None:
        for position, message in messages.items():
            self.add(position, message)

    def __contains__(self, position: int) -> bool:
        return position in self._messages

    def __len__(self) -> int:
        return len(self._messages)

    def columns(self) -> tuple[pd.Series, pd.Series]:
        error = pd.Series(pd.NA, index=range(self.rows), dtype="string")
        status = pd.Series(STATUS_OK, index=range(self.rows), dtype="string")
        if self._messages:
            positions = list(self._messages)
            error.iloc[positions] = list(self._messages.values())
            status.iloc[positions] = STATUS_ERROR
        return status, error


def entry_error(path: SourcePath, where: str, field: str, problem: str) -> str:
    """The reason of an error row: the file, the entry, the field and what is wrong."""
    return f"{path}: {where}: field {field!r}: {problem}"


@dataclass(frozen=True)
class ReportLabelFile:
    """Report labels a dataset's own file gives: the file, and per image (`image_id`) its
    report_label_<name> columns (nullable Int8: 1, 0, -1, null)."""

    path: SourcePath
    labels: pd.DataFrame


@dataclass(frozen=True)
class SourceCard:
    """What a dataset card says of a source, as its dataset page states it."""

    title: str
    homepage: str
    licence: str
    citation: str


class DatasetSource(ABC):
    """One dataset on disk. Subclasses read its native files into the pipeline's tables."""

    key: ClassVar[str]
    splits: ClassVar[tuple[str, ...]]
    # Which SourceLocation field each environment variable sets.
    env_vars: ClassVar[Mapping[str, str]]
    layout: ClassVar[str]
    documented_counts: ClassVar[ExpectedCounts]
    # What a short count usually means for this dataset, keyed by metric.
    count_hints: ClassVar[Mapping[str, str]] = {}

    def __init__(self, location: SourceLocation, data_root: SourcePath):
        # Kept, not resolved: opening a reader does no I/O (a store may be unreachable).
        self._location = location
        self._data_root = data_root

    @property
    @abstractmethod
    def root(self) -> SourcePath:
        """The folder that may hold expected_counts.json for this dataset."""

    @abstractmethod
    def annotation_files(self, split: str) -> list[SourcePath]:
        """The metadata files whose content defines the split (hashed for data versions)."""

    @abstractmethod
    def image_dir(self, split: str) -> SourcePath:
        """The base folder that `image_path` values of the split are relative to."""

    @abstractmethod
    def read_split(self, split: str) -> SplitTables:
        """Read the native metadata of one split into the index and labels tables."""

    @abstractmethod
    def count_metrics(self, tables: SplitTables) -> dict[str, int]:
        """Observed figures for the split, under the metric names of ExpectedCounts."""

    # Whether the documentation implies no patient is in two splits (the check then blocks).
    patients_disjoint_across_splits: ClassVar[bool] = False
    # Unified classes this dataset draws masks for (empty: no masks), and whether it has boxes.
    mask_classes: ClassVar[tuple[str, ...]] = ()
    has_boxes: ClassVar[bool] = False
    # The dataset's own label classes, as it names them (the seed library's `cls` order is
    # these sorted by snake_case name); empty when it has no structured labels.
    native_classes: ClassVar[tuple[str, ...]] = ()
    # Columns of the dataset's own in `labels` that table_schemas.LABELS does not declare
    # (each an `extra`, null in other datasets' partitions): a new dataset declares its
    # native columns here, in its own module.
    label_extras: ClassVar[tuple[Column, ...]] = ()
    # Title, page, licence and citation for the corpus card.
    card: ClassVar[SourceCard | None] = None
    # Images the dataset's documentation says have a positive localizable label but no mask,
    # by native id (the part of `image_id` after `<dataset>/`): expected, not a defect.
    documented_unmasked_positives: ClassVar[frozenset[str]] = frozenset()

    # The module that writes a synthetic miniature of this dataset (its `ROOTS` and
    # `generate(out, scale, seed)`), or None: the demo and the test fixtures generate the
    # datasets that have one; a dataset without one is read from its download only.
    synthetic_generator: ClassVar[str | None] = None

    # The larger dataset this one was carved out of (a key of processing.parents.PARENTS).
    parent_dataset: ClassVar[str | None] = None

    def parent_identity(self, split: str, index: pd.DataFrame) -> pd.DataFrame:
        """Per index row, the image's identity in the parent (PARENT_IDENTITY columns, in
        index order): what the dataset's own metadata says; null where it says nothing."""
        return parent_identity(len(index), self.parent_dataset)

    def parent_files(self) -> list[SourcePath]:
        """The parent's files the identity is read from (named in the checks' metadata)."""
        return []

    def mask_jobs(
        self, split: str, index: pd.DataFrame, target_for: Callable[[str], MaskTarget]
    ) -> list[MaskJob]:
        """One job per image that writes its masks; `target_for(image_key)` says where."""
        return []

    # Where the `report_labels` of the dataset come from (a `report_label_source` value of
    # table_schemas): REPORT_RULES when its `labels` hold report text for the report labeler
    # to read, a file's source when `read_report_labels` reads them; None: it has none.
    report_label_source: ClassVar[str | None] = None

    def read_report_labels(self, split: str, index: pd.DataFrame) -> ReportLabelFile | None:
        """The report labels the dataset's own files give for the images of `index`; None
        when the file is not there (the partition then has no report labels)."""
        return None

    def localizable_images(self, index: pd.DataFrame) -> pd.Series:
        """Which images the dataset segments: they get masks, and an `any` mask that is
        all-zero when nothing was found. Other images' masks are not annotated."""
        return pd.Series(bool(self.mask_classes), index=index.index)

    def read_boxes(self, split: str) -> pd.DataFrame:
        """One row per box: image_id, box_index, label (unified), label_text, x, y, w, h
        (top-left + size in source pixels), frame_height, frame_width."""
        return pd.DataFrame(
            {
                "image_id": pd.Series(dtype="string"),
                "box_index": pd.Series(dtype="int64"),
                "label": pd.Series(dtype="string"),
                "label_text": pd.Series(dtype="string"),
                **{axis: pd.Series(dtype="float64") for axis in ("x", "y", "w", "h")},
                "frame_height": pd.Series(dtype="float64"),
                "frame_width": pd.Series(dtype="float64"),
            }
        )

    def image_states(self, split: str) -> dict[str, FileState]:
        """Images of the split's tree by name relative to image_dir, with what changes when
        one is replaced (fingerprinted for data versions; no pixels read)."""
        return source_store.tree_states(self.image_dir(split), FORMAT_BY_SUFFIX)

    def expected_counts(self) -> ExpectedCounts:
        return load_expected_counts(self.root, self.documented_counts)

    def layout_notes(self) -> list[str]:
        """Which folders were used where the download's layout differs from the canonical
        one (the readers accept the layouts real downloads unpack to; see layouts.py)."""
        return list(getattr(self, "_layout_notes", ()))

    def check_split(self, split: str) -> None:
        if split not in self.splits:
            raise ValueError(f"{self.key} has splits {self.splits}, not {split!r}")

    def require(self, path: SourcePath, what: str) -> SourcePath:
        """Return `path`, or raise the layout error that tells the user how to fix it."""
        if not source_store.exists(path):
            env_var = next(iter(self.env_vars.values()))
            raise DatasetLayoutError(
                self.key, path, env_var, self.layout, f"{what} not found", nearby(path)
            )
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
    for column in RAW_INDEX.columns:
        if column.required and column.name in frame:
            frame[column.name] = frame[column.name].astype(pandas_dtype(column.type))
    extras = [c for c in frame.columns if c not in INDEX_COLUMNS]
    return frame[list(INDEX_COLUMNS) + extras].reset_index(drop=True)


def image_keys(image_ids: pd.Series) -> pd.Series:
    """Filesystem-safe form of image ids: `/` becomes `__`, other unsafe characters `_`."""
    ids = arrow_strings(image_ids)
    # Split-and-join, not replace_substring: same result, several times faster
    # (`benchmarks/bench_checks.py --section index` measures this step).
    keys = pc.binary_join(pc.split_pattern(ids, "/"), pa.scalar("__", ids.type))
    # The regex rewrite scans every character of every id; a regex search is several times
    # faster, and ids seldom hold an unsafe character.
    if pc.any(pc.match_substring_regex(keys, _UNSAFE_KEY_CHARACTER)).as_py():
        keys = pc.replace_substring_regex(keys, _UNSAFE_KEY_CHARACTER, "_")
    return string_series(keys, image_ids.index)


def image_formats(paths: pd.Series) -> pd.Series:
    """`jpg`/`png`/`dcm` from the file extension; null for anything else."""
    # Only the last five characters can hold a known suffix: lowercasing those alone instead
    # of whole paths saves most of the time on long paths.
    tails = pc.utf8_lower(pc.utf8_slice_codeunits(arrow_strings(paths), -5))
    formats = pa.nulls(len(tails), pa.large_string())
    for suffix, name in FORMAT_BY_SUFFIX.items():
        formats = pc.if_else(pc.ends_with(tails, suffix), pa.scalar(name, formats.type), formats)
    return string_series(formats, paths.index)


def arrow_strings(values: pd.Series) -> pa.Array:
    """The values as a pyarrow string array; no copy when they are already Arrow strings."""
    return pa.array(values.astype("string"))


def string_series(values: pa.Array, index: pd.Index) -> pd.Series:
    """A Series of the "string" dtype over a pyarrow array; no copy when that dtype is
    Arrow-backed (the default with pandas 3)."""
    return pd.Series(pd.arrays.ArrowStringArray(values), index=index, copy=False).astype("string")


def label_frame(image_ids: pd.Series, native: Mapping[str, object]) -> pd.DataFrame:
    """Labels table: image_id, native columns, then all 21 unified columns as nullable Int8."""
    frame = pd.DataFrame({"image_id": _as_inferred_strings(image_ids), **native})
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


def _as_inferred_strings(values: pd.Series) -> object:
    """The column pandas infers from the values as Python objects (object when all are
    null), without creating 239k Python strings for ReXGradient train to get it."""
    if not values.notna().any():
        return values.to_numpy()
    return values.astype(_INFERRED_STRING_DTYPE).array


def text_column(values: Sequence[object]) -> pd.arrays.ArrowStringArray:
    """Nullable strings built in C by pyarrow: None and NaN become null.

    Converting a Python list element by element through pandas costs seconds on the
    hundreds of thousands of report strings of one ReXGradient split.
    """
    if len(values) <= _TEXT_SLICE:
        return pd.arrays.ArrowStringArray(_arrow_text(values))
    # Converted in slices, then concatenated once: pyarrow grows one buffer for the whole
    # list by reallocating, touching ~3x the final size in fresh memory (239k paths: 62 MiB
    # of text); slice buffers stay small and are reused.
    slices = [
        _arrow_text(values[start : start + _TEXT_SLICE])
        for start in range(0, len(values), _TEXT_SLICE)
    ]
    return pd.arrays.ArrowStringArray(pa.concat_arrays(slices))


def _arrow_text(values: Sequence[object]) -> pa.LargeStringArray:
    return pa.array(values, type=pa.large_string(), from_pandas=True)


def empty_phrase_lists(n: int) -> list[list[str]]:
    return [[] for _ in range(n)]


def confine_paths(
    relative: pd.Series, metadata_file: SourcePath, where: Callable[[int], str], field: str
) -> dict[int, str]:
    """Problems of metadata paths by row position: missing, holding a NUL byte, or leaving
    the base folder (absolute or with a `..` segment). `where(position)` names the entry."""
    text = relative.astype("string")
    paths = arrow_strings(text)
    escapes = pc.starts_with(paths, "/")
    # The exact `..` segment regex is costly on a split of long paths; a plain `..` search is
    # several times faster, so only files that have one pay for the regex.
    if pc.any(pc.match_substring_regex(paths, r"\.\.")).as_py():
        escapes = pc.or_(escapes, pc.match_substring_regex(paths, r"(?:^|/)\.\.(?:/|$)"))
    escapes = pc.or_(escapes, pc.match_substring(paths, "\0"))
    escapes = pc.or_(escapes, pc.equal(paths, ""))
    escapes = pc.fill_null(escapes, True).to_numpy(zero_copy_only=False)
    problems = {}
    for position in np.flatnonzero(escapes).tolist():
        value = text.iloc[position]
        if value is pd.NA or value == "":
            problem = "no image path"
        elif "\0" in value:
            problem = f"image path {value!r} holds a NUL byte"
        else:
            problem = f"image path {value!r} points outside the image folder"
        problems[position] = entry_error(metadata_file, where(position), field, problem)
    return problems


def require_columns(frame: pd.DataFrame, required: Iterable[str], path: SourcePath) -> None:
    missing = [column for column in required if column not in frame.columns]
    if missing:
        raise MetadataError(
            path,
            "header",
            f"missing required column(s) {', '.join(missing)} (found: {', '.join(frame.columns)})",
            "Use the file as downloaded; the reader needs these columns",
        )


def read_csv(
    path: SourcePath, dtype: Mapping[str, str] | None = None, columns: Sequence[str] = ()
) -> pd.DataFrame:
    """The CSV as a frame; a file of zero bytes is a table of `columns` without rows (an
    empty split, which its count check reports), not a parse error."""
    try:
        if not source_store.is_remote(path):
            return pd.read_csv(path, dtype=dtype, keep_default_na=True)
        # pandas infers compression from a file name, not from a handle.
        compression = "gzip" if path.name.lower().endswith(".gz") else None
        with source_store.open_source_file(path) as handle:
            return pd.read_csv(handle, dtype=dtype, keep_default_na=True, compression=compression)
    except pd.errors.EmptyDataError:
        return pd.DataFrame({name: pd.Series(dtype=(dtype or {}).get(name)) for name in columns})
    except (pd.errors.ParserError, UnicodeDecodeError) as exc:
        raise MetadataError(
            path, "parsing", f"not a readable CSV ({exc})", "Re-download the file"
        ) from exc


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


@contextmanager
def arrow_system_allocator() -> Iterator[None]:
    """Allocate Arrow memory with the system allocator (malloc) instead of the default pool.

    A ReXGradient split builds hundreds of MiB of Arrow strings, in buffers that grow as they
    are filled. With the default pool (mimalloc) much of that time went to the kernel
    faulting fresh memory in: on the 2-core benchmark VM the raw_index + labels step took
    ~4.0 s (1.5 s of it system time) against ~3.4 s (0.9 s) with this (medians of 4 runs).

    The default pool is process-wide state, so this suits a step that runs alone in its
    process, as Dagster runs steps. The system pool lives as long as the process: buffers
    allocated here may outlive the block.
    """
    previous = pa.default_memory_pool()
    pa.set_memory_pool(pa.system_memory_pool())
    try:
        yield
    finally:
        pa.set_memory_pool(previous)


def read_json_entries(
    path: SourcePath, container: type[list] | type[dict], expected: str, download: str
) -> list | dict:
    """Parse an annotation file whose top level is a `container` of entries (bare NaN tokens
    allowed, as in ReXGradient), naming line and column on error.

    A file without entries (zero bytes, blank, `[]` or `{}`) is an empty `container`: an
    empty split with typed tables, which its count check reports with expected vs found.
    Any other top level fails naming what was `expected` and the file of the `download` to
    use instead.

    The standard parser is used on purpose: on these string-heavy files it measured faster
    than orjson, and it accepts NaN without a rewriting pass.
    """
    try:
        text = _json_text(path)
        if not text or text.isspace():
            return container()
        data = json.loads(text)
    except RecursionError as exc:
        raise MetadataError(
            path,
            "parsing",
            "JSON nested too deeply to read (arrays or objects inside each other thousands "
            "of levels deep)",
            "The file is corrupt or not the dataset's metadata; re-download it",
        ) from exc
    except json.JSONDecodeError as exc:
        raise MetadataError(
            path,
            f"line {exc.lineno} column {exc.colno}",
            f"malformed JSON ({exc.msg})",
            "The file is truncated or edited; re-download it",
        ) from exc
    except UnicodeDecodeError as exc:
        raise MetadataError(
            path, f"byte {exc.start}", "not UTF-8 JSON", "Re-download the file"
        ) from exc
    if data in ([], {}):
        return container()
    if not isinstance(data, container):
        raise MetadataError(path, "top level", f"expected {expected}", f"Use {download}")
    return data


def fail_at_first_bad_row(
    bad: np.ndarray | pd.Series, path: SourcePath, problem: Callable[[int], str], fix: str
) -> None:
    """Fail naming the CSV line of the first row where `bad` holds (line 1 is the header)
    and that row's `problem` (given its position); nothing when no row is bad."""
    positions = np.flatnonzero(np.asarray(bad, dtype=bool))
    if len(positions):
        row = int(positions[0])
        raise MetadataError(path, f"row {row + 2}", problem(row), fix)


def identity_counts(index: pd.DataFrame) -> dict[str, int]:
    """The counts every dataset with patient and study ids documents: images, patients and
    studies of a split's index."""
    return {
        "images": len(index),
        "patients": int(index["patient_id"].nunique()),
        "studies": int(index["study_id"].nunique()),
    }


def _json_text(path: SourcePath) -> str:
    """The file decoded as json.load decodes it (encoding detected, BOM dropped).

    A local file is decoded straight from a memory map: reading the bytes first costs a copy
    of the whole file, ~0.1 s for the 179 MiB ReXGradient train JSON. An object is fetched
    in one request.
    """
    if source_store.is_remote(path):
        data = source_store.read_source_bytes(path)
        return str(data, json.detect_encoding(data[:4]), "surrogatepass")
    with open(path, "rb") as handle:
        if os.fstat(handle.fileno()).st_size == 0:
            return ""  # an empty file cannot be mapped (and holds no entries)
        with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
            return str(data, json.detect_encoding(data[:4]), "surrogatepass")


def split_named_in(path: SourcePath, splits: Sequence[str]) -> str | None:
    """The split a file or folder name starts with (`test` in `test_labels.csv`), if any."""
    match = re.match(r"(train|valid|val|test)(?:_|$)", path.name)
    if match is None:
        return None
    split = "val" if match.group(1) == "valid" else match.group(1)
    return split if split in splits else None
