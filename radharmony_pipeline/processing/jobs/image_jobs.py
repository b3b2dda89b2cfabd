"""Per-image work of the `images` stage: decode, resize through a recorded geometry, write.

Each job writes the resized image (and its resized union mask) as PNGs tagged with a key of
their inputs and returns its pixels. A job whose outputs carry the current key re-uses them:
it reads the small resized PNG instead of decoding the source again. The partition's packed
array is assembled in a local scratch file and published once: the local (time-limited) pool
writes into it directly, Dask chunks send their pixels back as shards beside the array, so
no memory map is shared between machines.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Generic, Self, TypeVar, cast

import numpy as np
import pandas as pd
from PIL import Image

from radharmony_pipeline.processing.annotations.masks import (
    mask_input_key,
    mask_png_bytes,
    read_mask_png,
    write_mask_png,
)
from radharmony_pipeline.processing.execution.cluster import (
    DaskCluster,
    Executor,
    LocalPool,
    apply_to_chunk,
    apply_to_chunk_with_time_limit,
    map_on_dask,
    map_per_image,
)
from radharmony_pipeline.processing.execution.parallel import (
    Progress,
    default_chunk_size,
    map_in_chunks,
    map_on_file_system,
    map_with_time_limit,
    split_into_chunks,
)
from radharmony_pipeline.processing.execution.supervised import TimeLimit
from radharmony_pipeline.processing.imaging.decode import DecodeError, decode_grayscale
from radharmony_pipeline.processing.imaging.geometry import (
    GEOMETRIES,
    ResizeGeometry,
    resize_image,
    resize_mask,
)
from radharmony_pipeline.processing.imaging.image_files import ConfinedSource, confined_source
from radharmony_pipeline.processing.imaging.perceptual_hash import perceptual_hash, pixels_sha256
from radharmony_pipeline.processing.imaging.tagged_png import (
    INPUT_KEY_TAG,
    png_problem,
    png_tags,
    publish_tagged_png,
    read_leading_tags,
    stored_input_key,
)
from radharmony_pipeline.processing.storage.atomic import (
    release_temporaries,
    temporary_sibling,
)
from radharmony_pipeline.processing.storage.header_cache import (
    HeaderRecord,
    output_state,
    read_header_records,
    write_header_records,
)
from radharmony_pipeline.processing.storage.output_layout import packed_keys
from radharmony_pipeline.processing.storage.packed_journal import (
    RowPatch,
    patch_rows,
    replay_interrupted_patch,
    write_keys,
)
from radharmony_pipeline.processing.storage.packed_rows import (
    PackedRowReader,
    PackedRowWriter,
    claim_interrupted_build,
    read_layout,
    sync_file,
    sync_folder,
)
from radharmony_pipeline.processing.storage.source_store import (
    FileState,
    NotARegularFile,
    is_remote,
)
from radharmony_pipeline.processing.storage.store import (
    allocate_array,
    file_size,
    is_local,
    local_scratch_file,
    open_for_reading,
    publish,
    publish_file,
    read_bytes,
    remove,
    remove_orphaned_siblings,
    single_put_state,
)
from radharmony_pipeline.processing.tables.table_schemas import (
    IMAGES,
    WorkingField,
    row_type,
    rows_frame,
)
from radharmony_pipeline.vocabulary import STATUS_ERROR, STATUS_OK

# Bumped when decoding or resizing changes, so every image is redone once.
# 2: perceptual hash and pixel digest (issue 11). 3: PNG and DICOM pixels reduced by a whole
# factor before windowing, JPEG 2000 decoded at a resolution level (issue 23): within one grey
# level of 2 except where a window clips or a wavelet level replaces the area mean.
# 4: 16-bit PNG and DICOM sides without a common factor reduced too, their last block
# narrower (issue 23): up to 2 grey levels from 3 in one or two pixels per image; the output
# PNGs written with the Average filter and ISA-L deflate (same pixels, other bytes).
IMAGE_CODE_VERSION = "4"
# At most this many images per Dask chunk (one shard of ~12 MB at S=224), so that a large
# partition (ReXGradient train: 238,968 images) is shared by many workers.
MAX_IMAGES_PER_CHUNK = 256


# Reported beside each row and dropped before the table is written. `decoded`: whether the
# source was decoded (else re-used), for the step's metadata; `input_key`: the key its
# outputs carry (None when it could not be computed), recorded for the next run's check, so
# that a first build takes the keys from its workers instead of computing them beforehand.
IMAGE_WORKING_FIELDS = (
    WorkingField("decoded", bool, False),
    WorkingField("input_key", object, None),
)
ImageRow = row_type(IMAGES, "ImageRow", __name__, IMAGE_WORKING_FIELDS)
# The row's values that its image PNG's header holds (the rest come from the job), each with
# how it is read from its text tag; the fingerprints are missing from the first versions' PNGs.
HEADER_VALUES: dict[str, Callable[[str], Any]] = {
    "orig_height": int,
    "orig_width": int,
    "scale": float,
    "pad_top": int,
    "pad_left": int,
    "source_sha256": str,
}
OPTIONAL_HEADER_VALUES = ("perceptual_hash", "pixels_sha256")
HEADER_VALUE_NAMES = (*HEADER_VALUES, *OPTIONAL_HEADER_VALUES)


def header_values(tags: Mapping[str, str]) -> dict[str, Any]:
    """The row's values from its image PNG's tags (KeyError, ValueError: one is unusable)."""
    values = {name: read(tags[name]) for name, read in HEADER_VALUES.items()}
    return values | {name: tags.get(name) for name in OPTIONAL_HEADER_VALUES}


@dataclass(frozen=True)
class UnionMask:
    """An image's union mask PNG as read once, for both its input key and its pixels (each
    read is a request on an object store): its bytes, or why they could not be read."""

    path: Any
    content: bytes | None
    error: Exception | None = None

    @classmethod
    def read(cls, path: Any) -> UnionMask:
        """The mask at `path`; a missing or unreadable one is kept as its error, which its
        pixels raise (its key is then none, as stored_input_key gives for it)."""
        try:
            return cls(path, read_bytes(path))
        except (OSError, ValueError) as error:  # ValueError: a NUL byte in the path
            return cls(path, None, error)

    def key(self) -> str | None:
        """The input key the mask was written with (None: unreadable, damaged or untagged)."""
        return None if self.content is None else png_tags(self.content).get(INPUT_KEY_TAG)

    def pixels(self) -> np.ndarray:
        """The mask as uint8 0/1 (read_mask_png); the read's error if it failed."""
        if self.content is None:
            raise cast(Exception, self.error)
        return read_mask_png(self.path, self.content)


