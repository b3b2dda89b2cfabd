"""The output root, a local folder or an object-store URL (`s3://bucket/prefix`), as one layer.

Local roots are plain `Path`s (atomic rename, memory maps); anything with a scheme is a
universal-pathlib `UPath` over fsspec. A `UPath` pickles as its URL and options only, so each
worker process (pool or Dask) creates its own filesystem client on first use — s3fs clients
must not cross a fork. `AWS_ENDPOINT_URL` selects an S3-compatible endpoint and the standard
AWS variables carry the credentials; botocore reads them, this module does not.

Every request to an object store made through this module (and source_store) is retried
under one `RetryPolicy` (retry_policy.py), carried in the path's options so that worker
processes apply the same one; the S3 client's own retries are switched off so attempts do not
multiply.

At hundreds of thousands of images, requests are what a run on a bucket costs, so each
operation here is as few as S3 allows: an output is published by one PUT (a file above
MULTIPART_THRESHOLD by a multipart upload in bounded parts, each part its own retried
request), an object read by one GET, its size looked up by one HEAD, a folder listed by one
LIST per 1,000 keys. A read never asks first whether the object exists: s3fs's whole-object
read would add a HEAD (and, for a missing key, a LIST to tell a folder from nothing) to
every GET.
"""

from __future__ import annotations

import contextlib
import errno
import fnmatch
import hashlib
import io
import itertools
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator
from glob import escape as glob_escape
from pathlib import Path
from typing import Any, BinaryIO, TypeGuard

import numpy as np
from upath import UPath

from radharmony_pipeline.internals import s3_path
from radharmony_pipeline.processing.storage.atomic import (
    TEMP_MARKER,
    temporary_sibling,
    write_atomically,
    writer_is_gone,
)
from radharmony_pipeline.processing.storage.retry_policy import (
    DEFAULT_RETRY_POLICY,
    RETRY_OPTION,
    RetryPolicy,
    is_local,
    with_retries,
)

OutputPath = Path | UPath
Writer = Callable[[BinaryIO], None]

# One attempt per request in the client: the retry policy does the retrying. A wrong or
# unreachable endpoint must fail an attempt within seconds, not botocore's default 60 s.
_CLIENT_CONFIG = {
    "connect_timeout": 5,
    "read_timeout": 60,
    "retries": {"total_max_attempts": 1, "mode": "standard"},
}

# Above this size a file is uploaded in parts of PART_BYTES (more when 10,000 parts would not
# hold it), read one at a time, so that a multi-GB packed array costs one part of memory, and
# a fault costs one part again rather than the whole upload. Below it, one PUT from memory.
MULTIPART_THRESHOLD = 64 * 2**20
PART_BYTES = 64 * 2**20
MAX_PARTS = 10_000  # S3's limit

# The local roots this process was given (output_path): a full or read-only volume is reported
# with the output root the failing file is under.
_LOCAL_OUTPUT_ROOTS: set[Path] = set()


def output_path(
    root: str | os.PathLike, retry_policy: RetryPolicy = DEFAULT_RETRY_POLICY
) -> OutputPath:
    """`root` as a Path (local folder or file:// URL) or a UPath (any other scheme) whose
    requests follow `retry_policy`."""
    text = str(root)
    if "://" not in text or text.startswith("file://"):
        local = Path(text.removeprefix("file://"))
        _LOCAL_OUTPUT_ROOTS.add(Path(os.path.abspath(local)))
        return local
    if not text.startswith(("s3://", "s3a://")):
        return UPath(text)
    # The path carries the policy among its options (RETRY_OPTION), so that it reaches every
    # process the path is sent to; the S3 client is not given it (internals.s3_path).
    return s3_path(text, _s3_options(retry_policy))


def _s3_options(retry_policy: RetryPolicy) -> dict[str, Any]:
    options: dict[str, Any] = {RETRY_OPTION: _policy_option(retry_policy)}
    options["config_kwargs"] = dict(_CLIENT_CONFIG)
    # No folder listings kept between requests: the pool's workers write outputs with
    # filesystems of their own, and a long-lived process (the next nightly observation) must
    # see today's objects. s3fs would answer a lookup from an earlier listing and report an
    # object written since as missing.
    options["use_listings_cache"] = False
    # No endpoint here: botocore (>= 1.31, below what s3fs needs) resolves AWS_ENDPOINT_URL_S3
    # and AWS_ENDPOINT_URL itself, in whichever process makes the request.
    return options


