"""The output root, a local folder or an object-store URL (`s3://bucket/prefix`), as one layer.

Local roots are plain `Path`s (atomic rename, memory maps); anything with a scheme is a
universal-pathlib `UPath` over fsspec. A `UPath` pickles as its URL and options only, so each
worker process (pool or Dask) creates its own filesystem client on first use — s3fs clients
must not cross a fork. `AWS_ENDPOINT_URL` selects an S3-compatible endpoint and the standard
AWS variables carry the credentials; botocore reads them, this module does not.

Every request to an object store made through this module (and source_store) is retried
under one `RetryPolicy`, carried in the path's options so that worker processes apply the
same one; the S3 client's own retries are switched off so attempts do not multiply.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import http.client
import io
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

import numpy as np
from upath import UPath

from radharmony_pipeline.internals import RETRY_OPTION, s3_path
from radharmony_pipeline.processing.storage.atomic import (
    TEMP_MARKER,
    temporary_sibling,
    write_atomically,
)

OutputPath = Path | UPath
Writer = Callable[[BinaryIO], None]
T = TypeVar("T")

# One attempt per request in the client: the policy below does the retrying. A wrong or
# unreachable endpoint must fail an attempt within seconds, not botocore's default 60 s.
_CLIENT_CONFIG = {
    "connect_timeout": 5,
    "read_timeout": 60,
    "retries": {"total_max_attempts": 1, "mode": "standard"},
}
# Error codes of throttling and of a store that is busy or restarting (S3's and common
# S3-compatible stores'), whatever the HTTP status they come with.
_TRANSIENT_CODES = {
    "SlowDown",
    "Throttling",
    "ThrottlingException",
    "RequestTimeout",
    "RequestTimeTooSkewed",
    "InternalError",
    "ServiceUnavailable",
    "TooManyRequests",
}


@dataclass(frozen=True)
class RetryPolicy:
    """Bounded attempts per object-store operation, with exponential backoff between them
    (`first_backoff`, doubling, at most `max_backoff` seconds). Throttling, 5xx answers,
    timeouts and cut connections are retried; anything else fails at once."""

    attempts: int = 8
    first_backoff: float = 0.25
    max_backoff: float = 8.0

    def __post_init__(self) -> None:
        if self.attempts < 1 or self.first_backoff < 0 or self.max_backoff < 0:
            raise ValueError(
                "a retry policy needs at least 1 attempt and non-negative backoffs, got "
                f"{self.attempts} attempts, {self.first_backoff} s, {self.max_backoff} s"
            )

    def backoff(self, failed_attempts: int) -> float:
        """Seconds to wait after the `failed_attempts`-th failure."""
        return min(self.first_backoff * 2 ** (failed_attempts - 1), self.max_backoff)

    def budget(self) -> float:
        """The total time waited between attempts before giving up."""
        return sum(self.backoff(n) for n in range(1, self.attempts))


DEFAULT_RETRY_POLICY = RetryPolicy()


class ObjectStoreError(RuntimeError):
    """An object-store operation failed for good: a permanent answer (access denied, no such
    bucket) or transient faults past the retry policy. Not an OSError, so that no caller
    turns it into an error row or a "missing, write it again": it stops the step."""


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


def retry_policy_of(path: Any) -> RetryPolicy:
    option = getattr(path, "storage_options", {}).get(RETRY_OPTION)
    return RetryPolicy(*option) if option else DEFAULT_RETRY_POLICY


def with_retries(path: Any, action: str, operation: Callable[[], T]) -> T:
    """`operation()` (an object-store request or a few, about `path`) under the path's retry
    policy. A permanent error, or transient ones past the policy, raise ObjectStoreError
    naming the object and the cause; a missing object stays FileNotFoundError. Local paths
    call `operation` once."""
    if is_local(path):
        return operation()
    policy = retry_policy_of(path)
    started = time.monotonic()
    for attempt in range(1, policy.attempts + 1):
        try:
            return operation()
        except Exception as error:
            problem = store_problem(error)
            if problem is None:
                raise
            if problem != _TRANSIENT:
                raise ObjectStoreError(f"{path}: cannot {action}: {problem}") from error
            if attempt == policy.attempts:
                waited = time.monotonic() - started
                raise ObjectStoreError(
                    f"{path}: cannot {action}: the object store kept failing ({error!r}) "
                    f"through {policy.attempts} attempts over {waited:.1f} s. Once the store "
                    "answers again, run the same command: finished outputs are kept"
                ) from error
            time.sleep(policy.backoff(attempt))
    raise AssertionError("unreachable")


_TRANSIENT = "transient"


def store_problem(error: BaseException) -> str | None:
    """`_TRANSIENT` for a fault worth retrying, a description of a permanent store error
    (access denied, no such bucket), or None for anything else (a missing object, a bug)."""
    for cause in _causes(error):
        response = getattr(cause, "response", None)
        if isinstance(response, dict) and "Error" in response:
            code = response["Error"].get("Code", "")
            status = response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0
            if code in _TRANSIENT_CODES or status >= 500 or status == 429:
                return _TRANSIENT
            if code == "NoSuchBucket":
                return f"the bucket does not exist (NoSuchBucket): {cause}"
            if status in (401, 403) or code in ("AccessDenied", "InvalidAccessKeyId"):
                named = f", {code}" if code and code != str(status) else ""
                return f"access denied (HTTP {status}{named}): {cause}. Check the credentials"
            return None
        if _is_connection_fault(cause):
            return _TRANSIENT
    if isinstance(error, PermissionError):
        return f"access denied: {error}. Check the credentials"
    return None


def _causes(error: BaseException) -> Iterator[BaseException]:
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__ or error.__context__


def _is_connection_fault(error: BaseException) -> bool:
    if isinstance(error, (ConnectionError, TimeoutError, asyncio.TimeoutError)):
        return True
    if isinstance(error, http.client.HTTPException):  # IncompleteRead, RemoteDisconnected
        return True
    package = type(error).__module__.split(".")[0]
    if package == "aiohttp":  # ClientPayloadError, ServerDisconnectedError, ClientOSError
        return True
    if package == "botocore":
        import botocore.exceptions as boto

        return isinstance(
            error, (boto.HTTPClientError, boto.ConnectionError, boto.IncompleteReadError)
        )
    return type(error).__name__ == "FSTimeoutError"


def as_local_path(path: Any) -> Path:
    """A local output path as a Path; one already a Path is not parsed again (a deep path
    costs several microseconds to parse, and this runs for every image written)."""
    return path if isinstance(path, Path) and not isinstance(path, UPath) else Path(path)


def is_local(path: Any) -> bool:
    return not isinstance(path, UPath) or path.protocol in ("", "file", "local")


def publish(path: OutputPath, write: Writer) -> None:
    """Write through `write(handle)` so no reader ever sees a partial object.

    Local: a temporary sibling renamed into place. Object stores have no rename, and a store
    may keep the part of a body it received before a connection was cut: the bytes are
    uploaded under a temporary key, copied to the name and the temporary key deleted, each
    request under the retry policy (`write` runs once, into memory).
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
    _publish_object(path, content)


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
    """Publish a finished local file at `path` (a rename locally, one upload otherwise)."""
    if is_local(path):
        with output_write_errors(Path(path), 0):
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            os.replace(local_file, path)
        return
    _publish_object(path, local_file)