@dataclass(frozen=True)
class ImageJob:
    image_id: str
    source_file: Path
    union_mask_file: Any | None  # on the output root: a Path or a UPath
    output_root: Any
    image_relative: str
    mask_relative: str | None
    size: int
    resize: str  # a resize mode of geometry.GEOMETRIES: "letterbox" or "squash"
    row: int
    # The folder the source must stay inside (resolved), and the raw_index error of an image
    # whose metadata entry is unusable: then nothing is read and the row carries that error.
    source_root: Path | None = None
    index_error: str | None = None
    # The source's state from one listing of its folder, taken by the caller on an object
    # store where asking each object is a request per image; None: ask the file itself.
    source_state: FileState | None = None
    # The row of the array being assembled that the pixels go to, when it is not `row`: a
    # patch assembles the changed images only, one after the other.
    scratch_row: int | None = None
    # The states of its image and mask PNGs (None inside: not there) from one listing of the
    # partition's image folder (store.object_states), taken by the caller on S3, where looking
    # at each object is a request per image; None: look at the files themselves.
    listed_states: tuple[str | None, str | None] | None = None

    @property
    def array_row(self) -> int:
        """The row of the array being assembled that this image's pixels go to."""
        return self.row if self.scratch_row is None else self.scratch_row

    def source(self) -> contextlib.AbstractContextManager[ConfinedSource]:
        """The source confined to its folder, with its state, held while the block runs."""
        return confined_source(self.source_file, self.source_root, self.source_state)

    def input_key(self) -> str:
        """Source fingerprint (size + mtime, or + ETag on a store), union-mask key and
        parameters."""
        return self.key_and_union()[0]

    def key_and_union(self) -> tuple[str, UnionMask | None]:
        """The input key, and the union mask as read for it (None: the image has none)."""
        with self.source() as source:
            union = self.union_mask()
            return self.key_for(source.state, union), union

    def union_mask(self) -> UnionMask | None:
        """Its union mask, read (None: the image has none)."""
        return UnionMask.read(self.union_mask_file) if self.union_mask_file else None

    def key_for(self, state: FileState, union: UnionMask | None = None) -> str:
        """The input key of outputs made from the source in `state`; `union`: its union
        mask as already read (else it is read here, when the image has one)."""
        size, version = state
        if union is None:
            union = self.union_mask()
        mask_key = union.key() if union is not None else ""
        return mask_input_key(
            IMAGE_CODE_VERSION,
            f"{size}:{version}",
            mask_key or "",
            str(self.size),
            # Spelled as earlier versions wrote it (the geometry function's name), so that
            # existing outputs keep their keys and are not decoded again.
            f"{self.resize}_geometry",
        )

    def run(self) -> tuple[ImageRow, np.ndarray | None]:
        """The row and the pixels to pack: re-used from outputs that carry the current input
        key (a stat, a PNG header and a small PNG decode), else decoded and written. Errors
        become rows (without pixels). The source is confined once and held from its state
        to its read."""
        if self.index_error is not None:
            return self._error_row(self.index_error), None
        key = None
        try:
            with self.source() as source:
                # Read once for its key and, when the image is decoded, its pixels.
                union = self.union_mask()
                key = self.key_for(source.state, union)
                return self._reuse(key) or self._process(key, source, union)
        except (DecodeError, OSError, ValueError) as exc:  # ValueError: a NUL byte in a path
            return self._error_row(str(exc), key), None

    def current_row(
        self, key: str, record: HeaderRecord | None = None, union: UnionMask | None = None
    ) -> tuple[ImageRow, HeaderRecord | None] | None:
        """The row, and what it took from the outputs' headers, when they carry `key`: from
        `record` while the local files are in the state it recorded (a stat each), else from
        the headers (the first KB of each file read; pixels untouched). None: not current.
        On object storage nothing is recorded (a stat is a request there as a head is); an
        output that the step's listing did not find is missing without a request, and
        `union` (the union mask as read for `key`) can spare the mask's (_mask_is_current)."""
        if self._listed_absent(self.image_relative) or self._listed_absent(self.mask_relative):
            return None
        try:
            states = self.output_states() if is_local(self.output_root) else None
        except OSError:  # an output is missing: the image is redone
            return None
        if (
            record is not None
            and states is not None
            and record.holds(self.image_relative, key, states)
        ):
            return self._row(record.values, key, decoded=False), record
        tags = read_leading_tags(self.output_file(self.image_relative))
        if tags.get(INPUT_KEY_TAG) != key:
            return None
        try:
            values = header_values(tags)
        except (KeyError, ValueError):  # a tag missing or unreadable: the image is redone
            return None
        if not self._mask_is_current(key, values, union):
            return None
        found = None if states is None else self.header_record(key, states, values)
        return self._row(values, key, decoded=False), found

    def output_file(self, relative: str) -> Any:
        """The output at `relative` under the output root. Joined as text on a local root:
        this runs for every image of every run, and a Path costs more to build than the
        stat or read it is for."""
        if is_local(self.output_root):
            return os.path.join(os.fspath(self.output_root), relative)
        return self.output_root / relative

    def _listed_absent(self, relative: str | None) -> bool:
        """Whether the step's listing found no output at `relative` (False: present, or
        no listing was taken)."""
        if self.listed_states is None or relative is None:
            return False
        image_state, mask_state = self.listed_states
        return (image_state if relative == self.image_relative else mask_state) is None

    def output_states(self) -> tuple[str, str | None]:
        """The states of the local image PNG and of its mask PNG (None: it has none)."""
        mask = self.mask_relative
        return (
            output_state(self.output_file(self.image_relative)),
            None if mask is None else output_state(self.output_file(mask)),
        )

    def header_record(
        self, key: str, states: tuple[str, str | None], values: Mapping[str, Any]
    ) -> HeaderRecord:
        """What the row takes from its outputs written with `key`, with their states."""
        return HeaderRecord(self.image_relative, key, states[0], states[1], values)

    def held_row(self, array: PackedRowReader) -> ImageRow | None:
        """The current row (current_row) of an image whose pixels row `array_row` of `array`
        already holds, as a killed build left them (checked against the digest in the PNG's
        header): nothing decoded or written. None: the job runs."""
        if self.index_error is not None:
            return None
        try:
            found = self.current_row(self.input_key())
            row = self.array_row
            if found is None or found[0].pixels_sha256 != pixels_sha256(array.read(row, row + 1)):
                return None
            return found[0]
        except (OSError, ValueError):  # the job runs and names the problem
            return None

    def _mask_is_current(
        self, key: str, values: Mapping[str, Any] | None = None, union: UnionMask | None = None
    ) -> bool:
        """Whether its mask PNG carries `key`: read, unless the step's listing settles it
        (_listed_mask_matches, given the image's header `values` and its `union` mask)."""
        if self.mask_relative is None:
            return True
        if self._listed_absent(self.mask_relative):
            return False
        if (
            values is not None
            and union is not None
            and self._listed_mask_matches(key, values, union)
        ):
            return True
        return stored_input_key(self.output_file(self.mask_relative)) == key

    def _listed_mask_matches(self, key: str, values: Mapping[str, Any], union: UnionMask) -> bool:
        """Whether the listed mask object holds the very bytes this job writes for `key`:
        the union mask resized through the geometry its image's header gives. Then it
        carries `key`, and the request that would read it is spared (on a re-run, one of
        three per masked image). The comparison is with the listing's state, whose ETag is
        the MD5 of the bytes of an object published by one PUT; where a store's ETags are
        not (encryption with KMS keys), nothing matches and the mask is read instead."""
        if self.listed_states is None or self.listed_states[1] is None or union.content is None:
            return False
        try:
            geometry = GEOMETRIES[self.resize](
                values["orig_height"], values["orig_width"], self.size
            )
            expected = mask_png_bytes(resize_mask(union.pixels(), geometry), key)
        # A union mask Pillow cannot decode (SyntaxError: a broken chunk), or pixels the
        # geometry does not fit: the mask is read, as it was before the listing.
        except (OSError, SyntaxError, ValueError):
            return False
        return single_put_state(expected) == self.listed_states[1]

    def _process(
        self, key: str, source: ConfinedSource, union: UnionMask | None = None
    ) -> tuple[ImageRow, np.ndarray]:
        """Decode the source, resize and write the PNGs; the row and the pixels to pack.
        `union`: the union mask as read for the key (else read here)."""
        # Read once, for both decoding and the source hash.
        content = read_source(source)
        decoded = decode_grayscale(source.path, target_size=self.size, content=content)
        geometry = GEOMETRIES[self.resize](decoded.source_height, decoded.source_width, self.size)
        pixels = resize_image(decoded.pixels, geometry)
        if self.mask_relative is not None:
            if union is None:
                union = UnionMask.read(self.union_mask_file)
            mask = resize_mask(union.pixels(), geometry)
            # Not looked at first when the listing found none: on a store that is a 404.
            absent = self._listed_absent(self.mask_relative)
            write_mask_png(self.output_root / self.mask_relative, mask, key, absent=absent)
        values = {
            "orig_height": int(decoded.source_height),
            "orig_width": int(decoded.source_width),
            "scale": float(geometry.scale_x),
            "pad_top": int(geometry.pad_top),
            "pad_left": int(geometry.pad_left),
            "source_sha256": hashlib.sha256(content).hexdigest(),
            **content_fingerprints(pixels, geometry),
        }
        # Each value as its text tag (str() of a float is its shortest exact form), which
        # header_values reads back to the same values when the outputs are re-used.
        tags = {name: str(value) for name, value in values.items()}
        # Written whatever the file holds: _reuse found it missing, damaged or of other inputs.
        publish_tagged_png(self.output_root / self.image_relative, pixels, key, tags)
        return self._row(values, key, decoded=True), pixels

    def _reuse(self, key: str) -> tuple[ImageRow, np.ndarray] | None:
        """The row and pixels from the existing outputs when they carry `key`, else None
        (at once when the step's listing found no image PNG: nothing to read)."""
        if self._listed_absent(self.image_relative):
            return None
        try:
            content = read_bytes(self.output_file(self.image_relative))
            if png_problem(content) is not None:  # damaged since it was written
                return None
            with Image.open(io.BytesIO(content), formats=["PNG"]) as image:
                tags = {k: v for k, v in image.info.items() if isinstance(v, str)}
                if tags.get(INPUT_KEY_TAG) != key or not self._mask_is_current(key):
                    return None
                pixels = np.asarray(image)
            if tags.get("pixels_sha256", pixels_sha256(pixels)) != pixels_sha256(pixels):
                return None
            return self._row(header_values(tags), key, decoded=False), pixels
        except (KeyError, OSError, SyntaxError, ValueError):  # decoded and written again
            return None

    def _row(self, values: Mapping[str, Any], key: str, decoded: bool) -> ImageRow:
        return self._image_row(
            image_path=self.image_relative,
            mask_path=self.mask_relative,
            decoded=decoded,
            input_key=key,
            **values,
        )

    def _error_row(self, message: str, key: str | None = None) -> ImageRow:
        return self._image_row(status=STATUS_ERROR, error=message, input_key=key)

    def _image_row(self, **fields: Any) -> ImageRow:
        """A row of this image: its id, output side, array row and resize, and `fields`."""
        return ImageRow(
            image_id=self.image_id,
            size=self.size,
            tensor_index=self.row,
            resize=self.resize,
            **fields,
        )