def _policy_option(policy: RetryPolicy) -> tuple[int, float, float]:
    return (policy.attempts, policy.first_backoff, policy.max_backoff)


def as_local_path(path: Any) -> Path:
    """A local output path as a Path; one already a Path is not parsed again (a deep path
    costs several microseconds to parse, and this runs for every image written)."""
    return path if isinstance(path, Path) and not isinstance(path, UPath) else Path(path)


def publish(path: OutputPath, write: Writer) -> None:
    """Write through `write(handle)` so no reader ever sees a partial file or object.

    Local: a temporary sibling renamed into place. Object stores: one PUT of the bytes
    (`write` runs once, into memory), retried under the retry policy. A PUT is atomic there: a
    reader sees the old object or the new one, and a body cut short by a lost connection is
    refused by the store (the request announces its length and carries its checksums:
    Content-Length, x-amz-content-sha256, x-amz-checksum-crc32), so no temporary key is needed.
    """
    buffer = io.BytesIO()
    write(buffer)
    publish_bytes(path, buffer.getvalue())


def publish_bytes(path: OutputPath, content: bytes) -> None:
    """Write `content` as publish() writes: no reader ever sees a partial file or object."""
    if is_local(path):
        local = as_local_path(path)
        with output_write_errors(local, len(content)):
            write_atomically(local, lambda temp: temp.write_bytes(content))
        return
    # One request, retried on its own: a fault costs this upload again.
    with_retries(path, "write the object", lambda: path.fs.pipe_file(path.path, content))


def holds_bytes(path: OutputPath, content: bytes) -> bool:
    """Whether the local file at `path` holds exactly `content` (an unchanged table is then
    left as it is, its modification time too, so what depends on its state sees no change).
    False on an object store: an identical upload keeps the object's ETag anyway, and reading
    the object back would cost as much as writing it."""
    if not is_local(path):
        return False
    try:
        with open(path, "rb") as handle:
            if os.fstat(handle.fileno()).st_size != len(content):
                return False
            return handle.read() == content
    except OSError:
        return False


def publish_file(path: OutputPath, local_file: Path) -> None:
    """Publish a finished local file at `path`: a rename locally; on an object store one PUT,
    or above MULTIPART_THRESHOLD a multipart upload in bounded parts (upload_in_parts), which
    the store shows only once it is complete."""
    if is_local(path):
        with output_write_errors(Path(path), 0):
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            os.replace(local_file, path)
        return
    if not _is_s3(path):  # another fsspec store: its own upload, retried whole
        with_retries(path, "write the object", lambda: path.fs.put_file(str(local_file), path.path))
    elif os.path.getsize(local_file) > MULTIPART_THRESHOLD:
        upload_in_parts(path, local_file)
    else:
        publish_bytes(path, Path(local_file).read_bytes())