def _publish_object(path: UPath, content: bytes | Path) -> None:
    temp = temporary_sibling(path)
    fs = path.fs

    def upload() -> None:
        if isinstance(content, bytes):
            fs.pipe_file(temp.path, content)
        else:
            fs.put_file(str(content), temp.path)

    try:
        # Each request retried on its own: a fault costs one request again, not the lot.
        with_retries(path, "write the object", upload)
        with_retries(path, "write the object", lambda: fs.cp_file(temp.path, path.path))
    except BaseException:
        # A failed attempt's temporary key may hold part of the bytes. Should the store stay
        # down, the next run's clean-up removes it (its writer is gone); the error reported
        # is the write's.
        with contextlib.suppress(ObjectStoreError):
            remove(temp)
        raise
    remove(temp)


def read_bytes(path: OutputPath) -> bytes:
    """The whole file or object (one request, retried)."""
    if is_local(path):
        with open(path, "rb") as handle:
            return handle.read()
    return with_retries(path, "read the object", lambda: path.fs.cat_file(path.path))


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
    """Bytes of a file or object (FileNotFoundError if absent)."""
    if is_local(path):
        return os.stat(path).st_size
    return with_retries(path, "look up the object", lambda: path.fs.size(path.path))


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


def make_folder(folder: OutputPath) -> None:
    """Create a local folder; object stores have no folders to create."""
    if is_local(folder):
        Path(folder).mkdir(parents=True, exist_ok=True)