def read_source(source: ConfinedSource) -> bytes:
    """The whole source file or object, one request (radiographs are a few MB; decoding
    needs all of it anyway). A problem with the store itself is not caught here: it stops
    the step (SourceStoreError) instead of becoming an error row for every image."""
    path = source.path
    try:
        return source.read()
    except FileNotFoundError as error:
        raise DecodeError(path, "file not found") from error
    except NotARegularFile as error:  # a FIFO, socket or device: never opened
        raise DecodeError(path, error.reason) from error
    except OSError as error:  # e.g. access denied to the file or object
        raise DecodeError(path, f"cannot read: {error}") from error


def content_fingerprints(pixels: np.ndarray, geometry: ResizeGeometry) -> dict[str, str]:
    """Perceptual hash of the image without its padding, and a digest of its pixels; kept in
    the PNG header with the input key, so they are recomputed only when the image is."""
    top, left = geometry.pad_top, geometry.pad_left
    content = pixels[top : top + geometry.resized_height, left : left + geometry.resized_width]
    return {"perceptual_hash": perceptual_hash(content), "pixels_sha256": pixels_sha256(pixels)}


def image_job_stopped(job: ImageJob, reason: str) -> tuple[ImageRow, None]:
    """What run_image_job gives for a job whose worker was stopped (time limit) or died: its
    error row and no pixels, once the temporary files that worker may have left are removed.
    This runs on the worker's host, which is the only place that can tell the writer is gone
    (a Dask worker's, on a cluster)."""
    with contextlib.suppress(OSError):  # best effort; the step's own clean-up comes later
        for relative in (job.image_relative, job.mask_relative):
            if relative is not None:
                remove_orphaned_siblings(job.output_root / relative)
    return job._error_row(f"{job.source_file}: {reason}"), None