def part_size(size: int, part_bytes: int | None = None) -> int:
    """Bytes per part of a `size`-byte multipart upload: `part_bytes` (PART_BYTES), or more
    when MAX_PARTS parts of it would not hold the file."""
    return max(part_bytes or PART_BYTES, -(-size // MAX_PARTS))


def upload_in_parts(path: UPath, local_file: Path, part_bytes: int | None = None) -> None:
    """Upload `local_file` to `path` as an S3 multipart upload: parts read one at a time (one
    part in memory), each part its own request under the retry policy, then one request that
    completes the upload; until then readers see the old object or none. On failure the
    upload is aborted (its parts deleted) and the error raised."""
    fs = path.fs
    bucket, key, _version = fs.split_path(path.path)
    size = os.path.getsize(local_file)
    started = with_retries(
        path,
        "start the upload",
        lambda: fs.call_s3("create_multipart_upload", Bucket=bucket, Key=key),
    )
    upload = {"Bucket": bucket, "Key": key, "UploadId": started["UploadId"]}
    try:
        parts = []
        chunk_bytes = part_size(size, part_bytes)
        with open(local_file, "rb") as handle:
            for number in itertools.count(1):
                chunk = handle.read(chunk_bytes)
                if not chunk:
                    break
                answer = with_retries(
                    path,
                    f"upload part {number} of the object",
                    lambda chunk=chunk, number=number: fs.call_s3(
                        "upload_part", PartNumber=number, Body=chunk, **upload
                    ),
                )
                parts.append({"PartNumber": number, "ETag": answer["ETag"]})
                del chunk, answer  # the part's bytes go before the next is read
        _complete_upload(path, upload, parts, size)
    except BaseException:
        # Best effort: a store that stays down keeps the parts until its own clean-up of
        # abandoned uploads; they are never visible as an object.
        with contextlib.suppress(Exception):
            fs.call_s3("abort_multipart_upload", **upload)
        raise


def _complete_upload(path: UPath, upload: dict[str, str], parts: list, size: int) -> None:
    """Complete the multipart upload. A retry after a completion whose answer was lost finds
    the upload gone (NoSuchUpload): the object then has the file's size, or the error
    stands."""
    fs = path.fs
    attempts = itertools.count(1)

    def complete() -> None:
        attempt = next(attempts)
        try:
            fs.call_s3("complete_multipart_upload", MultipartUpload={"Parts": parts}, **upload)
        except FileNotFoundError:
            if attempt == 1 or file_size(path) != size:
                raise

    with_retries(path, "complete the upload", complete)


def _is_s3(path: Any) -> bool:
    return getattr(path, "protocol", "") in ("s3", "s3a")


def read_bytes(path: OutputPath) -> bytes:
    """The whole file or object (one GET, retried; FileNotFoundError if absent)."""
    if is_local(path):
        with open(path, "rb") as handle:
            return handle.read()
    # One request: s3fs reads a whole object with several ranged requests at once, and asks
    # its size first (a HEAD, and for a missing key a LIST too) to decide whether to.
    options = {"max_concurrency": 1} if _is_s3(path) else {}
    return with_retries(path, "read the object", lambda: path.fs.cat_file(path.path, **options))


def read_head(path: OutputPath, size: int) -> bytes:
    """The first `size` bytes of the file or object (fewer if it is shorter; one request)."""
    if is_local(path):
        with open(path, "rb") as handle:
            return handle.read(size)
    return with_retries(
        path, "read the object's head", lambda: path.fs.cat_file(path.path, start=0, end=size)
    )


@contextlib.contextmanager
def open_for_reading(path: OutputPath) -> Iterator[BinaryIO]:
    """A binary handle on the file; an object is fetched whole first (one retried request),
    so a parser never sees a connection cut halfway through."""
    if is_local(path):
        with open(path, "rb") as handle:
            yield handle
        return
    with io.BytesIO(read_bytes(path)) as handle:
        yield handle


def file_size(path: OutputPath) -> int:
    """Bytes of a file or object (FileNotFoundError if absent): one HEAD on S3, where s3fs's
    size lookup adds a LIST for a missing key to tell a folder from nothing."""
    if is_local(path):
        return os.stat(path).st_size
    if not _is_s3(path):
        return with_retries(path, "look up the object", lambda: path.fs.size(path.path))
    fs = path.fs
    bucket, key, _version = fs.split_path(path.path)
    answer = with_retries(
        path, "look up the object", lambda: fs.call_s3("head_object", Bucket=bucket, Key=key)
    )
    return int(answer["ContentLength"])


def exists(path: OutputPath) -> bool:
    if is_local(path):
        return Path(path).exists()
    return with_retries(path, "look up the object", path.exists)


def remove(path: OutputPath) -> None:
    """Delete a file or object if it is there."""
    if is_local(path):
        Path(path).unlink(missing_ok=True)
        return
    with contextlib.suppress(FileNotFoundError):
        with_retries(path, "remove the object", lambda: path.fs.rm_file(path.path))


def glob(folder: OutputPath, pattern: str) -> list[OutputPath]:
    """The paths below `folder` matching `pattern` (one listing on a store, retried)."""
    if is_local(folder):
        return list(Path(folder).glob(pattern))
    return with_retries(folder, "list the folder", lambda: list(folder.glob(pattern)))


@contextlib.contextmanager
def local_scratch_file(path: OutputPath, suffix: str = "") -> Iterator[Path]:
    """A local file to assemble `path` in: its temporary sibling on a local root (so the
    final rename stays on one filesystem), else a file in the system's temp folder."""
    if is_local(path):
        with output_write_errors(Path(path), 0):
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        scratch = temporary_sibling(Path(path))
    else:
        handle, name = tempfile.mkstemp(prefix=TEMP_MARKER, suffix=suffix)
        os.close(handle)
        scratch = Path(name)
    try:
        yield scratch
    finally:
        scratch.unlink(missing_ok=True)


def allocate_array(scratch: Path, final: OutputPath, shape: tuple[int, ...]) -> None:
    """Create `scratch` as a zeroed uint8 .npy of `shape` with all its bytes allocated now,
    so that a full volume is an error here rather than a crash (SIGBUS) when a memory map
    writes into a hole later. `final` is what the array will be published as."""
    target = Path(final) if is_local(final) else scratch
    size = int(np.prod(shape))
    with output_write_errors(target, size):
        np.lib.format.open_memmap(scratch, mode="w+", dtype=np.uint8, shape=shape).flush()
        with open(scratch, "r+b") as handle:
            os.posix_fallocate(handle.fileno(), 0, os.fstat(handle.fileno()).st_size)


class OutputWriteError(RuntimeError):
    """The output volume takes no more writes (full, or read-only). Not an OSError, so that
    it stops the step instead of becoming an error row per image.

    The message is composed where it is shown: an error raised in a worker process reaches
    the step's process, which knows the output root the file is under."""

    def __init__(self, path: Path, volume: Path, needed: int, free: int, read_only: bool):
        super().__init__(path, volume, needed, free, read_only)
        self.path, self.volume, self.needed, self.free = path, volume, needed, free
        self.read_only = read_only

    def __str__(self) -> str:
        root = _output_root_of(self.path)
        where = f" under the output root {root}" if root is not None else ""
        if self.read_only:
            problem = f"the output root's volume (mounted at {self.volume}) is read-only"
            fix = "Make it writable (or choose another output root)"
        else:
            problem = (
                f"no space left on the output root's volume (mounted at {self.volume}): "
                f"{self.needed:,} bytes needed, {self.free:,} bytes free"
            )
            fix = "Free space there (or choose another output root)"
        return (
            f"cannot write {self.path}{where}: {problem}. {fix}, then run the same command "
            "again: finished outputs are kept and nothing partial was left"
        )


_VOLUME_ERRORS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS}


@contextlib.contextmanager
def output_write_errors(path: Path, needed: int) -> Iterator[None]:
    """A full or read-only volume under a local write of `needed` bytes at `path` becomes
    one OutputWriteError naming the output root, its volume, the bytes needed and the free
    space."""
    try:
        yield
    except OSError as error:
        if error.errno not in _VOLUME_ERRORS:
            raise
        volume = _mount_point(path)
        free = shutil.disk_usage(volume).free
        read_only = error.errno == errno.EROFS
        raise OutputWriteError(Path(path), volume, needed, free, read_only) from error


def _output_root_of(path: Path) -> Path | None:
    """The innermost output root of this process that holds `path`."""
    absolute = Path(os.path.abspath(path))
    holding = [root for root in _LOCAL_OUTPUT_ROOTS if absolute.is_relative_to(root)]
    return max(holding, key=lambda root: len(root.parts), default=None)


def _mount_point(path: Path) -> Path:
    path = Path(os.path.abspath(path))
    while not path.exists():
        path = path.parent
    while not os.path.ismount(path):
        path = path.parent
    return path


def listing(folder: OutputPath) -> set[str]:
    """Paths (relative to `folder`, '/'-separated) of every file below it, in one listing
    request on object stores rather than one existence check per file. Empty if absent."""
    if is_local(folder):
        folder = Path(folder)
        if not folder.is_dir():
            return set()
        return {path.relative_to(folder).as_posix() for path in folder.rglob("*") if path.is_file()}
    base = folder.path.rstrip("/")
    try:
        found = with_retries(folder, "list the folder", lambda: folder.fs.find(base, detail=True))
    except FileNotFoundError:
        return set()
    return {
        key[len(base) + 1 :]
        for key, info in found.items()
        if info.get("type") != "directory" and key.startswith(base + "/")
    }


def object_states(folder: UPath) -> dict[str, str]:
    """The state of every object below `folder` on S3 (`<size>:<ETag>`: other bytes published
    under the key give another), by its path relative to `folder` ('/'-separated): one LIST
    request per 1,000 keys, each page retried on its own. Empty if there are none.

    Listed page by page here rather than by s3fs's find, which follows an empty listing with
    a HEAD and another LIST to tell an empty folder from a file: on a first build every
    partition's folder is empty."""
    fs = folder.fs
    bucket, key, _version = fs.split_path(folder.path)
    prefix = f"{key.rstrip('/')}/" if key else ""
    states: dict[str, str] = {}
    page_options: dict[str, str] = {"Bucket": bucket, "Prefix": prefix}
    while True:
        page = with_retries(
            folder,
            "list the folder",
            lambda options=dict(page_options): fs.call_s3("list_objects_v2", **options),
        )
        for item in page.get("Contents", ()):
            states[item["Key"][len(prefix) :]] = f"{item['Size']}:{item['ETag']}"
        if not page.get("IsTruncated"):
            return states
        page_options["ContinuationToken"] = page["NextContinuationToken"]


def single_put_state(content: bytes) -> str:
    """The state object_states lists for an object of `content` published by one PUT: on S3
    its ETag is the MD5 of its bytes (not so for a multipart upload or an object encrypted
    with a KMS key, whose states then never equal this)."""
    return f'{len(content)}:"{hashlib.md5(content, usedforsecurity=False).hexdigest()}"'


def lists_object_states(folder: Any) -> TypeGuard[UPath]:
    """Whether object_states can list `folder`: a folder on S3 (other stores' listings do
    not all carry a digest of each object's bytes)."""
    return _is_s3(folder)


def make_folder(folder: OutputPath) -> None:
    """Create a local folder; object stores have no folders to create."""
    if is_local(folder):
        Path(folder).mkdir(parents=True, exist_ok=True)


# Clean-up of what killed writers left: here, not in atomic.py, because it lists and deletes
# through this module, which writes through atomic.py.
def remove_orphaned_temporaries(
    folder: Any, pattern: str = "*", listed: Iterable[str] | None = None
) -> list[Any]:
    """Delete the temporary files under `folder` (a local path or a UPath on object storage,
    recursively) whose writer is gone. `listed`: the paths below `folder` (relative to it)
    from a listing the caller has just taken, searched instead of listing the folder again.
    On S3 the folder is listed page by page (object_states): a glob there costs a HEAD and
    several LISTs when the folder is empty."""
    folder = Path(folder) if isinstance(folder, str) else folder
    name_pattern = f"{TEMP_MARKER}{pattern}"
    if listed is None and not lists_object_states(folder):
        return _remove_if_writer_gone(glob(folder, f"**/{name_pattern}"))
    if listed is None:
        listed = object_states(folder)
    temporaries = [
        folder / relative
        for relative in listed
        if fnmatch.fnmatchcase(relative.rsplit("/", 1)[-1], name_pattern)
    ]
    return _remove_if_writer_gone(temporaries)


def remove_orphaned_siblings(path: Any) -> list[Any]:
    """Delete the temporary siblings of `path` (see temporary_sibling) whose writer is gone,
    looking only for that name: what a worker stopped while writing `path` left behind."""
    pattern = f"{TEMP_MARKER}*-{glob_escape(path.name)}"
    return _remove_if_writer_gone(glob(path.parent, pattern))


def _remove_if_writer_gone(temporaries: Iterable[Any]) -> list[Any]:
    removed = []
    for temp in temporaries:
        if writer_is_gone(temp):
            remove(temp)
            removed.append(temp)
    return removed