def run_image_job(job: ImageJob) -> tuple[ImageRow, np.ndarray | None]:
    """Top-level (picklable) form of ImageJob.run for worker processes."""
    return job.run()


# How a runner uses the scratch array: writing rows (the pool) or reading them (held rows).
ScratchAccess = TypeVar("ScratchAccess", PackedRowWriter, PackedRowReader)


class _OnScratchArray(Generic[ScratchAccess]):
    """A picklable runner of image jobs over the local scratch array: the file is on this
    machine, so every worker process opens it once (an open file is not pickled) and reads
    or writes its rows in place (the page cache is shared)."""

    def __init__(self, scratch: Path) -> None:
        self.scratch = scratch
        self._array: ScratchAccess | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"scratch": self.scratch, "_array": None}

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        """Close the array where this process opened it (running the jobs itself)."""
        if self._array is not None:
            self._array.close()
            self._array = None

    def array(self) -> ScratchAccess:
        if self._array is None:
            self._array = self._open()
        return self._array

    def _open(self) -> ScratchAccess:
        raise NotImplementedError


class PackedRows(_OnScratchArray[PackedRowWriter]):
    """The local pool's job runner: each job's pixels go into row `job.array_row` of the
    scratch array, and it returns what run_image_job does, the pixels already packed (None),
    so that image_job_stopped bounds it as it bounds run_image_job (an image stopped by the
    time limit leaves its row zero)."""

    def _open(self) -> PackedRowWriter:
        return PackedRowWriter(self.scratch)

    def __call__(self, job: ImageJob) -> tuple[ImageRow, None]:
        row, pixels = job.run()
        if pixels is not None:
            self.array().write(job.array_row, pixels)
        return row, None


class HeldRows(_OnScratchArray[PackedRowReader]):
    """ImageJob.held_row of each job over the scratch array a killed build left."""

    def _open(self) -> PackedRowReader:
        return PackedRowReader(read_layout(self.scratch))

    def __call__(self, job: ImageJob) -> ImageRow | None:
        return job.held_row(self.array())


@dataclass(frozen=True)
class ImageChunk:
    """Consecutive jobs of one partition and the shard their pixels go to (Dask workers do
    not share this machine's files, so their pixels come back through the output root)."""

    jobs: tuple[ImageJob, ...]
    shard: Any  # a temporary file or object beside the packed array
    size: int
    # Bounds each job in the worker thread's supervised child; None runs them in the thread.
    time_limit: TimeLimit | None = None


def process_image_chunk(chunk: ImageChunk) -> list[ImageRow]:
    """Top-level (picklable) entry point for a Dask worker: every job of the chunk (re-used
    or processed), its pixels saved as one shard; rows in job order."""
    pixels = np.zeros((len(chunk.jobs), chunk.size, chunk.size), dtype=np.uint8)
    rows = []
    if chunk.time_limit is None:
        results = apply_to_chunk(run_image_job, chunk.jobs)
    else:
        results = apply_to_chunk_with_time_limit(run_image_job, chunk.time_limit, chunk.jobs)
    for position, (row, image) in enumerate(results):
        if image is not None:
            pixels[position] = image
        rows.append(row)
    publish(chunk.shard, lambda handle: np.save(handle, pixels, allow_pickle=False))
    return rows


@dataclass(frozen=True)
class PackedUpdate:
    """What build_packed_images did: the partition's rows, and how many rows of the packed
    array it wrote (all of them when assembled anew, the changed ones when patched in place,
    none when every row was current) and replayed from an interrupted patch's journal."""

    rows: list[ImageRow]
    rows_written: int
    rows_replayed: int = 0


@dataclass(frozen=True)
class JobRunner:
    """How the jobs that must run are run: on `executor` (the local pool or a Dask cluster),
    reporting to `on_progress`, each image bounded by `time_limit`."""

    executor: Executor
    on_progress: Progress | None = None
    time_limit: TimeLimit | None = None

    def run(
        self, jobs: Sequence[ImageJob], scratch: Path, packed: Any, size: int
    ) -> list[ImageRow]:
        """Run `jobs`, each one's pixels written into row `array_row` of the local `scratch`.
        Locally the jobs run in the supervised pool and write straight into the scratch file;
        on a Dask cluster chunks of jobs write shards that are copied into it one at a time."""
        if isinstance(self.executor, LocalPool):
            return _run_locally(
                jobs, scratch, self.executor.workers, self.on_progress, self.time_limit
            )
        chunk = default_chunk_size(len(jobs), self.executor.slots())
        chunks = _chunks(jobs, packed, size, chunk, self.time_limit)
        return _run_on_dask(chunks, scratch, self.executor, self.on_progress)


CurrentRow = tuple[ImageRow, HeaderRecord | None]


@dataclass(frozen=True)
class CurrentRows:
    """What look_up_current_rows found beside an array with the partition's N rows and its
    key record: every job's input key now (None: it cannot be computed), the key recorded for
    its row, and its current row with what it took from its outputs' headers (None: stale,
    the job must run)."""

    keys: list[str | None]
    recorded: Sequence[str | None]
    rows: list[ImageRow | None]
    records: list[HeaderRecord | None]

    @property
    def stale(self) -> list[int]:
        """The positions of the jobs that must run."""
        return [position for position, row in enumerate(self.rows) if row is None]


def update_packed_images(
    jobs: Sequence[ImageJob],
    packed: Any,
    size: int,
    executor: Executor,
    on_progress: Progress | None = None,
    time_limit: TimeLimit | None = None,
) -> PackedUpdate:
    """Rows of the partition's images and its packed N×S×S array at `packed` (a local
    Path or a UPath on object storage), computed on `executor`; what was written.

    A patch that a killed run left half-done is finished first (replay_journal). When the
    array has the partition's N rows and its key record (`<name>.keys.json`), a row whose
    image's input key is the recorded one and whose PNG header carries it is re-used from that
    header alone (look_up_current_rows: nothing decoded or read beyond it; locally not even the
    header while the PNGs are in the state header_cache recorded); only the other rows are
    run, and on a local array written in place under a journal (patch_in_place). Otherwise (a
    first build, images added or removed, another size, an array on object storage) the array
    is assembled in a local scratch file (current PNGs re-used, the rest decoded) and published
    once, then its keys recorded (rebuild_array). A local build that was killed left its
    scratch array: the next one takes it over, with every row that matches its current PNG's
    digest (resume_killed_build). Where a local array and one on object storage differ is
    writes_in_place's. `time_limit` bounds each image, in the local pool and on Dask alike.
    """
    runner = JobRunner(executor, on_progress, time_limit)
    replayed = replay_journal(packed)
    previous = _header_records(packed, len(jobs))
    found = look_up_current_rows(jobs, packed, size, previous, executor)
    if found is not None and (not found.stale or writes_in_place(packed)):
        rows, written = patch_in_place(jobs, found, packed, size, runner)
        _record_headers(jobs, rows, found.records, previous, packed)
        return PackedUpdate(rows, written, replayed)
    with local_scratch_file(packed, suffix=".npy") as scratch:
        held = resume_killed_build(jobs, packed, scratch, size, executor)
        rows = rebuild_array(jobs, packed, scratch, size, runner, held)
    _record_headers(jobs, rows, [None] * len(jobs), previous, packed)
    return PackedUpdate(rows, len(jobs), replayed)


def build_packed_images(
    jobs: Sequence[ImageJob],
    packed: Any,
    size: int,
    executor: Executor,
    on_progress: Progress | None = None,
    time_limit: TimeLimit | None = None,
) -> list[ImageRow]:
    """The rows of update_packed_images (the packed array built or brought up to date)."""
    return update_packed_images(jobs, packed, size, executor, on_progress, time_limit).rows


def writes_in_place(packed: Any) -> bool:
    """Whether the packed array is a local file, which the steps write in place: a few
    changed rows are patched into it under a journal (one that a killed patch left is
    replayed), it is assembled in a scratch file beside it (one that a killed build left is
    taken over), its renames are synced to disk, and a header record of its outputs' states
    is kept beside it (a stat each). An array on object storage has none of these: it is
    only ever replaced whole by one upload (a PUT is atomic), and a stat there costs a
    request as a header read does."""
    return is_local(packed)


def replay_journal(packed: Any) -> int:
    """Step `replay`: finish the patch that a killed run left half-done beside the local
    array (its journal, packed_journal.replay_interrupted_patch); the number of rows written
    again (0: no journal). Nothing on object storage, which is never patched in place."""
    return replay_interrupted_patch(packed) if writes_in_place(packed) else 0


def look_up_current_rows(
    jobs: Sequence[ImageJob],
    packed: Any,
    size: int,
    records: Sequence[HeaderRecord | None],
    executor: Executor,
) -> CurrentRows | None:
    """The current rows of `jobs` (key_and_current_row) when the array has their N rows of
    `size` and a key record of N keys; None when it has not (it is then assembled anew: a
    truncated or overwritten array is, whatever its key record says). `records`: the header
    record of each row (None: its headers are read)."""
    if not _has_size(packed, len(jobs), size):
        return None
    recorded = _recorded_keys(packed_keys(packed))
    if recorded is None or len(recorded) != len(jobs):
        return None
    looked = _keys_and_current_rows(jobs, recorded, records, packed, executor)
    return CurrentRows(
        keys=[key for key, _found in looked],
        recorded=recorded,
        rows=[None if found is None else found[0] for _key, found in looked],
        records=[None if found is None else found[1] for _key, found in looked],
    )


def patch_in_place(
    jobs: Sequence[ImageJob], found: CurrentRows, packed: Any, size: int, runner: JobRunner
) -> tuple[list[ImageRow], int]:
    """Step `patch`: run the jobs of `found.stale` (assembled one after the other in a
    scratch array of their own) and write their pixels into the local array in place, under
    its journal (packed_journal.patch_rows); every row and the number of rows written.
    Nothing runs and nothing is written when no row is stale.

    An image that fails again with an unchanged key is not written: its row was left zero
    when it failed before, as a fresh build leaves it."""
    stale = found.stale
    if not stale:
        return cast(list[ImageRow], list(found.rows)), 0
    changed = [replace(jobs[position], scratch_row=slot) for slot, position in enumerate(stale)]
    with local_scratch_file(packed, suffix=".npy") as scratch:
        allocate_array(scratch, packed, (len(changed), size, size))
        fresh = runner.run(changed, scratch, packed, size)
        pixels = np.load(scratch)
    slots = [
        slot
        for slot, (position, row) in enumerate(zip(stale, fresh, strict=True))
        if row.status == STATUS_OK or found.keys[position] != found.recorded[position]
    ]
    patch_rows(packed, RowPatch(np.asarray(stale, np.int64)[slots], pixels[slots], found.keys))
    return _merged(found.rows, stale, fresh), len(slots)


def resume_killed_build(
    jobs: Sequence[ImageJob], packed: Any, scratch: Path, size: int, executor: Executor
) -> list[ImageRow | None] | None:
    """Step `resume`: take over, as `scratch`, the scratch array that a killed build of the
    local `packed` left beside it (packed_rows.claim_interrupted_build), and the rows of it
    that are current (ImageJob.held_row: its pixels match its PNG's digest; None: the job
    runs). None when there is none to take over: always on object storage, whose array is
    assembled in this machine's temporary folder."""
    if not writes_in_place(packed):
        return None
    if not claim_interrupted_build(packed, scratch, (len(jobs), size, size)):
        return None
    return _held_rows(jobs, scratch, executor)


def rebuild_array(
    jobs: Sequence[ImageJob],
    packed: Any,
    scratch: Path,
    size: int,
    runner: JobRunner,
    held: Sequence[ImageRow | None] | None = None,
) -> list[ImageRow]:
    """Step `rebuild`: assemble the whole array in the local `scratch`, publish it as
    `packed` once, then record its keys; every row. The jobs whose rows are not `held` (by a
    build taken over, resume_killed_build) run, each writing its pixels into its row (a
    current PNG re-used, the rest decoded); with nothing held, `scratch` is first allocated
    zeroed and every job runs."""
    if held is None:
        allocate_array(scratch, packed, (len(jobs), size, size))
        held = [None] * len(jobs)
    to_run = [position for position, row in enumerate(held) if row is None]
    ran = runner.run([jobs[p] for p in to_run], scratch, packed, size)
    rows = _merged(held, to_run, ran)
    _publish_array(packed, scratch)
    # The keys the outputs were written with, as each job computed it before reading.
    write_keys(packed, [row.input_key for row in rows])
    return rows


def _publish_array(packed: Any, scratch: Path) -> None:
    """Publish the finished local `scratch` as `packed`: on a local file system its rows on
    disk before the rename and the rename on disk after it (a power cut leaves the old
    array or the whole new one under the name); on object storage one upload."""
    if writes_in_place(packed):
        sync_file(scratch)
    publish_file(packed, scratch)
    sync_folder(packed)


def _header_records(packed: Any, rows: int) -> list[HeaderRecord | None]:
    """The header record kept beside a local array (None for each row without one); none
    on object storage (see writes_in_place)."""
    if not writes_in_place(packed):
        return [None] * rows
    return read_header_records(packed, rows, HEADER_VALUE_NAMES)


def key_and_current_row(
    job_recorded: tuple[ImageJob, str | None, HeaderRecord | None],
) -> tuple[str | None, CurrentRow | None]:
    """The job's input key (None: it cannot be computed), and its current row
    (ImageJob.current_row) when that key is the one recorded for its packed row; None for a
    changed image, whose outputs are not looked at. Top-level (picklable) for workers."""
    job, recorded, record = job_recorded
    try:
        key, union = job.key_and_union()
    except (OSError, ValueError):  # ValueError: a NUL byte in the path
        return None, None
    if key != recorded:
        return key, None
    return key, job.current_row(key, record, union)


def _held_rows(
    jobs: Sequence[ImageJob], scratch: Path, executor: Executor
) -> list[ImageRow | None]:
    """ImageJob.held_row of every job over the array a killed build left, before the pool
    runs the rest: on the local pool's processes (the array is on this machine; beside a
    Dask cluster, in this process). A look (a source's state, a PNG's first KB, a row read
    and hashed) is mostly CPU on files the killed build left in the page cache, which
    processes share out where threads of one process trade the GIL at every call."""
    workers = executor.workers if isinstance(executor, LocalPool) else 1
    with HeldRows(scratch) as held:
        return map_in_chunks(held, jobs, workers)


def _merged(
    rows: Sequence[ImageRow | None], positions: Sequence[int], filled: Sequence[ImageRow]
) -> list[ImageRow]:
    """`rows` with the row at each of `positions` replaced by the next of `filled`."""
    merged = list(rows)
    for position, row in zip(positions, filled, strict=True):
        merged[position] = row
    return cast(list[ImageRow], merged)


def _record_headers(
    jobs: Sequence[ImageJob],
    rows: Sequence[ImageRow],
    known: Sequence[HeaderRecord | None],
    previous: Sequence[HeaderRecord | None],
    packed: Any,
) -> None:
    """Record what each good row took from its outputs' headers, for the next run's stats:
    `known` where the current rows were found, the files run now stat-ed (with the key their
    outputs were written with). The record is written again only when a row's differs from
    `previous` (an unchanged run writes none). Nothing is recorded on object storage
    (writes_in_place)."""
    if not writes_in_place(packed):
        return
    records = list(known)
    run_now = [
        position
        for position, (row, record) in enumerate(zip(rows, known, strict=True))
        if record is None and row.status == STATUS_OK and row.input_key is not None
    ]
    stated = map_on_file_system(_written_record, [(jobs[p], rows[p]) for p in run_now])
    for position, record in zip(run_now, stated, strict=True):
        records[position] = record
    if any(record is not before for record, before in zip(records, previous, strict=True)):
        write_header_records(packed, records, HEADER_VALUE_NAMES)


def _written_record(job_row: tuple[ImageJob, ImageRow]) -> HeaderRecord | None:
    """The record of a row whose outputs were just written or re-used (with its input key)."""
    job, row = job_row
    try:
        states = job.output_states()
    except OSError:  # removed since: nothing to record, the next run looks at it again
        return None
    values = {name: getattr(row, name) for name in HEADER_VALUE_NAMES}
    return job.header_record(row.input_key, states, values)


def _run_locally(
    jobs: Sequence[ImageJob],
    scratch: Path,
    workers: int,
    on_progress: Progress | None,
    time_limit: TimeLimit | None,
) -> list[ImageRow]:
    """Rows in job order; each worker writes its jobs' pixels straight into `scratch`."""
    with PackedRows(scratch) as runner:
        if time_limit is None:
            results = map_in_chunks(runner, jobs, workers, on_progress=on_progress)
        else:
            results = map_with_time_limit(runner, jobs, workers, time_limit, on_progress)
    return [row for row, _packed in results]


def _keys_and_current_rows(
    jobs: Sequence[ImageJob],
    recorded: Sequence[str | None],
    records: Sequence[HeaderRecord | None],
    packed: Any,
    executor: Executor,
) -> list[tuple[str | None, CurrentRow | None]]:
    """key_and_current_row for every job: one pass over the sources and their outputs."""
    items = list(zip(jobs, recorded, records, strict=True))
    sources_remote = any(is_remote(job.source_file) and not job.source_state for job in jobs)
    if writes_in_place(packed) and not sources_remote:
        # A local stat or header costs microseconds when cached, a disk read when not.
        return map_on_file_system(key_and_current_row, items)
    # On object storage every source state, union mask key (on the output root) and header
    # is a request: spread them over the workers.
    return map_per_image(key_and_current_row, items, executor)


def _run_on_dask(
    chunks: Sequence[ImageChunk],
    scratch: Path,
    cluster: DaskCluster,
    on_progress: Progress | None,
) -> list[ImageRow]:
    """Rows of every chunk in order, the shards copied into `scratch`; progress in images."""
    sizes = [len(chunk.jobs) for chunk in chunks]
    images = sum(sizes)

    def chunk_progress(done_chunks: int, _total: int) -> None:
        if on_progress is not None:
            on_progress(min(sum(sizes[:done_chunks]), images), images)

    try:
        results = map_on_dask(process_image_chunk, chunks, cluster.address, 1, chunk_progress)
        _assemble(chunks, scratch)  # each shard removed once copied
    except BaseException:
        for chunk in chunks:
            remove(chunk.shard)
        raise
    finally:
        # A worker may still publish its shard after a failure here (lost scheduler): the
        # next run's clean-up removes it, also when that run is in this process.
        release_temporaries(chunk.shard for chunk in chunks)
    return [row for rows in results for row in rows]


def _chunks(
    jobs: Sequence[ImageJob],
    packed: Any,
    size: int,
    per_chunk: int,
    time_limit: TimeLimit | None,
) -> list[ImageChunk]:
    per_chunk = max(1, min(per_chunk, MAX_IMAGES_PER_CHUNK))
    # Shards are named like every temporary file (owner pid@host), so the interrupted-run
    # clean-up of another run never removes the shards of this live one.
    return [
        ImageChunk(
            jobs=tuple(chunk),
            shard=temporary_sibling(packed.with_name(f"shard{number}-{packed.name}")),
            size=size,
            time_limit=time_limit,
        )
        for number, chunk in enumerate(split_into_chunks(jobs, per_chunk))
    ]


def _assemble(chunks: Sequence[ImageChunk], scratch: Path) -> None:
    """Copy the shards into the scratch array, one shard in memory at a time, each removed
    once copied: the shards and the scratch array never both hold the whole partition (at the
    real size each is 12 GB, on one machine's disk beside the bucket)."""
    start = 0
    with PackedRowWriter(scratch) as packed:
        for chunk in chunks:
            with open_for_reading(chunk.shard) as handle:
                shard = np.load(handle, allow_pickle=False)
            packed.write(start, shard)
            start += len(shard)
            remove(chunk.shard)


def _has_size(packed: Any, rows: int, size: int) -> bool:
    """Whether the packed array exists with the size of `rows` S×S images (a truncated or
    overwritten array is rebuilt, whatever its key record says)."""
    header = np.lib.format.header_data_from_array_1_0(np.zeros((0, 0, 0), np.uint8))
    header["shape"] = (rows, size, size)
    stream = io.BytesIO()
    np.lib.format.write_array_header_1_0(stream, header)
    expected = len(stream.getvalue()) + rows * size * size
    try:
        return file_size(packed) == expected
    except FileNotFoundError:
        return False


def _recorded_keys(path: Any) -> list | None:
    try:
        with open_for_reading(path) as handle:
            return json.loads(handle.read())
    except (OSError, ValueError):
        return None


def image_table(rows: Sequence[ImageRow]) -> pd.DataFrame:
    """The `images` table (see table_schemas.py); `decoded` says whether the source was decoded."""
    return rows_frame(rows, ImageRow, IMAGES)
